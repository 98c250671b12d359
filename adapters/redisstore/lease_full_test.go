package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// A hot key's lease granted at leaseT0 (9 units left, running until
// leaseT0+1s for its own callers) and a full store: one new key decided by
// a caller whose time reads 1.1 s later (a ClientTime request, or another
// Limiter's clock ahead) does not make the store forget the running lease.
func TestLeaseCallerAheadKeepsRunningLease(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10})
	if err != nil {
		t.Fatal(err)
	}
	leaseHot(t, s, p, "victim", leaseT0)
	leaseFlood(t, s, p, leaseT0, DefaultLeaseKeys-1)
	var out [1]core.Decision
	if err := s.Take(context.Background(), leaseT0.Add(1100*time.Millisecond), []core.Request{{Policy: p, Key: "ahead", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	// The victim's own caller, 0.5 s after the grant: its lease runs.
	if err := s.Take(context.Background(), leaseT0.Add(500*time.Millisecond), []core.Request{{Policy: p, Key: "victim", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.ExpiredUnits != 0 {
		t.Errorf("a running lease forgotten for a caller 1.1 s ahead: %d units lost (stats %+v)", st.ExpiredUnits, st)
	}
}

// Concurrent Take, Reset and lease ends on a small store: the store never
// holds more than MaxKeys keys and every leased unit is accounted for.
func TestLeaseConcurrentAccountingWhenFull(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 1 << 40, Window: time.Hour})
	const maxKeys = 70
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 5, HotThreshold: 1, MaxKeys: maxKeys})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var out [1]core.Decision
			n := 0
			for i := range 20000 {
				key := fmt.Sprint("k", rng.IntN(200))
				now := leaseT0.Add(time.Duration(i/50) * 300 * time.Millisecond)
				if rng.IntN(50) == 0 {
					_ = s.Reset(context.Background(), p, key)
					continue
				}
				if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					n++
				}
				if k := s.Stats().Keys; k > maxKeys {
					t.Errorf("%d keys > MaxKeys %d", k, maxKeys)
					return
				}
			}
			mu.Lock()
			allowed += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	st := s.Stats()
	var left int64
	s.mu.Lock()
	for _, e := range s.keys.Values() {
		left += e.left.Load()
	}
	s.mu.Unlock()
	// Each lease charged Size and spent 1 on its grant; the rest was spent
	// locally, returned, lost or is still left.
	if got := int64(st.Leases) + int64(st.Local) + int64(st.ReturnedUnits) + int64(st.ExpiredUnits) + left; got != int64(st.LeasedUnits) {
		t.Errorf("leased %d, accounted %d (stats %+v, left %d)", st.LeasedUnits, got, st, left)
	}
}

// A store full of running leases (MaxKeys 10) must forget one for a new
// key: the least recently used one, whose lease ends first.
func TestLeaseFullOfRunningLeasesForgetsFirstToEnd(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100000, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10, MaxKeys: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		leaseHot(t, s, p, fmt.Sprint("run", i), leaseT0.Add(time.Duration(i)*time.Millisecond))
	}
	var out [1]core.Decision
	if err := s.Take(context.Background(), leaseT0.Add(10*time.Millisecond), []core.Request{{Policy: p, Key: "newcomer", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	var gone []string
	for i := range 10 {
		if _, ok := s.keys.Peek(leaseKey{"api", fmt.Sprint("run", i)}); !ok {
			gone = append(gone, fmt.Sprint("run", i))
		}
	}
	s.mu.Unlock()
	if len(gone) != 1 || gone[0] != "run0" {
		t.Errorf("10 running leases in a store of 10, one new key: forgot %v, want [run0]", gone)
	}
}

// leaseBehindEnded returns a full store (MaxAge 1s): the leaseEvictionScan
// keys whose leases were granted at leaseT0 (ending at leaseT0+1s, with
// units left), then "victim", leased at victimAt (9 units left), then
// one-off keys decided at floodAt until the store holds MaxKeys.
func leaseBehindEnded(t *testing.T, victimAt, floodAt time.Time) (*LeaseStore, *core.Policy) {
	t.Helper()
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100000, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaseEvictionScan {
		leaseHot(t, s, p, fmt.Sprint("ended", i), leaseT0)
	}
	leaseHot(t, s, p, "victim", victimAt)
	leaseFlood(t, s, p, floodAt, DefaultLeaseKeys-leaseEvictionScan-1)
	if st := s.Stats(); st.Keys != DefaultLeaseKeys || st.ExpiredUnits != 0 {
		t.Fatalf("setup: %+v", st)
	}
	return s, p
}

// victimLeaseKept reports whether s still holds "victim"'s lease with its 9
// units.
func victimLeaseKept(s *LeaseStore) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.keys.Peek(leaseKey{"api", "victim"})
	return ok && e.left.Load() == 9
}

// One running lease ("victim") behind leases that ended: the full store
// makes room for a new key by forgetting one of those, not the victim's.
//   - long ended, Reset: leases ended a minute ago; a Reset of a key the
//     store does not hold makes room at the latest grant's time.
//   - recently ended: the victim took its lease at leaseT0+0.9s (running
//     until +1.9s); one new key at +1.5s. The ended leases count as running
//     for MaxAge after they end, and end before the victim's.
//   - recently ended, Reset: the same through a Reset after callers at
//     +1.5s, judged at the latest grant (+0.9s, the victim's own).
func TestLeaseRunningLeaseKeptBehindEndedOnes(t *testing.T) {
	reset := func(t *testing.T, s *LeaseStore, p *core.Policy) {
		if err := s.Reset(context.Background(), p, "someone-else"); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name              string
		victimAt, floodAt time.Time
		makeRoom          func(*testing.T, *LeaseStore, *core.Policy)
	}{
		{"long ended, Reset", leaseT0.Add(time.Minute), leaseT0.Add(time.Minute), reset},
		{"recently ended", leaseT0.Add(900 * time.Millisecond), leaseT0.Add(900 * time.Millisecond), func(t *testing.T, s *LeaseStore, p *core.Policy) {
			var out [1]core.Decision
			if err := s.Take(context.Background(), leaseT0.Add(1500*time.Millisecond), []core.Request{{Policy: p, Key: "newcomer", Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
		}},
		{"recently ended, Reset", leaseT0.Add(900 * time.Millisecond), leaseT0.Add(1500 * time.Millisecond), reset},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, p := leaseBehindEnded(t, c.victimAt, c.floodAt)
			c.makeRoom(t, s, p)
			if !victimLeaseKept(s) {
				t.Errorf("the running lease (9 units) behind %d ended ones was forgotten (stats %+v)", leaseEvictionScan, s.Stats())
			}
		})
	}
}
