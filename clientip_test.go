package ratelimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

func TestClientIPDefaultRemoteAddr(t *testing.T) {
	runKeyCases(t, mustKF(t), []keyCase{
		{name: "ipv4 with port", remote: "198.51.100.7:5678", want: "198.51.100.7"},
		{name: "ipv4 without port", remote: "198.51.100.7", want: "198.51.100.7"},
		{name: "forged headers ignored", remote: "198.51.100.7:5678", headers: forged, want: "198.51.100.7"},
		{name: "ipv6 grouped by /64", remote: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", want: "2001:db8:1:2::/64"},
		{name: "ipv6 without port", remote: "2001:db8:1:2::1", want: "2001:db8:1:2::/64"},
		{name: "v4-mapped unmapped", remote: "[::ffff:198.51.100.7]:80", want: "198.51.100.7"},
		{name: "zone stripped", remote: "[fe80::1%eth0]:80", want: "fe80::/64"},
		{name: "embedded ipv4 is ordinary ipv6", remote: "[2001:db8::1.2.3.4]:80", want: "2001:db8::/64"},
		{name: "unix socket", remote: "@", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "empty", remote: "", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "hostname", remote: "localhost:80", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "unspecified", remote: "0.0.0.0:80", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "bracketed ipv4", remote: "[198.51.100.7]:80", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "bad port", remote: "198.51.100.7:http", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "huge", remote: strings.Repeat("1", 1<<20), wantErr: ratelimit.ErrInvalidClientIP},
	})
}

func TestClientIPSpoofingFromUntrustedPeer(t *testing.T) {
	// Whatever is configured, an untrusted peer is keyed by its own address.
	configs := map[string][]ratelimit.IPOption{
		"xff":              {ratelimit.TrustedProxyCIDRs("10.0.0.0/8")},
		"forwarded":        {ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("Forwarded")},
		"x-real-ip":        {ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("X-Real-IP")},
		"cf-connecting-ip": {ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("cf-connecting-ip")},
		"true-client-ip":   {ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("True-Client-IP")},
		"hops with peers":  {ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.TrustedHops(1)},
	}
	for name, opts := range configs {
		t.Run(name, func(t *testing.T) {
			runKeyCases(t, mustKF(t, opts...), []keyCase{
				{name: "forged", remote: "198.51.100.7:1234", headers: forged, want: "198.51.100.7"},
				{name: "garbage headers", remote: "198.51.100.7:1234",
					headers: []hdr{xff("bogus"), fwd("for=unknown"), realIP("bogus")}, want: "198.51.100.7"},
			})
		})
	}
}

func TestClientIPTrustedXFF(t *testing.T) {
	fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8", "2001:db8:ffff::/48"))
	const peer = "10.0.0.1:4321"
	runKeyCases(t, fn, []keyCase{
		{name: "single hop", remote: peer, headers: []hdr{xff("203.0.113.5")}, want: "203.0.113.5"},
		{name: "forged leftmost ignored", remote: peer, headers: []hdr{xff("6.6.6.6, 203.0.113.5")}, want: "203.0.113.5"},
		{name: "trusted entries skipped", remote: peer, headers: []hdr{xff("6.6.6.6, 203.0.113.5, 10.0.0.2, 10.1.2.3")}, want: "203.0.113.5"},
		{name: "ipv6 trusted proxy skipped", remote: "[2001:db8:ffff::1]:443", headers: []hdr{xff("203.0.113.5, 2001:db8:ffff:1::2")}, want: "203.0.113.5"},
		{name: "lines merged in order", remote: peer, headers: []hdr{xff("6.6.6.6"), xff("203.0.113.5, 10.0.0.2")}, want: "203.0.113.5"},
		{name: "client on earlier line", remote: peer, headers: []hdr{xff("6.6.6.6, 203.0.113.5"), xff("10.0.0.2"), xff("10.0.0.3")}, want: "203.0.113.5"},
		{name: "all trusted gives leftmost", remote: peer, headers: []hdr{xff("10.0.0.5, 10.0.0.6")}, want: "10.0.0.5"},
		{name: "no header gives peer", remote: peer, want: "10.0.0.1"},
		{name: "empty header gives peer", remote: peer, headers: []hdr{xff("")}, want: "10.0.0.1"},
		{name: "empty elements ignored", remote: peer, headers: []hdr{xff(" ,203.0.113.5,, 10.0.0.2 , ")}, want: "203.0.113.5"},
		{name: "tabs are whitespace", remote: peer, headers: []hdr{xff("203.0.113.5\t,\t10.0.0.2")}, want: "203.0.113.5"},
		{name: "ipv4 port", remote: peer, headers: []hdr{xff("203.0.113.5:5678")}, want: "203.0.113.5"},
		{name: "ipv6 bracket port", remote: peer, headers: []hdr{xff("[2001:db8:1:2::1]:443")}, want: "2001:db8:1:2::/64"},
		{name: "ipv6 bracket no port", remote: peer, headers: []hdr{xff("[2001:db8:1:2::1]")}, want: "2001:db8:1:2::/64"},
		{name: "ipv6 bare", remote: peer, headers: []hdr{xff("2001:db8:1:2::1")}, want: "2001:db8:1:2::/64"},
		{name: "zone stripped", remote: peer, headers: []hdr{xff("fe80::1%eth0")}, want: "fe80::/64"},
		{name: "v4-mapped client unmapped", remote: peer, headers: []hdr{xff("::ffff:203.0.113.5, 10.0.0.2")}, want: "203.0.113.5"},
		{name: "v4-mapped trusted entry skipped", remote: peer, headers: []hdr{xff("203.0.113.5, ::ffff:10.0.0.2")}, want: "203.0.113.5"},
		{name: "v4-mapped trusted peer", remote: "[::ffff:10.0.0.1]:80", headers: []hdr{xff("203.0.113.5")}, want: "203.0.113.5"},
		{name: "garbage left of client ignored", remote: peer, headers: []hdr{xff("bogus, 203.0.113.5, 10.0.0.2")}, want: "203.0.113.5"},
		{name: "garbage in trusted part", remote: peer, headers: []hdr{xff("203.0.113.5, bogus, 10.0.0.2")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "garbage rightmost", remote: peer, headers: []hdr{xff("203.0.113.5, 10.0.0.2, bogus")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "garbage on later line", remote: peer, headers: []hdr{xff("203.0.113.5"), xff("unknown")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "all trusted then garbage", remote: peer, headers: []hdr{xff("bogus, 10.0.0.5")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "unspecified is garbage", remote: peer, headers: []hdr{xff("0.0.0.0")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "hostname is garbage", remote: peer, headers: []hdr{xff("proxy.internal")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "bracketed ipv4 is garbage", remote: peer, headers: []hdr{xff("[203.0.113.5]:80")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "port too long", remote: peer, headers: []hdr{xff("203.0.113.5:123456")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "unclosed bracket", remote: peer, headers: []hdr{xff("[2001:db8::1")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "bad remote addr", remote: "garbage", headers: []hdr{xff("203.0.113.5")}, wantErr: ratelimit.ErrInvalidClientIP},
	})
}

func TestClientIPForwarded(t *testing.T) {
	fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("forwarded"))
	const peer = "10.0.0.1:4321"
	runKeyCases(t, fn, []keyCase{
		{name: "rfc example", remote: peer, headers: []hdr{fwd("for=192.0.2.60;proto=http;by=203.0.113.43")}, want: "192.0.2.60"},
		{name: "case-insensitive name", remote: peer, headers: []hdr{fwd("For=192.0.2.60")}, want: "192.0.2.60"},
		{name: "quoted ipv6 with port", remote: peer, headers: []hdr{fwd(`For="[2001:db8:cafe::17]:4711"`)}, want: "2001:db8:cafe::/64"},
		{name: "quoted ipv6", remote: peer, headers: []hdr{fwd(`for="[2001:db8:cafe::17]"`)}, want: "2001:db8:cafe::/64"},
		{name: "quoted ipv4 with port", remote: peer, headers: []hdr{fwd(`for="192.0.2.60:8080"`)}, want: "192.0.2.60"},
		{name: "obfuscated port", remote: peer, headers: []hdr{fwd(`for="192.0.2.60:_abc"`)}, want: "192.0.2.60"},
		{name: "zone", remote: peer, headers: []hdr{fwd(`for="[fe80::1%eth0]"`)}, want: "fe80::/64"},
		{name: "rightmost untrusted", remote: peer, headers: []hdr{fwd("for=192.0.2.43, for=198.51.100.17;by=10.0.0.1, for=10.0.0.7")}, want: "198.51.100.17"},
		{name: "lines merged", remote: peer, headers: []hdr{fwd("for=6.6.6.6"), fwd("for=198.51.100.17, for=10.0.0.7")}, want: "198.51.100.17"},
		{name: "spaces around semicolons", remote: peer, headers: []hdr{fwd("proto=https ; for=198.51.100.17 ; by=10.0.0.1")}, want: "198.51.100.17"},
		{name: "xff ignored", remote: peer, headers: []hdr{xff("6.6.6.6"), fwd("for=198.51.100.17")}, want: "198.51.100.17"},
		{name: "no header gives peer", remote: peer, headers: []hdr{xff("6.6.6.6")}, want: "10.0.0.1"},
		{name: "unbalanced quote left cannot swallow", remote: peer, headers: []hdr{fwd(`for="6.6.6.6, for=198.51.100.17`)}, want: "198.51.100.17"},
		{name: "unknown", remote: peer, headers: []hdr{fwd("for=unknown")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "obfuscated node", remote: peer, headers: []hdr{fwd("for=_hidden")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "quoted obfuscated node", remote: peer, headers: []hdr{fwd(`for="_gazonk"`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "no for", remote: peer, headers: []hdr{fwd("proto=https;by=10.0.0.1")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "duplicate for", remote: peer, headers: []hdr{fwd("for=198.51.100.17;for=6.6.6.6")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "unbalanced quote", remote: peer, headers: []hdr{fwd(`for="198.51.100.17`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "quoted pair", remote: peer, headers: []hdr{fwd(`for="198.51.100.\17"`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "garbage in trusted part", remote: peer, headers: []hdr{fwd("for=198.51.100.17, for=unknown, for=10.0.0.7")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "unquoted bracket missing", remote: peer, headers: []hdr{fwd(`for="[2001:db8::1"`)}, wantErr: ratelimit.ErrInvalidClientIP},
		// A trusted proxy quotes values the client chose (its Host, say),
		// and a quoted-string may hold ',', ';' and '=': none of them may
		// name the client's address.
		{name: "proxy's quoted comma", remote: peer, headers: []hdr{fwd(`for=198.51.100.17;host="x,for=6.6.6.6;y="`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "proxy's quoted comma, quoted-pair", remote: peer, headers: []hdr{fwd(`for=198.51.100.17;host="x,for=6.6.6.6;y=\"\""`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "proxy's quoted semicolon without for", remote: peer, headers: []hdr{fwd(`host="x;for=6.6.6.6;y="`)}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "proxy's quoted semicolon before for", remote: peer, headers: []hdr{fwd(`host="x;for=6.6.6.6";for=198.51.100.17`)}, want: "198.51.100.17"},
		{name: "proxy's quoted semicolon after for", remote: peer, headers: []hdr{fwd(`for=198.51.100.17;host="x;for=6.6.6.6;y="`)}, want: "198.51.100.17"},
		{name: "quoted host", remote: peer, headers: []hdr{fwd(`for=198.51.100.17;host="example.com";proto=https`)}, want: "198.51.100.17"},
	})
}

// A client behind a trusted proxy that writes its Host into the Forwarded
// element it appends cannot choose a key of its own, or a skipped address,
// with a Host holding a quoted comma: each such request fails closed.
func TestClientIPForwardedQuotedHostEscapesNothing(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	opts := []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("Forwarded")}
	h := ratelimit.LimitByIP(1, time.Hour, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("Forwarded"),
		ratelimit.WithSkipCIDRsFrom(mustKF(t, opts...), "198.51.100.10"), ratelimit.WithLogger(nil))(ok)
	admitted := 0
	for i := range 20 {
		host := fmt.Sprintf("x,for=6.6.6.%d;y=", i)
		if i >= 10 {
			host = "x,for=198.51.100.10;y=" // the skipped monitoring host
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, newReq(t, "10.0.0.1:4321", fwd(`for=203.0.113.7;proto=https;host="`+host+`"`)))
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	if admitted > 1 {
		t.Fatalf("client 203.0.113.7 admitted %d times under a limit of 1 per hour", admitted)
	}
}

func TestClientIPSingleIPHeader(t *testing.T) {
	fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("X-Real-IP"))
	const peer = "10.0.0.1:4321"
	runKeyCases(t, fn, []keyCase{
		{name: "trusted peer", remote: peer, headers: []hdr{realIP("198.51.100.17")}, want: "198.51.100.17"},
		{name: "ipv6", remote: peer, headers: []hdr{realIP("2001:db8:1:2::3")}, want: "2001:db8:1:2::/64"},
		{name: "v4-mapped", remote: peer, headers: []hdr{realIP("::ffff:198.51.100.17")}, want: "198.51.100.17"},
		{name: "xff ignored", remote: peer, headers: []hdr{xff("6.6.6.6"), realIP("198.51.100.17")}, want: "198.51.100.17"},
		{name: "last line wins", remote: peer, headers: []hdr{realIP("6.6.6.6"), realIP("198.51.100.17")}, want: "198.51.100.17"},
		{name: "missing gives peer", remote: peer, want: "10.0.0.1"},
		{name: "list is garbage", remote: peer, headers: []hdr{realIP("6.6.6.6, 198.51.100.17")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "garbage", remote: peer, headers: []hdr{realIP("unknown")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "huge", remote: peer, headers: []hdr{realIP(strings.Repeat("1", 1<<20))}, wantErr: ratelimit.ErrInvalidClientIP},
	})
}

func TestClientIPHops(t *testing.T) {
	t.Run("one", func(t *testing.T) {
		runKeyCases(t, mustKF(t, ratelimit.TrustedHops(1)), []keyCase{
			{name: "rightmost", remote: "198.51.100.1:1", headers: []hdr{xff("6.6.6.6, 203.0.113.5")}, want: "203.0.113.5"},
			{name: "across lines", remote: "198.51.100.1:1", headers: []hdr{xff("6.6.6.6"), xff("203.0.113.5")}, want: "203.0.113.5"},
			{name: "garbage left ignored", remote: "198.51.100.1:1", headers: []hdr{xff("bogus, 203.0.113.5")}, want: "203.0.113.5"},
			{name: "missing header", remote: "198.51.100.1:1", wantErr: ratelimit.ErrInvalidClientIP},
			{name: "garbage", remote: "198.51.100.1:1", headers: []hdr{xff("203.0.113.5, bogus")}, wantErr: ratelimit.ErrInvalidClientIP},
		})
	})
	t.Run("two", func(t *testing.T) {
		runKeyCases(t, mustKF(t, ratelimit.TrustedHops(2)), []keyCase{
			{name: "second from right", remote: "10.0.0.1:1", headers: []hdr{xff("6.6.6.6, 203.0.113.5, 172.16.0.1")}, want: "203.0.113.5"},
			{name: "empty elements not counted", remote: "10.0.0.1:1", headers: []hdr{xff("203.0.113.5,, 172.16.0.1,")}, want: "203.0.113.5"},
			{name: "too few", remote: "10.0.0.1:1", headers: []hdr{xff("203.0.113.5")}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "garbage in hops", remote: "10.0.0.1:1", headers: []hdr{xff("203.0.113.5, bogus")}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "garbage at client", remote: "10.0.0.1:1", headers: []hdr{xff("bogus, 172.16.0.1")}, wantErr: ratelimit.ErrInvalidClientIP},
		})
	})
	t.Run("with trusted peers", func(t *testing.T) {
		fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.TrustedHops(2))
		runKeyCases(t, fn, []keyCase{
			// The prefixes check the peer only; the walk counts hops.
			{name: "trusted peer", remote: "10.0.0.1:1", headers: []hdr{xff("6.6.6.6, 203.0.113.5, 172.16.0.1")}, want: "203.0.113.5"},
			{name: "untrusted peer", remote: "198.51.100.1:1", headers: []hdr{xff("6.6.6.6, 203.0.113.5, 172.16.0.1")}, want: "198.51.100.1"},
		})
	})
	t.Run("forwarded", func(t *testing.T) {
		fn := mustKF(t, ratelimit.TrustedHops(1), ratelimit.FromHeader("Forwarded"))
		runKeyCases(t, fn, []keyCase{
			{name: "rightmost", remote: "10.0.0.1:1", headers: []hdr{fwd("for=6.6.6.6, for=203.0.113.5;proto=https")}, want: "203.0.113.5"},
			{name: "hidden", remote: "10.0.0.1:1", headers: []hdr{fwd("for=6.6.6.6, for=_hidden")}, wantErr: ratelimit.ErrInvalidClientIP},
		})
	})
	t.Run("single-ip header", func(t *testing.T) {
		fn := mustKF(t, ratelimit.TrustedHops(1), ratelimit.FromHeader("CF-Connecting-IP"))
		runKeyCases(t, fn, []keyCase{
			{name: "header", remote: "10.0.0.1:1", headers: []hdr{{"Cf-Connecting-Ip", "203.0.113.5"}}, want: "203.0.113.5"},
			{name: "missing gives peer", remote: "10.0.0.1:1", want: "10.0.0.1"},
		})
	})
}

func TestClientIPPrefixes(t *testing.T) {
	key := func(t *testing.T, fn ratelimit.KeyFunc, remote string) string {
		t.Helper()
		k, err := fn(newReq(t, remote))
		if err != nil {
			t.Fatalf("%s: %v", remote, err)
		}
		return k
	}
	t.Run("ipv6 rotation within a /64 is one key", func(t *testing.T) {
		fn := mustKF(t)
		a := key(t, fn, "[2001:db8:1:2::1]:1")
		b := key(t, fn, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1")
		c := key(t, fn, "[2001:db8:1:2:1234:5678:9abc:def0]:1")
		if a != b || a != c || a != "2001:db8:1:2::/64" {
			t.Fatalf("keys %q %q %q, want all 2001:db8:1:2::/64", a, b, c)
		}
	})
	t.Run("different /64 are different keys", func(t *testing.T) {
		fn := mustKF(t)
		if a, b := key(t, fn, "[2001:db8:1:2::1]:1"), key(t, fn, "[2001:db8:1:3::1]:1"); a == b {
			t.Fatalf("both %q", a)
		}
	})
	t.Run("v4-mapped do not collapse", func(t *testing.T) {
		fn := mustKF(t)
		a := key(t, fn, "[::ffff:192.0.2.1]:1")
		b := key(t, fn, "[::ffff:198.51.100.1]:1")
		if a == b || a != "192.0.2.1" || b != "198.51.100.1" {
			t.Fatalf("keys %q %q, want 192.0.2.1 and 198.51.100.1", a, b)
		}
		if v4 := key(t, fn, "192.0.2.1:1"); v4 != a {
			t.Fatalf("mapped %q != plain %q", a, v4)
		}
	})
	t.Run("nat64 well-known prefix keyed by the ipv4 client", func(t *testing.T) {
		fn := mustKF(t)
		a := key(t, fn, "[64:ff9b::192.0.2.1]:1")
		b := key(t, fn, "[64:ff9b::cb00:7107]:1")
		if a != "192.0.2.1" || b != "203.0.113.7" {
			t.Fatalf("keys %q %q, want 192.0.2.1 and 203.0.113.7", a, b)
		}
		if v4 := key(t, mustKF(t, ratelimit.IPv4Prefix(24)), "[64:ff9b::192.0.2.1]:1"); v4 != "192.0.2.0/24" {
			t.Fatalf("IPv4Prefix(24): %q, want 192.0.2.0/24", v4)
		}
		fwd, err := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))(newReq(t, "10.0.0.1:1", xff("64:ff9b::198.51.100.9")))
		if err != nil || fwd != "198.51.100.9" {
			t.Fatalf("forwarded: %q, %v; want 198.51.100.9", fwd, err)
		}
		// Trusted as over IPv4: a proxy whose IPv4 range is trusted,
		// reaching the server through the translator, and a trusted range
		// written in the 64:ff9b:: form; an untrusted one stays the client.
		for _, tc := range []struct{ trusted, remote, want string }{
			{"203.0.113.0/24", "[64:ff9b::203.0.113.7]:1", "198.51.100.9"},
			{"64:ff9b::203.0.113.0/120", "[64:ff9b::203.0.113.7]:1", "198.51.100.9"},
			{"64:ff9b::203.0.113.0/120", "203.0.113.7:1", "198.51.100.9"},
			{"203.0.113.0/24", "[64:ff9b::198.18.0.1]:1", "198.18.0.1"},
			{"203.0.113.0/24", "203.0.113.7:1", "198.51.100.9"},
		} {
			k, err := mustKF(t, ratelimit.TrustedProxyCIDRs(tc.trusted))(newReq(t, tc.remote, xff("198.51.100.9")))
			if err != nil || k != tc.want {
				t.Errorf("trusting %s, from %s: %q, %v; want %q", tc.trusted, tc.remote, k, err, tc.want)
			}
		}
		// Only the well-known /96: its neighbours stay IPv6 networks.
		for remote, want := range map[string]string{
			"[64:ff9b:1::192.0.2.1]:1": "64:ff9b:1::/64",
			"[64:ff9b::1:c000:201]:1":  "64:ff9b::/64",
			"[2001:db8::192.0.2.1]:1":  "2001:db8::/64",
		} {
			if got := key(t, fn, remote); got != want {
				t.Errorf("%s: %q, want %q", remote, got, want)
			}
		}
	})
	t.Run("v4-mapped through trusted proxy do not collapse", func(t *testing.T) {
		fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
		a, errA := fn(newReq(t, "10.0.0.1:1", xff("::ffff:192.0.2.1")))
		b, errB := fn(newReq(t, "10.0.0.1:1", xff("::ffff:198.51.100.1")))
		if errA != nil || errB != nil || a == b {
			t.Fatalf("got (%q, %v) and (%q, %v)", a, errA, b, errB)
		}
	})
	cases := []struct {
		name   string
		opts   []ratelimit.IPOption
		remote string
		want   string
	}{
		{"ipv6 /56", []ratelimit.IPOption{ratelimit.IPv6Prefix(56)}, "[2001:db8:1:2ff::1]:1", "2001:db8:1:200::/56"},
		{"ipv6 /128", []ratelimit.IPOption{ratelimit.IPv6Prefix(128)}, "[2001:db8:1:2::1]:1", "2001:db8:1:2::1"},
		{"ipv6 /1", []ratelimit.IPOption{ratelimit.IPv6Prefix(1)}, "[2001:db8::1]:1", "::/1"},
		{"ipv4 /24", []ratelimit.IPOption{ratelimit.IPv4Prefix(24)}, "192.0.2.77:1", "192.0.2.0/24"},
		{"ipv4 /24 v4-mapped", []ratelimit.IPOption{ratelimit.IPv4Prefix(24)}, "[::ffff:192.0.2.77]:1", "192.0.2.0/24"},
		{"ipv4 /32 default", nil, "192.0.2.77:1", "192.0.2.77"},
		{"ipv4 prefix leaves ipv6 alone", []ratelimit.IPOption{ratelimit.IPv4Prefix(16)}, "[2001:db8:1:2::1]:1", "2001:db8:1:2::/64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := key(t, mustKF(t, tc.opts...), tc.remote); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClientIPTrustedPrefixForms(t *testing.T) {
	cases := []struct {
		name string
		opt  ratelimit.IPOption
	}{
		{"cidr", ratelimit.TrustedProxyCIDRs("10.0.0.0/8")},
		{"bare address", ratelimit.TrustedProxyCIDRs("10.0.0.1")},
		{"v4-mapped cidr", ratelimit.TrustedProxyCIDRs("::ffff:10.0.0.0/104")},
		{"netip prefix", ratelimit.TrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fn := mustKF(t, ratelimit.TrustedProxyCIDRs("192.168.0.0/16"), tc.opt)
			got, err := fn(newReq(t, "10.0.0.1:1", xff("203.0.113.5")))
			if err != nil || got != "203.0.113.5" {
				t.Fatalf("got (%q, %v), want 203.0.113.5 (peer trusted)", got, err)
			}
		})
	}
}

func TestClientIPConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		opts []ratelimit.IPOption
	}{
		{"cidr bits", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("10.0.0.0/33")}},
		{"cidr garbage", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("bogus")}},
		{"cidr empty", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("")}},
		{"cidr hostname", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("proxy.internal")}},
		{"cidr zone", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("fe80::1%eth0")}},
		{"cidr zone prefix", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("fe80::%eth0/64")}},
		{"invalid prefix", []ratelimit.IPOption{ratelimit.TrustedProxies(netip.Prefix{})}},
		{"hops zero", []ratelimit.IPOption{ratelimit.TrustedHops(0)}},
		{"hops negative", []ratelimit.IPOption{ratelimit.TrustedHops(-1)}},
		{"hops too many", []ratelimit.IPOption{ratelimit.TrustedHops(ratelimit.MaxForwardedEntries + 1)}},
		{"ipv6 prefix 0", []ratelimit.IPOption{ratelimit.IPv6Prefix(0)}},
		{"ipv6 prefix 129", []ratelimit.IPOption{ratelimit.IPv6Prefix(129)}},
		{"ipv4 prefix 0", []ratelimit.IPOption{ratelimit.IPv4Prefix(0)}},
		{"ipv4 prefix 33", []ratelimit.IPOption{ratelimit.IPv4Prefix(33)}},
		{"empty header", []ratelimit.IPOption{ratelimit.TrustedHops(1), ratelimit.FromHeader(" ")}},
		{"header name with its colon", []ratelimit.IPOption{ratelimit.TrustedProxyCIDRs("173.245.48.0/20"), ratelimit.FromHeader("CF-Connecting-IP:")}},
		{"header name with a space", []ratelimit.IPOption{ratelimit.TrustedHops(1), ratelimit.FromHeader("X Real IP")}},
		{"header net/http moves out", []ratelimit.IPOption{ratelimit.TrustedHops(1), ratelimit.FromHeader("host")}},
		{"header without trust", []ratelimit.IPOption{ratelimit.FromHeader("X-Real-IP")}},
		{"xff without trust", []ratelimit.IPOption{ratelimit.FromHeader("X-Forwarded-For")}},
		{"single-ip header with hops", []ratelimit.IPOption{ratelimit.TrustedHops(2), ratelimit.FromHeader("X-Real-IP")}},
		{"nil option", []ratelimit.IPOption{ratelimit.TrustedHops(1), nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fn, err := ratelimit.ClientIP(tc.opts...)
			if !errors.Is(err, ratelimit.ErrInvalidKeyConfig) || fn != nil {
				t.Fatalf("got (%v, %v), want ErrInvalidKeyConfig", fn != nil, err)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			defer func() {
				if recover() == nil {
					t.Error("MustClientIP did not panic")
				}
			}()
			ratelimit.MustClientIP(tc.opts...)
		})
	}
}

func TestClientIPHostileSizes(t *testing.T) {
	fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	fwdFn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("Forwarded"))
	const peer = "10.0.0.1:1"
	mb := 1 << 20
	manyLines := make([]hdr, 10000)
	for i := range manyLines {
		manyLines[i] = xff("10.0.0.2")
	}
	trustedChain := func(n int) string {
		return strings.TrimSuffix(strings.Repeat("10.0.0.2, ", n), ", ")
	}
	t.Run("xff", func(t *testing.T) {
		runKeyCases(t, fn, []keyCase{
			{name: "1MB forged prefix, client found", remote: peer,
				headers: []hdr{xff(strings.Repeat("6.6.6.6, ", mb/9) + "203.0.113.5, 10.0.0.2")}, want: "203.0.113.5"},
			{name: "1MB trusted chain", remote: peer, headers: []hdr{xff(trustedChain(mb / 10))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "1MB one element", remote: peer, headers: []hdr{xff(strings.Repeat("1", mb))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "1MB of commas", remote: peer, headers: []hdr{xff(strings.Repeat(",", mb))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "1MB of spaces", remote: peer, headers: []hdr{xff(strings.Repeat(" ", mb))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "1MB after client", remote: peer, headers: []hdr{xff("203.0.113.5, " + strings.Repeat(" ", mb) + "10.0.0.2")}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "10000 trusted lines", remote: peer, headers: manyLines, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "entry limit all trusted", remote: peer, headers: []hdr{xff(trustedChain(ratelimit.MaxForwardedEntries))}, want: "10.0.0.2"},
			{name: "entry limit client last", remote: peer,
				headers: []hdr{xff("203.0.113.5, " + trustedChain(ratelimit.MaxForwardedEntries-1))}, want: "203.0.113.5"},
			{name: "entry limit exceeded", remote: peer,
				headers: []hdr{xff("203.0.113.5, " + trustedChain(ratelimit.MaxForwardedEntries))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "entry limit exceeded all trusted", remote: peer,
				headers: []hdr{xff(trustedChain(ratelimit.MaxForwardedEntries + 1))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "byte limit exceeded", remote: peer,
				headers: []hdr{xff("203.0.113.5," + strings.Repeat(" ", ratelimit.MaxForwardedBytes) + "10.0.0.2")}, wantErr: ratelimit.ErrInvalidClientIP},
		})
	})
	t.Run("forwarded", func(t *testing.T) {
		runKeyCases(t, fwdFn, []keyCase{
			{name: "1MB forged prefix, client found", remote: peer,
				headers: []hdr{fwd(strings.Repeat("for=6.6.6.6, ", mb/13) + "for=203.0.113.5")}, want: "203.0.113.5"},
			{name: "1MB element", remote: peer, headers: []hdr{fwd("for=" + strings.Repeat(";", mb))}, wantErr: ratelimit.ErrInvalidClientIP},
			{name: "1MB quoted", remote: peer, headers: []hdr{fwd(`for="` + strings.Repeat("a", mb) + `"`)}, wantErr: ratelimit.ErrInvalidClientIP},
		})
	})
}

func TestClientIPAllocs(t *testing.T) {
	fn := mustKF(t, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	r := newReq(t, "10.0.0.1:1", xff("6.6.6.6, 203.0.113.5, 10.0.0.2"))
	r6 := newReq(t, "[2001:db8:1:2::1]:1")
	if n := testing.AllocsPerRun(100, func() { _, _ = fn(r) }); n > 1 {
		t.Errorf("ipv4 via xff: %v allocs, want <= 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = fn(r6) }); n > 1 {
		t.Errorf("ipv6 peer: %v allocs, want <= 1", n)
	}
	// A peer address already in canonical form is its own key.
	peer := mustKF(t)
	r4 := newReq(t, "203.0.113.9:4711")
	if k, _ := peer(r4); k != "203.0.113.9" {
		t.Fatalf("key %q", k)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = peer(r4) }); n != 0 {
		t.Errorf("canonical ipv4 peer: %v allocs, want 0", n)
	}
	untrusted := newReq(t, "198.51.100.2:1", xff("1.2.3.4"))
	if n := testing.AllocsPerRun(100, func() { _, _ = fn(untrusted) }); n != 0 {
		t.Errorf("untrusted canonical ipv4 peer: %v allocs, want 0", n)
	}
	// A non-canonical spelling is still keyed canonically.
	if k, _ := peer(newReq(t, "[::ffff:203.0.113.9]:1")); k != "203.0.113.9" {
		t.Errorf("v4-mapped peer keyed %q", k)
	}
}

func BenchmarkClientIP(b *testing.B) {
	benches := []struct {
		name string
		fn   ratelimit.KeyFunc
		r    *http.Request
	}{
		{"remote-v4", mustKF(b), newReq(b, "192.0.2.1:1234")},
		{"remote-v6", mustKF(b), newReq(b, "[2001:db8:1:2::1]:1234")},
		{"xff-3", mustKF(b, ratelimit.TrustedProxyCIDRs("10.0.0.0/8")), newReq(b, "10.0.0.1:1", xff("6.6.6.6, 203.0.113.5, 10.0.0.2"))},
		{"forwarded", mustKF(b, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"), ratelimit.FromHeader("Forwarded")),
			newReq(b, "10.0.0.1:1", fwd(`for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`))},
		{"xff-1MB", mustKF(b, ratelimit.TrustedProxyCIDRs("10.0.0.0/8")),
			newReq(b, "10.0.0.1:1", xff(strings.Repeat("10.0.0.2, ", 100000)))},
	}
	for _, bc := range benches {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, _ = bc.fn(bc.r)
				}
			})
		})
	}
}

// TestClientIPRefusesTrustAll checks that trusted prefixes covering every
// address of a family are refused unless AllowTrustAll says so.
func TestClientIPRefusesTrustAll(t *testing.T) {
	cases := []struct {
		name string
		opt  ratelimit.IPOption
	}{
		{"v4 all", ratelimit.TrustedProxyCIDRs("0.0.0.0/0")},
		{"v6 all", ratelimit.TrustedProxyCIDRs("::/0")},
		{"v4 halves", ratelimit.TrustedProxyCIDRs("0.0.0.0/1", "128.0.0.0/1")},
		{"v4 pieces", ratelimit.TrustedProxyCIDRs("0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1")},
		{"v4-mapped all", ratelimit.TrustedProxyCIDRs("::ffff:0.0.0.0/96")},
		{"v6 halves as netip", ratelimit.TrustedProxies(netip.MustParsePrefix("::/1"), netip.MustParsePrefix("8000::/1"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ratelimit.ClientIP(tc.opt)
			if !errors.Is(err, ratelimit.ErrInvalidKeyConfig) || !strings.Contains(err.Error(), "AllowTrustAll") {
				t.Fatalf("err = %v, want a refusal naming AllowTrustAll", err)
			}
			if _, err := ratelimit.ClientIP(tc.opt, ratelimit.AllowTrustAll()); err != nil {
				t.Fatalf("with AllowTrustAll: %v", err)
			}
		})
	}
	// Almost everything is not everything.
	if _, err := ratelimit.ClientIP(ratelimit.TrustedProxyCIDRs("0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4")); err != nil {
		t.Fatalf("partial cover refused: %v", err)
	}
}

// TestClientIPRefusesHostBits checks that a prefix with host bits set is
// refused with the network it stands for, in trusted proxies and allowlists.
func TestClientIPRefusesHostBits(t *testing.T) {
	for _, opt := range []ratelimit.IPOption{
		ratelimit.TrustedProxyCIDRs("10.1.2.3/8"),
		ratelimit.TrustedProxies(netip.MustParsePrefix("10.1.2.3/8")),
	} {
		_, err := ratelimit.ClientIP(opt)
		if !errors.Is(err, ratelimit.ErrInvalidKeyConfig) || !strings.Contains(err.Error(), "did you mean 10.0.0.0/8") {
			t.Fatalf("err = %v", err)
		}
	}
	_, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}}, ratelimit.WithSkipCIDRs("10.1.2.3/8"))
	if err == nil || !strings.Contains(err.Error(), "did you mean 10.0.0.0/8") || strings.Count(err.Error(), "ratelimit:") != 1 {
		t.Fatalf("WithSkipCIDRs: err = %v", err)
	}
}

// TestClientIPUnixSocketPeer checks that a unix socket peer (RemoteAddr "@"
// or "") is a key error whose message names TrustUnixSocketPeer, and that
// with TrustUnixSocketPeer its forwarded header gives the client.
func TestClientIPUnixSocketPeer(t *testing.T) {
	plain := mustKF(t)
	for _, ra := range []string{"@", ""} {
		_, err := plain(newReq(t, ra, xff("203.0.113.5")))
		if !errors.Is(err, ratelimit.ErrInvalidClientIP) || !strings.Contains(err.Error(), "TrustUnixSocketPeer") {
			t.Fatalf("RemoteAddr %q: err = %v", ra, err)
		}
	}
	runKeyCases(t, mustKF(t, ratelimit.TrustUnixSocketPeer()), []keyCase{
		{name: "abstract socket", remote: "@", headers: []hdr{xff("198.51.100.1, 203.0.113.5")}, want: "203.0.113.5"},
		{name: "unnamed socket", remote: "", headers: []hdr{xff("203.0.113.5")}, want: "203.0.113.5"},
		{name: "socket path", remote: "/run/app.sock", headers: []hdr{xff("203.0.113.5")}, want: "203.0.113.5"},
		{name: "no header", remote: "@", wantErr: ratelimit.ErrInvalidClientIP},
		{name: "garbage", remote: "@", headers: []hdr{xff("nope")}, wantErr: ratelimit.ErrInvalidClientIP},
		{name: "ip peer not trusted", remote: "192.0.2.1:1", headers: []hdr{xff("203.0.113.5")}, want: "192.0.2.1"},
	})
	runKeyCases(t, mustKF(t, ratelimit.TrustUnixSocketPeer(), ratelimit.TrustedProxyCIDRs("10.0.0.0/8")), []keyCase{
		{name: "walks trusted entries", remote: "@", headers: []hdr{xff("203.0.113.5, 10.0.0.2")}, want: "203.0.113.5"},
		{name: "ip proxy trusted too", remote: "10.0.0.1:1", headers: []hdr{xff("203.0.113.5")}, want: "203.0.113.5"},
	})
	// With hops, the unix peer is the first proxy; an IP peer is still the
	// client, whatever it forwards.
	runKeyCases(t, mustKF(t, ratelimit.TrustUnixSocketPeer(), ratelimit.TrustedHops(1)), []keyCase{
		{name: "hops from the socket", remote: "@", headers: []hdr{xff("198.51.100.1, 203.0.113.5")}, want: "203.0.113.5"},
		{name: "hops: ip peer not trusted", remote: "198.51.100.7:4444", headers: []hdr{xff("6.6.6.6")}, want: "198.51.100.7"},
	})
	runKeyCases(t, mustKF(t, ratelimit.TrustUnixSocketPeer(), ratelimit.FromHeader("X-Real-IP")), []keyCase{
		{name: "single-IP header", remote: "@", headers: []hdr{realIP("203.0.113.5")}, want: "203.0.113.5"},
	})
}
