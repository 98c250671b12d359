package ratelimit_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/limitry/ratelimit"
)

// fuzzTrusted are the trusted proxy networks of the fuzzed key functions.
var fuzzTrusted = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
}

func fuzzIsTrusted(a netip.Addr) bool {
	for _, p := range fuzzTrusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// fuzzParse is a strict, independent parser of one list entry: the forms
// net/netip accepts directly ("1.2.3.4", "::1", "fe80::1%eth0",
// "1.2.3.4:80", "[::1]:80"). Everything it accepts, ClientIP accepts too.
func fuzzParse(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	a = a.WithZone("").Unmap()
	return a, !a.IsUnspecified()
}

// FuzzClientIP checks the invariants of ClientIP on arbitrary peers and
// headers: it never panics; it never returns ("", nil); a key is canonical
// (it parses back as a netip.Prefix or netip.Addr and re-stringifies to
// itself) and stable; an untrusted peer is keyed by itself whatever it sent;
// and the X-Forwarded-For walk never settles on a trusted address while a
// valid untrusted entry stands in the chain.
func FuzzClientIP(f *testing.F) {
	seeds := [][5]string{
		// remoteAddr, X-Forwarded-For line 1, line 2, Forwarded, X-Real-IP
		{"203.0.113.7:1234", "", "", "", ""},
		{"203.0.113.7:1234", "6.6.6.6", "", "for=6.6.6.6", "6.6.6.6"},
		{"10.0.0.1:1", "6.6.6.6, 198.51.100.5, 10.0.0.2", "", "", ""},
		{"10.0.0.1:1", "6.6.6.6", "198.51.100.5, 10.0.0.2", "", ""},
		{"10.0.0.1:1", "10.0.0.5, 10.0.0.6", "", "", ""},
		{"10.0.0.1:1", "198.51.100.5, bogus, 10.0.0.2", "", "", ""},
		{"[::ffff:10.0.0.1]:80", "::ffff:198.51.100.5, ::ffff:10.0.0.2", "", "", ""},
		{"[2001:db8:ffff::1]:443", "[2001:db8:1:2::1]:443, 2001:db8:ffff:1::2", "", "", ""},
		{"10.0.0.1:1", "fe80::1%eth0", "", "", ""},
		{"10.0.0.1:1", ",,, ,", "", "", ""},
		{"10.0.0.1:1", "", "", `for=192.0.2.60;proto=http;by=203.0.113.43`, ""},
		{"10.0.0.1:1", "", "", `For="[2001:db8:cafe::17]:4711", for=10.0.0.3`, ""},
		{"10.0.0.1:1", "", "", `for=unknown, for=_hidden`, ""},
		{"10.0.0.1:1", "", "", `for="6.6.6.6, for=198.51.100.5`, ""},
		{"10.0.0.1:1", "", "", "", "198.51.100.5"},
		{"10.0.0.1:1", "", "", "", "[2001:db8::1]:80"},
		{"@", "198.51.100.5", "", "", ""},
		{"", "", "", "", ""},
		{"[fe80::1%eth0]:80", "", "", "", ""},
		{"0.0.0.0:0", "0.0.0.0", "::", "for=::", "::"},
		{"10.0.0.1:1", strings.Repeat("10.0.0.2,", 40), "", "", ""},
		{"10.0.0.1:1", "198.51.100.5," + strings.Repeat(" ", 5000), "10.0.0.2", "", ""},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}

	fns := map[string]ratelimit.KeyFunc{
		"remote":    ratelimit.MustClientIP(),
		"xff":       ratelimit.MustClientIP(ratelimit.TrustedProxies(fuzzTrusted...)),
		"forwarded": ratelimit.MustClientIP(ratelimit.TrustedProxies(fuzzTrusted...), ratelimit.FromHeader("Forwarded")),
		"x-real-ip": ratelimit.MustClientIP(ratelimit.TrustedProxies(fuzzTrusted...), ratelimit.FromHeader("X-Real-IP")),
		"hops":      ratelimit.MustClientIP(ratelimit.TrustedHops(2)),
		"prefixes":  ratelimit.MustClientIP(ratelimit.TrustedProxies(fuzzTrusted...), ratelimit.IPv4Prefix(24), ratelimit.IPv6Prefix(56)),
	}
	peerOnly := fns["remote"]

	f.Fuzz(func(t *testing.T, remote, xff1, xff2, fwdv, real string) {
		r := &http.Request{Method: "GET", RemoteAddr: remote, Header: http.Header{}}
		if xff1 != "" {
			r.Header["X-Forwarded-For"] = append(r.Header["X-Forwarded-For"], xff1)
		}
		if xff2 != "" {
			r.Header["X-Forwarded-For"] = append(r.Header["X-Forwarded-For"], xff2)
		}
		if fwdv != "" {
			r.Header["Forwarded"] = []string{fwdv}
		}
		if real != "" {
			r.Header["X-Real-Ip"] = []string{real}
		}
		peer, peerOK := fuzzParse(remote)
		peerKey, peerErr := peerOnly(r)

		for name, fn := range fns {
			key, err := fn(r)
			if err == nil && key == "" {
				t.Fatalf(`%s: ("", nil)`, name)
			}
			if err != nil {
				if key != "" {
					t.Fatalf("%s: key %q with error %v", name, key, err)
				}
				continue
			}
			// Canonical.
			if p, perr := netip.ParsePrefix(key); perr == nil {
				if p.String() != key || p.Masked() != p {
					t.Fatalf("%s: key %q is not a canonical prefix", name, key)
				}
			} else if a, aerr := netip.ParseAddr(key); aerr == nil {
				if a.String() != key || a.Zone() != "" || a.Is4In6() {
					t.Fatalf("%s: key %q is not a canonical address", name, key)
				}
			} else {
				t.Fatalf("%s: key %q is neither a prefix nor an address", name, key)
			}
			// Stable.
			if again, err2 := fn(r); again != key || err2 != nil {
				t.Fatalf("%s: unstable: %q then (%q, %v)", name, key, again, err2)
			}
		}

		// Every strictly valid peer is accepted by the default key func.
		if peerOK && peerErr != nil && len(remote) <= 100 {
			t.Fatalf("peer %q rejected: %v", remote, peerErr)
		}
		// An untrusted peer is keyed by itself, whatever it sent.
		if peerErr == nil && peerOK && !fuzzIsTrusted(peer) {
			for _, name := range []string{"xff", "forwarded", "x-real-ip"} {
				if key, err := fns[name](r); err != nil || key != peerKey {
					t.Fatalf("%s: untrusted peer %q keyed as (%q, %v), want %q", name, remote, key, err, peerKey)
				}
			}
		}
		// The XFF walk lands on a trusted address only if every entry
		// (and the peer) is trusted.
		key, err := fns["xff"](r)
		if err != nil {
			return
		}
		var client netip.Addr
		if p, perr := netip.ParsePrefix(key); perr == nil {
			client = p.Addr()
		} else {
			client = netip.MustParseAddr(key)
		}
		if !fuzzIsTrusted(client) {
			return
		}
		if peerOK && !fuzzIsTrusted(peer) {
			t.Fatalf("trusted key %q from untrusted peer %q", key, remote)
		}
		for _, line := range r.Header["X-Forwarded-For"] {
			for _, e := range strings.Split(line, ",") {
				if a, ok := fuzzParse(e); ok && !fuzzIsTrusted(a) {
					t.Fatalf("key %q is trusted but entry %q is an untrusted client", key, e)
				}
			}
		}
	})
}

// checkIPv4Port fails t unless ratelimit.ParseIPv4Port, where it accepts s,
// gives what the full parser gives (the same address and host text), and
// returns whether it accepted s.
func checkIPv4Port(t *testing.T, s string) bool {
	t.Helper()
	a, n, ok := ratelimit.ParseIPv4Port(s)
	if !ok {
		return false
	}
	fa, fhost, fok := ratelimit.ParseIPEntryHostFull(s)
	if !fok || fa != a || n > len(s) || fhost != s[:n] {
		t.Fatalf("%q: one-pass parser gives (%v, %q), full parser (%v, %q, %v)", s, a, s[:min(n, len(s))], fa, fhost, fok)
	}
	return true
}

// FuzzIPv4Port checks that the one-pass IPv4 parser of RemoteAddr never
// accepts what the full parser rejects, nor reads it differently.
func FuzzIPv4Port(f *testing.F) {
	for _, s := range []string{
		"192.0.2.1", "192.0.2.1:80", "1.2.3.4:_ab-c.d", "255.255.255.255:65535",
		"0.0.0.0:1", "01.2.3.4", "1.2.3.256", "1.2.3.4:", "1.2.3.4:123456",
		" 1.2.3.4", "1.2.3.4 ", "1.2.3.4:80:1", "1.2.3", "1.2.3.4.5", "::ffff:1.2.3.4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkIPv4Port(t, s) })
}

func TestIPv4Port(t *testing.T) {
	for _, c := range []struct {
		s      string
		accept bool // by the one-pass parser; every other form is left to the full one
	}{
		{"192.0.2.1", true},
		{"192.0.2.1:80", true},
		{"10.0.0.1:65535", true},
		{"1.2.3.4:_obf-port.x", true},
		{"0.1.2.3:9", true},
		{"255.255.255.255", true},
		{"0.0.0.0:80", false},  // unspecified: the full parser rejects it
		{"01.2.3.4:80", false}, // leading zero
		{"1.2.3.256", false},
		{"1.2.3.1000", false},
		{"1.2.3", false},
		{"1.2.3.4.5", false},
		{"1.2.3.4:", false},
		{"1.2.3.4:123456", false},
		{"1.2.3.4:80:1", false},
		{"1.2.3.4:8a", false},
		{" 1.2.3.4:80", false}, // white space: the full parser trims it
		{"1.2.3.4 ", false},
		{"[1.2.3.4]:80", false},
		{"::1", false},
		{"", false},
		{"1..2.3", false},
		{"a.b.c.d", false},
		{"1.2.3.-4", false},
	} {
		if got := checkIPv4Port(t, c.s); got != c.accept {
			t.Errorf("%q: one-pass parser accepts it: %v, want %v", c.s, got, c.accept)
		}
	}
	// What the one-pass parser leaves alone still reaches the full one.
	for s, want := range map[string]bool{" 1.2.3.4:80": true, "1.2.3.4 ": true, "[::1]:80": true, "0.0.0.0:80": false, "01.2.3.4": false} {
		if _, _, ok := ratelimit.ParseIPEntryHost(s); ok != want {
			t.Errorf("parser on %q: %v, want %v", s, ok, want)
		}
	}
}
