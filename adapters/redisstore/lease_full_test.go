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

// One running lease ("victim", 9 units left) behind 64 keys whose leases
// ended long ago (units left, not returned yet): a Reset of a key the full
// store does not hold, which makes room at the latest grant's time, keeps
// the victim's lease.
func TestLeaseResetOfNewKeyKeepsRunningLease(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10}) // MaxAge 1s
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaseEvictionScan {
		leaseHot(t, s, p, fmt.Sprint("gone", i), leaseT0) // ended at leaseT0+1s
	}
	now := leaseT0.Add(time.Minute)
	leaseHot(t, s, p, "victim", now)
	leaseFlood(t, s, p, now, DefaultLeaseKeys-leaseEvictionScan-1) // the store is full, nothing forgotten
	if st := s.Stats(); st.Keys != DefaultLeaseKeys || st.ExpiredUnits != 0 {
		t.Fatalf("setup: %+v", st)
	}
	if err := s.Reset(context.Background(), p, "someone-else"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	e, ok := s.keys.Peek(leaseKey{"api", "victim"})
	s.mu.Unlock()
	if !ok || e.left.Load() != 9 {
		t.Errorf("a running lease (9 units) behind %d ended ones, then one Reset of another key: kept %v (stats %+v)", leaseEvictionScan, ok, s.Stats())
	}
}

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

// One clock for everyone. 64 keys took a lease at leaseT0 and were last
// used then; their leases ended at leaseT0+1s. "victim" took its lease at
// leaseT0+0.9s: it runs until leaseT0+1.9s. At leaseT0+1.5s one new key
// makes the full store forget one of the ended leases (which count as
// running for MaxAge after they end, and end before the victim's), not the
// victim's.
func TestLeaseRecentlyEndedLeasesGoBeforeRunningOne(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100000, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10}) // MaxAge 1s
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaseEvictionScan {
		leaseHot(t, s, p, fmt.Sprint("ended", i), leaseT0) // lease ends at leaseT0+1s
	}
	at := leaseT0.Add(900 * time.Millisecond)
	leaseHot(t, s, p, "victim", at) // lease runs until leaseT0+1.9s
	leaseFlood(t, s, p, at, DefaultLeaseKeys-leaseEvictionScan-1)
	if st := s.Stats(); st.Keys != DefaultLeaseKeys || st.ExpiredUnits != 0 {
		t.Fatalf("setup: %+v", st)
	}
	later := leaseT0.Add(1500 * time.Millisecond) // same clock: the victim's lease runs, the 64 others ended
	var out [1]core.Decision
	if err := s.Take(context.Background(), later, []core.Request{{Policy: p, Key: "newcomer", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	e, ok := s.keys.Peek(leaseKey{"api", "victim"})
	s.mu.Unlock()
	if !ok || e.left.Load() != 9 {
		t.Errorf("the only running lease (9 units, until +1.9s) behind 64 leases that ended at +1s, one new key at +1.5s: kept %v (stats %+v)", ok, s.Stats())
	}
}

// The same through Reset, which judges leases at the latest grant
// (leaseT0+0.9s, the victim's own): a Reset of a key the full store does
// not hold forgets one of the leases that end first, not the victim's.
func TestLeaseResetKeepsOnlyRunningLease(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100000, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10}) // MaxAge 1s
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaseEvictionScan {
		leaseHot(t, s, p, fmt.Sprint("ended", i), leaseT0)
	}
	at := leaseT0.Add(900 * time.Millisecond)
	leaseHot(t, s, p, "victim", at)
	leaseFlood(t, s, p, leaseT0.Add(1500*time.Millisecond), DefaultLeaseKeys-leaseEvictionScan-1)
	if st := s.Stats(); st.Keys != DefaultLeaseKeys || st.ExpiredUnits != 0 {
		t.Fatalf("setup: %+v", st)
	}
	if err := s.Reset(context.Background(), p, "someone-else"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	e, ok := s.keys.Peek(leaseKey{"api", "victim"})
	s.mu.Unlock()
	if !ok || e.left.Load() != 9 {
		t.Errorf("the only running lease (until +1.9s) behind 64 that ended at +1s, a Reset of another key after callers at +1.5s: kept %v (stats %+v)", ok, s.Stats())
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
