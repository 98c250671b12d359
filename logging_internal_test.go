package ratelimit

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// holdsPeer is keyHoldsPeer for a request's forwarded headers, as
// checkForwarded calls it.
func holdsPeer(k string, peer netip.Addr, r *http.Request) bool {
	var fwd forwardedSet
	fwd.read(r)
	budget := maxKeyLooks
	return keyHoldsPeer(k, peer, &fwd, &budget, 0)
}

// TestKeyHoldsPeer: the peer is found in every shape of key this package
// makes, whatever else the key holds, and not where it is absent or where
// the key's network also holds an address the forwarded headers name.
func TestKeyHoldsPeer(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::1")
	for _, tc := range []struct {
		k    string
		peer netip.Addr
		hdr  []string // header name, value
		want bool
	}{
		{"10.1.2.3", v4, nil, true},
		{"10.1.2.0/24", v4, nil, true},
		{"10.1.2.0/24", v4, []string{"X-Forwarded-For", "10.1.2.77"}, false},
		{"10.1.2.0/24", v4, []string{"X-Forwarded-For", "10.1.2.77,"}, false},
		{"10.1.0.0/16", v4, []string{"X-Forwarded-For", "10.1.9.9, 172.16.0.1"}, false},
		{"10.1.2.0/24", v4, []string{"X-Real-Ip", "10.1.2.77"}, false},
		{"10.1.2.0/24", v4, []string{"Forwarded", `for="10.1.2.77:1234";proto=https`}, false},
		{"10.1.2.0/24", v4, []string{"Forwarded", `proto=https;FOR=10.1.2.77`}, false},
		{"10.1.2.0/24", v4, []string{"X-Forwarded-For", "198.51.100.7"}, true},
		{"10.1.2.3", v4, []string{"X-Forwarded-For", "10.1.2.3"}, false}, // the proxy's own request
		{"10.1.2.3", v4, []string{"X-Forwarded-For", "198.51.100.7, 10.1.2.3"}, false},
		{"1:8:10.1.2.31:g", v4, nil, true},
		{"1:g8:10.1.2.3", v4, nil, true},
		{"user:10.1.2.3", v4, nil, true},
		{"1:g9:10.1.2.33", v4, nil, false},
		{"fd00::1", v6, nil, true},
		{"1:fd00::1", v6, nil, true},
		{"fd00::/64", v6, nil, true},
		{"13:2001:db8::/641:g", v6, nil, false},
		{"9:fd00::/641:g", v6, nil, true},
		{"1234:fd00::/64", v6, nil, true},
		{"db:fd00::/64", v6, nil, true},
		{"7:fd00::12:42", v6, nil, true},
		{"2:429:fd00::/64", v6, nil, true},
		{"2001:db9::/64", v6, nil, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if tc.hdr != nil {
			r.Header.Set(tc.hdr[0], tc.hdr[1])
		}
		if got := holdsPeer(tc.k, tc.peer, r); got != tc.want {
			t.Errorf("keyHoldsPeer(%q, %s, %v) = %v", tc.k, tc.peer, tc.hdr, got)
		}
	}
}

// TestKeyHoldsPeerAllocs: looking for the peer in the keys this package
// makes, for a trusted proxy's clients (checked on sampled requests for
// as long as the Limiter runs), allocates nothing.
func TestKeyHoldsPeerAllocs(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "2001:db8:1:2::77, 198.51.100.7, unknown, _hidden, 1.2.3.999")
	r.Header.Set("Forwarded", `for="[2001:db8::9]:80";proto=https, for=unknown`)
	for _, tc := range []struct {
		peer string
		keys []string
	}{
		{"fd00::1", []string{"2001:db8:1:2::/64", "17:2001:db8:1:2::/641:g", "1:2001:db8::1", "deadbeef", "8:10.1.2.31:g", "4:123417:2001:db8:1:2::/64", "4:123415:2001:db8:1:2::77", "fd00::/48"}},
		{"10.1.2.3", []string{"198.51.100.7", "1:8:10.1.2.41:g", "user:alice", "1.2", "8:deadbeef", "999.1.2.3", "01.2.3.4", "10.0.0.0/8"}},
	} {
		peer := netip.MustParseAddr(tc.peer)
		for _, k := range tc.keys {
			if n := testing.AllocsPerRun(100, func() { holdsPeer(k, peer, r) }); n != 0 {
				t.Errorf("peer %s, key %q: %v allocations", tc.peer, k, n)
			}
		}
	}
}

