package ratelimit

import (
	"math/rand/v2"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
)

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
		if got := keyHoldsPeer(tc.k, tc.peer, r, 0); got != tc.want {
			t.Errorf("keyHoldsPeer(%q, %s, %v) = %v", tc.k, tc.peer, tc.hdr, got)
		}
	}
}

// TestKeyHoldsPeerAllocs: looking for the peer in the keys this package
// makes, for a trusted proxy's clients (checked on sampled requests for
// as long as the Limiter runs), allocates nothing.
func TestKeyHoldsPeerAllocs(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "2001:db8:1:2::77, 198.51.100.7")
	for _, tc := range []struct {
		peer string
		keys []string
	}{
		{"fd00::1", []string{"2001:db8:1:2::/64", "17:2001:db8:1:2::/641:g", "1:2001:db8::1", "deadbeef", "8:10.1.2.31:g", "4:123417:2001:db8:1:2::/64", "4:123415:2001:db8:1:2::77", "fd00::/48"}},
		{"10.1.2.3", []string{"198.51.100.7", "1:8:10.1.2.41:g", "user:alice", "1.2", "8:deadbeef", "999.1.2.3", "01.2.3.4", "10.0.0.0/8"}},
	} {
		peer := netip.MustParseAddr(tc.peer)
		for _, k := range tc.keys {
			if n := testing.AllocsPerRun(100, func() { keyHoldsPeer(k, peer, r, 0) }); n != 0 {
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
	for _, msg := range []string{msgForwarded, msgNoRoute, msgAbsentKey, msgNoRoutes, msgFailOpen, msgConfig, msgConfigDryRun, msgFallback, msgSlotFailOpen, msgRefund} {
		if !strings.Contains(string(b), msg) {
			t.Errorf("the README does not give the line %q", msg)
		}
	}
}
