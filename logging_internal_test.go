package ratelimit

import (
	"net/netip"
	"testing"
)

// TestKeyHoldsPeerAllocs: looking for a peer in client-IP keys of every
// shape parses only text shaped like a key, and allocates nothing.
func TestKeyHoldsPeerAllocs(t *testing.T) {
	for _, tc := range []struct {
		peer string
		keys []string
	}{
		{"fd00::1", []string{"2001:db8:1:2::/64", "17:2001:db8:1:2::/641:g", "1:2001:db8::1", "deadbeef", "8:10.1.2.31:g"}},
		{"10.1.2.3", []string{"198.51.100.7", "1:8:10.1.2.41:g", "user:alice", "10.1.2.0/24", "1.2", "8:deadbeef"}},
	} {
		peer := netip.MustParseAddr(tc.peer)
		for _, k := range tc.keys {
			if n := testing.AllocsPerRun(100, func() { keyHoldsPeer(k, peer, netip.Addr{}, 0) }); n != 0 {
				t.Errorf("peer %s, key %q: %v allocations", tc.peer, k, n)
			}
		}
	}
}

// TestKeyHoldsPeer: the peer is found in every shape of key this package
// makes, and not where it is absent or where the key's network also holds
// the forwarded client.
func TestKeyHoldsPeer(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("2001:db8::1")
	fwd := netip.MustParseAddr("10.1.2.77")
	for _, tc := range []struct {
		k    string
		peer netip.Addr
		fwd  netip.Addr
		want bool
	}{
		{"10.1.2.3", v4, netip.Addr{}, true},
		{"10.1.2.0/24", v4, netip.Addr{}, true},
		{"10.1.2.0/24", v4, fwd, false},
		{"1:8:10.1.2.31:g", v4, netip.Addr{}, true},
		{"1:g8:10.1.2.3", v4, netip.Addr{}, true},
		{"user:10.1.2.3", v4, netip.Addr{}, true},
		{"1:g9:10.1.2.33", v4, netip.Addr{}, false},
		{"2001:db8::1", v6, netip.Addr{}, true},
		{"1:2001:db8::1", v6, netip.Addr{}, true},
		{"2001:db8::/64", v6, netip.Addr{}, true},
		{"13:2001:db8::/641:g", v6, netip.Addr{}, true},
		{"2001:db9::/64", v6, netip.Addr{}, false},
	} {
		if got := keyHoldsPeer(tc.k, tc.peer, tc.fwd, 0); got != tc.want {
			t.Errorf("keyHoldsPeer(%q, %s, %s) = %v", tc.k, tc.peer, tc.fwd, got)
		}
	}
}