// TestShaped: the shape checks accept exactly what netip.ParseAddr reads.
func TestShaped(t *testing.T) {
	for _, s := range []string{"1.2.3.4", "0.0.0.0", "255.255.255.255", "01.2.3.4", "256.1.1.1", "1.2.3", "1.2.3.4.5", "1..2.3", "", ".1.2.3",
		"::", "::1", "1::", "fd00::1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", "1::2::3", ":::", ":1::2", "1::2:", "12345::1",
		"::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "::1.2.3", "g::1", "1:2:3:4:5:6::7:8"} {
		_, err := netip.ParseAddr(s)
		a, _ := netip.ParseAddr(s)
		want4, want6 := err == nil && a.Is4(), err == nil && a.Is6()
		if got := v4Shaped(s); got != want4 {
			t.Errorf("v4Shaped(%q) = %v, ParseAddr: %v", s, got, err)
		}
		if got := v6Shaped(s); got != want6 {
			t.Errorf("v6Shaped(%q) = %v, ParseAddr: %v", s, got, err)
		}
	}
	// And random text over their alphabet.
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "0123456789abcdefF:.:.:"
	for range 200_000 {
		b := make([]byte, 1+rng.IntN(24))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		s := string(b)
		a, err := netip.ParseAddr(s)
		if got := v4Shaped(s); got != (err == nil && a.Is4()) {
			t.Fatalf("v4Shaped(%q) = %v, ParseAddr: %v", s, got, err)
		}
		if got := v6Shaped(s); got != (err == nil && a.Is6()) {
			t.Fatalf("v6Shaped(%q) = %v, ParseAddr: %v", s, got, err)
		}
	}
}

// TestReadmeListsEveryLogLine: the README's table gives the exact text of
// every one-time log line.
func TestReadmeListsEveryLogLine(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{msgForwarded, msgNoRoute, msgAbsentKey, msgNoRoutes, msgFailOpen, msgConfig, msgConfigDryRun, msgFallback, msgSlotFailOpen, msgRefund, msgSkipForwarded} {
		if !strings.Contains(string(b), msg) {
			t.Errorf("the README does not give the line %q", msg)
		}
	}
}

// TestForwardedSetBounded: the forwarded headers are read as ClientIP
// reads them, from the right, at most MaxForwardedBytes bytes and
// MaxForwardedEntries entries of each.
func TestForwardedSetBounded(t *testing.T) {
	for _, v := range []string{
		"10.1.2.77," + strings.Repeat("a", 1<<20),
		"10.1.2.77," + strings.Repeat("a,", MaxForwardedEntries),
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Forwarded-For", v)
		var fwd forwardedSet
		fwd.read(r)
		if fwd.holds(netip.MustParsePrefix("10.1.2.0/24")) {
			t.Errorf("an address beyond the bounds was read (header of %d bytes)", len(v))
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "10.1.2.77,"+strings.Repeat("a", MaxForwardedBytes-20))
	var fwd forwardedSet
	fwd.read(r)
	if !fwd.holds(netip.MustParsePrefix("10.1.2.0/24")) {
		t.Error("an address within the bounds was not read")
	}
}

// TestKeyHoldsPeerBounded: a hostile key (nested Composite-shaped parts,
// each a network holding every address) with headers of a megabyte costs
// the check bounded work: it looks at most maxKeyLooks pieces of a key no
// longer than maxKeyLooked.
func TestKeyHoldsPeerBounded(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	junk := strings.Repeat("a", 16<<10)
	var list []string
	for range 64 {
		list = append(list, junk)
	}
	r.Header.Set("X-Forwarded-For", strings.Join(list, ","))
	r.Header.Set("Forwarded", strings.Join(list, ","))
	r.Header.Set("X-Real-Ip", "192.0.2.1")
	peer := netip.MustParseAddr("10.1.2.3")
	part := "14:11:9:0.0.0.0/0"
	k := strings.Repeat(part, maxKeyLooked/len(part))
	// The bounds: the peer past maxKeyLooks pieces, or in a key longer
	// than maxKeyLooked, is not looked for.
	far := strings.Repeat("1:x", maxKeyLooks) + "10.1.2.3"
	if holdsPeer(far, peer, httptest.NewRequest("GET", "/", nil)) {
		t.Errorf("the peer was found past %d pieces", maxKeyLooks)
	}
	long := strings.Repeat("x", maxKeyLooked) + ":10.1.2.3"
	if holdsPeer(long, peer, httptest.NewRequest("GET", "/", nil)) {
		t.Errorf("a key of %d bytes was looked into", len(long))
	}
	if !holdsPeer("x:10.1.2.3", peer, httptest.NewRequest("GET", "/", nil)) {
		t.Error("the peer after a namespace was not found")
	}
	if n := testing.AllocsPerRun(10, func() { holdsPeer(k, peer, r) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
