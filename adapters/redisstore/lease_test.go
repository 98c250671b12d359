package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// leaseT0 starts a FixedWindow of an hour and of 10s alike.
var leaseT0 = time.Unix(1_800_000_000, 0)

// countingStore counts the batches it passes to its Store: the round trips
// a decorator costs the backend.
type countingStore struct {
	core.Store
	n atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	c.n.Add(1)
	return c.Store.Take(ctx, now, reqs, out)
}

// processes returns n counting Redis stores over their own clients sharing
// one prefix on one server, in ClientTime mode: n processes sharing quotas.
func processes(t *testing.T, n int) []*countingStore {
	t.Helper()
	addr := redistest.Server(t)
	prefix := uniquePrefix(t)
	ps := make([]*countingStore, n)
	for i := range ps {
		ps[i] = &countingStore{Store: newStore(t, newClient(t, addr), &Config{Prefix: prefix, ClientTime: true})}
	}
	return ps
}

func mustLease(t *testing.T, backend core.Store, cfg LeaseConfig) *LeaseStore {
	t.Helper()
	s, err := NewLeaseStore(backend, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLeaseNeverAboveQuota: 64 goroutines on four leasing processes sharing
// one Redis quota admit exactly the quota when demand exceeds it, with a
// fraction of the round trips.
func TestLeaseNeverAboveQuota(t *testing.T) {
	for _, alg := range []core.Algorithm{core.TokenBucket, core.FixedWindow, core.SlidingWindowCounter} {
		t.Run(alg.Name(), func(t *testing.T) {
			const quota = 1000
			p := mustPolicy(t, core.Rule{Name: "q", Algorithm: alg, Limit: quota, Window: time.Hour})
			procs := processes(t, 4)
			stores := make([]*LeaseStore, len(procs))
			for i, b := range procs {
				stores[i] = mustLease(t, b, LeaseConfig{Size: 16, MaxAge: time.Minute})
			}
			// 4,096 requests for 1,000 units, 1,024 per process: each
			// process alone asks for more than the quota plus a lease, so
			// none can stop asking while it holds leased units, however
			// the scheduler spreads the requests (see
			// TestRefusalCacheOverLeases).
			const workers, each = 64, 64
			admitted := hammer(t, workers, each, func(w, _ int) bool {
				var out [1]core.Decision
				err := stores[w%len(stores)].Take(context.Background(), leaseT0, []core.Request{{Policy: p, Key: "hot", Cost: 1}}, out[:])
				if err != nil {
					t.Error(err)
					return false
				}
				if d := out[0]; d.Remaining < 0 || d.Remaining > quota || (!d.Allowed && d.RetryAfter <= 0) {
					t.Errorf("decision %+v", d)
				}
				return out[0].Allowed
			})
			if admitted != quota {
				t.Fatalf("admitted %d, want exactly the quota %d", admitted, quota)
			}
			var calls int64
			var expired uint64
			for i, s := range stores {
				calls += procs[i].n.Load()
				expired += s.Stats().ExpiredUnits
			}
			if expired != 0 {
				t.Errorf("%d units expired, want none (leases outlive the test)", expired)
			}
			// The exact store would make 4,096 calls. Leases of 16 need about
			// 1000/16 grants, plus the first 9 exact decisions per process;
			// once the quota is spent, each refusal is one exact call.
			if limit := workers*each - quota + quota/4; calls > int64(limit) {
				t.Errorf("%d backend calls for %d decisions, want at most %d", calls, workers*each, limit)
			}
			// Nothing more is admitted afterwards, by any process.
			for _, s := range stores {
				if d := take(t, s, leaseT0, p, "hot", 1); d.Allowed {
					t.Fatalf("admitted beyond the quota: %+v", d)
				}
			}
		})
	}
}

// TestLeaseColdKeyExact: a key decided fewer than HotThreshold times per
// HotPeriod costs one backend call per decision and gets the backend's own
// decisions; at the threshold it starts leasing.
func TestLeaseColdKeyExact(t *testing.T) {
	procs := processes(t, 2)
	leased, twin := procs[0], procs[1]
	s := mustLease(t, leased, LeaseConfig{Size: 10, HotThreshold: 5, HotPeriod: time.Second})
	p := mustPolicy(t, core.Rule{Name: "cold", Limit: 100, Window: time.Minute})

	at := leaseT0
	for period := 0; period < 3; period++ {
		for i := 0; i < 4; i++ { // below the threshold of 5 per period
			before := leased.n.Load()
			got := take(t, s, at, p, "k", 1)
			want := take(t, twin, at, p, "twin", 1)
			if n := leased.n.Load() - before; n != 1 {
				t.Fatalf("period %d decision %d: %d backend calls, want 1", period, i, n)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining || got.ResetAfter != want.ResetAfter {
				t.Fatalf("cold decision %+v, exact %+v", got, want)
			}
			at = at.Add(10 * time.Millisecond)
		}
		at = at.Add(2 * time.Second) // two periods later: the count starts over
	}
	if st := s.Stats(); st.Leases != 0 || st.Local != 0 || st.BackendCalls != 12 {
		t.Fatalf("stats %+v, want 12 exact calls and no lease", st)
	}

	// The fifth decision in one period makes the key hot: it leases 10
	// units, and the next 9 decisions are local.
	for i := 0; i < 4; i++ {
		take(t, s, at, p, "k", 1)
	}
	before := leased.n.Load()
	for i := 0; i < 10; i++ {
		if d := take(t, s, at, p, "k", 1); !d.Allowed {
			t.Fatalf("hot decision %d refused: %+v", i, d)
		}
	}
	if n := leased.n.Load() - before; n != 1 {
		t.Fatalf("10 hot decisions cost %d backend calls, want 1 (one lease)", n)
	}
	// The key stays hot through the next period (it was hot in the
	// previous one).
	at = at.Add(1500 * time.Millisecond)
	before = leased.n.Load()
	for i := 0; i < 10; i++ {
		take(t, s, at, p, "k", 1)
	}
	if n := leased.n.Load() - before; n != 1 {
		t.Fatalf("next period: %d backend calls, want 1", n)
	}
}

// TestLeaseHonestDecisions: a decision served from a lease never reports
// more Remaining, nor a shorter ResetAfter, than the exact store on a twin
// key with the same history.
func TestLeaseHonestDecisions(t *testing.T) {
	procs := processes(t, 2)
	s := mustLease(t, procs[0], LeaseConfig{Size: 8, MaxAge: time.Second, HotThreshold: 1})
	p := mustPolicy(t, core.Rule{Name: "h", Limit: 20, Window: 20 * time.Second})
	at := leaseT0
	allowed := 0
	for i := 0; i < 40; i++ {
		got := take(t, s, at, p, "k", 1)
		want := take(t, procs[1], at, p, "twin", 1)
		if got.Allowed {
			allowed++
			if got.Remaining > want.Remaining || got.ResetAfter < want.ResetAfter || got.RetryAfter != 0 || got.Limit != want.Limit {
				t.Fatalf("step %d: leased %+v promises more than exact %+v", i, got, want)
			}
		} else if got.RetryAfter < want.RetryAfter && !want.Allowed {
			t.Fatalf("step %d: refusal %+v earlier than exact %+v", i, got, want)
		}
		at = at.Add(100 * time.Millisecond)
	}
	if allowed == 0 {
		t.Fatal("nothing admitted")
	}
	// Within one lease Remaining counts the units held down to 0.
	s2 := mustLease(t, procs[0], LeaseConfig{Size: 5, HotThreshold: 1})
	for want := int64(4); want >= 0; want-- {
		if d := take(t, s2, leaseT0, p, "fresh", 1); !d.Allowed || d.Remaining != want {
			t.Fatalf("decision %+v, want Remaining %d", d, want)
		}
	}
}

// TestLeaseExpiry: unused units of a lease are lost when it ends, counted in
// ExpiredUnits, and the total admitted plus expired never exceeds the quota.
func TestLeaseExpiry(t *testing.T) {
	procs := processes(t, 2)
	cfg := LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1}
	a, b := mustLease(t, procs[0], cfg), mustLease(t, procs[1], cfg)
	p := mustPolicy(t, core.Rule{Name: "e", Algorithm: core.FixedWindow, Limit: 20, Window: time.Hour})

	for i := 0; i < 3; i++ {
		take(t, a, leaseT0, p, "k", 1) // a leases 10, spends 3
	}
	take(t, b, leaseT0, p, "k", 1) // b leases the other 10

	later := leaseT0.Add(time.Second) // a's lease has ended
	d := take(t, a, later, p, "k", 1)
	if d.Allowed {
		t.Fatalf("admitted after the quota was leased out: %+v", d)
	}
	if want := time.Hour - time.Second; d.RetryAfter != want {
		t.Errorf("RetryAfter %v, want the backend's %v", d.RetryAfter, want)
	}
	if st := a.Stats(); st.ExpiredUnits != 7 || st.Leases != 1 || st.LeasedUnits != 10 {
		t.Fatalf("a's stats %+v, want 7 expired of 1 lease of 10", st)
	}
	admitted := 3 + 1
	for i := 0; i < 20; i++ { // b spends its 9 within its lease
		if take(t, b, leaseT0.Add(500*time.Millisecond), p, "k", 1).Allowed {
			admitted++
		}
	}
	if admitted+7 != 20 {
		t.Fatalf("admitted %d + 7 expired, want the quota 20", admitted)
	}
}

// TestLeaseTailOfQuota: when fewer units than a lease are left, the store
// leases what is left, so the last units are admitted; a refusal carries
// the backend's RetryAfter for the request's own cost.
func TestLeaseTailOfQuota(t *testing.T) {
	procs := processes(t, 1)
	s := mustLease(t, procs[0], LeaseConfig{Size: 10, HotThreshold: 1})
	p := mustPolicy(t, core.Rule{Name: "t", Algorithm: core.FixedWindow, Limit: 25, Window: 10 * time.Second})
	admitted := 0
	for i := 0; i < 30; i++ {
		if take(t, s, leaseT0, p, "k", 1).Allowed {
			admitted++
		}
	}
	if admitted != 25 {
		t.Fatalf("admitted %d of a quota of 25", admitted)
	}
	if st := s.Stats(); st.LeasedUnits != 25 || st.Leases != 3 {
		t.Fatalf("stats %+v, want leases of 10, 10 and the 5 left", st)
	}
	d := take(t, s, leaseT0.Add(time.Second), p, "k", 1)
	if d.Allowed || d.RetryAfter != 9*time.Second {
		t.Fatalf("refusal %+v, want RetryAfter 9s (the window's end)", d)
	}
}

// TestLeaseBatchesExact: a layered batch on a hot key goes to the backend
// as it is, all-or-nothing, and leaves the lease alone; so do costs above
// the lease size and shaping policies.
func TestLeaseBatchesExact(t *testing.T) {
	procs := processes(t, 1)
	back := procs[0]
	s := mustLease(t, back, LeaseConfig{Size: 10, HotThreshold: 1})
	ip := mustPolicy(t, core.Rule{Name: "ip", Limit: 100, Window: time.Minute})
	user := mustPolicy(t, core.Rule{Name: "user", Limit: 1, Window: time.Minute})
	take(t, s, leaseT0, ip, "k", 1) // lease of 10 on ip/k, 9 left

	batch := []core.Request{{Policy: ip, Key: "k", Cost: 1}, {Policy: user, Key: "u", Cost: 1}}
	var out [2]core.Decision
	for i, wantAllowed := range []bool{true, false} {
		before := back.n.Load()
		if err := s.Take(context.Background(), leaseT0, batch, out[:]); err != nil {
			t.Fatal(err)
		}
		if back.n.Load()-before != 1 || out[1].Allowed != wantAllowed || (out[0].Allowed && out[1].Allowed) != wantAllowed {
			t.Fatalf("batch %d: %d calls, decisions %+v", i, back.n.Load()-before, out)
		}
	}
	// ip/k in Redis: 10 leased + 1 by the admitted batch; the refused batch
	// charged nothing.
	if out[0].Remaining != 100-11 {
		t.Fatalf("ip Remaining %d in the refused batch, want 89", out[0].Remaining)
	}
	if st := s.Stats(); st.Leases != 1 || st.ExpiredUnits != 0 {
		t.Fatalf("stats %+v: the batches touched the lease", st)
	}
	before := back.n.Load()
	if d := take(t, s, leaseT0, ip, "k", 11); !d.Allowed || back.n.Load()-before != 1 {
		t.Fatalf("cost above the lease size: %+v, %d calls", d, back.n.Load()-before)
	}
	shaping := mustPolicy(t, core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Second, MaxDelay: time.Second})
	before = back.n.Load()
	for i := 0; i < 3; i++ {
		take(t, s, leaseT0, shaping, "k", 1)
	}
	if n := back.n.Load() - before; n != 3 {
		t.Fatalf("shaping policy: %d calls for 3 decisions, want 3", n)
	}
}

// TestLeaseMemoryBounded: a flood of distinct hot keys keeps at most
// MaxKeys entries; the units of forgotten leases count as expired.
func TestLeaseMemoryBounded(t *testing.T) {
	procs := processes(t, 1)
	s := mustLease(t, procs[0], LeaseConfig{Size: 4, HotThreshold: 1, MaxKeys: 50})
	p := mustPolicy(t, core.Rule{Name: "m", Limit: 100, Window: time.Minute})
	const keys = 500
	for i := 0; i < keys; i++ {
		take(t, s, leaseT0, p, fmt.Sprint("key-", i), 1)
	}
	st := s.Stats()
	if st.Keys != 50 {
		t.Fatalf("%d keys tracked, want the bound 50", st.Keys)
	}
	if want := uint64((keys - 50) * 3); st.ExpiredUnits != want {
		t.Fatalf("%d expired units, want %d (3 left in each forgotten lease)", st.ExpiredUnits, want)
	}
}

// TestLeasePolicyChange: a lease taken under one policy is not spent under
// another policy of the same name.
func TestLeasePolicyChange(t *testing.T) {
	procs := processes(t, 1)
	s := mustLease(t, procs[0], LeaseConfig{Size: 5, HotThreshold: 1})
	free := mustPolicy(t, core.Rule{Name: "tier", Limit: 50, Window: time.Minute})
	pro := mustPolicy(t, core.Rule{Name: "tier", Limit: 500, Window: time.Minute})
	take(t, s, leaseT0, free, "k", 1)
	if d := take(t, s, leaseT0, pro, "k", 1); d.Limit != 500 {
		t.Fatalf("decision under the new policy %+v", d)
	}
	if st := s.Stats(); st.ExpiredUnits != 4 || st.Leases != 2 {
		t.Fatalf("stats %+v, want the old lease's 4 units dropped", st)
	}

	// An equal policy made anew for each request (a Resolver reading
	// limits per request) is the same policy: its lease is spent, and a
	// quota of 100 admits 100.
	s = mustLease(t, procs[0], LeaseConfig{Size: 10, HotThreshold: 1})
	admitted := 0
	for range 100 {
		if take(t, s, leaseT0, mustPolicy(t, core.Rule{Name: "fresh", Algorithm: core.FixedWindow, Limit: 100, Window: time.Hour}), "k", 1).Allowed {
			admitted++
		}
	}
	if st := s.Stats(); admitted != 100 || st.ExpiredUnits != 0 {
		t.Fatalf("100 requests under equal policies made anew, quota 100: %d admitted, stats %+v", admitted, st)
	}
}

func TestLeaseConfigErrors(t *testing.T) {
	back := core.MustMemoryStore(nil)
	for name, tc := range map[string]struct {
		backend core.Store
		cfg     *LeaseConfig
	}{
		"nil backend":      {nil, &LeaseConfig{Size: 1}},
		"nil config":       {back, nil},
		"zero size":        {back, &LeaseConfig{}},
		"negative MaxAge":  {back, &LeaseConfig{Size: 1, MaxAge: -1}},
		"negative MaxKeys": {back, &LeaseConfig{Size: 1, MaxKeys: -1}},
		// Added to a time, a longer one would overflow: every lease would
		// be granted already ended.
		"MaxAge above MaxWindow":    {back, &LeaseConfig{Size: 1, MaxAge: time.Duration(math.MaxInt64)}},
		"HotPeriod above MaxWindow": {back, &LeaseConfig{Size: 1, HotPeriod: core.MaxWindow + 1}},
	} {
		if _, err := NewLeaseStore(tc.backend, tc.cfg); !errors.Is(err, ErrInvalidLeaseConfig) {
			t.Errorf("%s: error %v, want ErrInvalidLeaseConfig", name, err)
		}
	}
}

// TestLeaseWaitHonoursContext: a request waiting for another's lease gives
// up when its context ends.
func TestLeaseWaitHonoursContext(t *testing.T) {
	block := make(chan struct{})
	entered := make(chan struct{})
	back := &blockingStore{Store: core.MustMemoryStore(nil), entered: entered, release: block}
	s := mustLease(t, back, LeaseConfig{Size: 5, HotThreshold: 1})
	p := mustPolicy(t, core.Rule{Name: "w", Limit: 50, Window: time.Minute})
	done := make(chan error, 1)
	go func() {
		var out [1]core.Decision
		done <- s.Take(context.Background(), leaseT0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	}()
	<-entered // the first request holds the key while leasing
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out [1]core.Decision
	if err := s.Take(ctx, leaseT0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting Take: %v, want context.Canceled", err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// blockingStore signals entered and waits for release in each Take.
type blockingStore struct {
	core.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Store.Take(ctx, now, reqs, out)
}

// TestLeaseCallerTimesOutOfOrder: concurrent callers read their clocks
// before they wait for the key, so a time a little earlier than the
// lease's grant still spends the lease and keeps the key hot; a time more
// than MaxAge earlier (a clock stepped back) ends it.
func TestLeaseCallerTimesOutOfOrder(t *testing.T) {
	back := processes(t, 1)[0]
	s := mustLease(t, back, LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 3, HotPeriod: time.Second})
	p := mustPolicy(t, core.Rule{Name: "o", Limit: 1000, Window: time.Hour})
	for i := 0; i < 3; i++ {
		take(t, s, leaseT0, p, "k", 1) // the third leases
	}
	calls := back.n.Load()
	for i := 0; i < 5; i++ {
		if d := take(t, s, leaseT0.Add(-time.Millisecond), p, "k", 1); !d.Allowed {
			t.Fatalf("refused: %+v", d)
		}
	}
	if n := back.n.Load() - calls; n != 0 {
		t.Fatalf("%d backend calls for earlier times, want 0 (the lease)", n)
	}
	if st := s.Stats(); st.ExpiredUnits != 0 || st.Local != 5 {
		t.Fatalf("stats %+v", st)
	}
	take(t, s, leaseT0.Add(-2*time.Second), p, "k", 1)
	if st := s.Stats(); st.ExpiredUnits != 4 {
		t.Fatalf("stats %+v, want the 4 units left dropped by a clock stepped back", st)
	}
}

// TestLeaseExpiringUnderLoad: 64 goroutines on four processes whose
// leases end while they run (each goroutine's clock walks 4s in steps of
// 100ms; leases of 50 units last 50ms): nothing is admitted beyond the
// quota, and every unit charged is accounted for as admitted, expired or
// still held in a lease.
func TestLeaseExpiringUnderLoad(t *testing.T) {
	const quota = 600
	p := mustPolicy(t, core.Rule{Name: "x", Algorithm: core.FixedWindow, Limit: quota, Window: time.Hour})
	procs := processes(t, 4)
	stores := make([]*LeaseStore, len(procs))
	for i, b := range procs {
		stores[i] = mustLease(t, b, LeaseConfig{Size: 50, MaxAge: 50 * time.Millisecond, HotThreshold: 1})
	}
	admitted := hammer(t, 64, 40, func(w, i int) bool {
		var out [1]core.Decision
		at := leaseT0.Add(time.Duration(i) * 100 * time.Millisecond)
		if err := stores[w%len(stores)].Take(context.Background(), at, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
			t.Error(err)
		}
		return out[0].Allowed
	})
	var expired, held int64
	for _, s := range stores {
		expired += int64(s.Stats().ExpiredUnits)
		s.mu.Lock()
		for _, e := range s.keys.Values() {
			held += e.left.Load()
		}
		s.mu.Unlock()
	}
	if admitted > quota {
		t.Fatalf("admitted %d, above the quota %d", admitted, quota)
	}
	// 2,560 requests for 600 units: the quota is charged in full.
	if got := int64(admitted) + expired + held; got != quota {
		t.Fatalf("admitted %d + expired %d + held %d = %d, want the quota %d", admitted, expired, held, got, quota)
	}
	if expired == 0 {
		t.Fatal("no lease expired: the test did not exercise expiry")
	}
	t.Logf("admitted %d, expired %d, held %d", admitted, expired, held)
}

// A flood of one-off keys between a hot key's requests must not make the
// store forget the hot key's lease, whose leftovers would be lost: keys
// without leased units are forgotten first. At one instant (T = 0) the
// documented bound of unused leased units is Size, so the hot key gets at
// least its quota less Size.
func TestLeaseFloodOfColdKeysKeepsHotLease(t *testing.T) {
	const quota, size = 100, 10
	p := core.MustPolicy(core.Rule{Name: "api", Limit: quota, Window: time.Hour})
	run := func(flood bool) (admitted int, st LeaseStats) {
		s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: size}) // HotThreshold 10, MaxKeys 10,000
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var out [1]core.Decision
		n := 0
		for {
			for range DefaultHotThreshold {
				if err := s.Take(ctx, leaseT0, []core.Request{{Policy: p, Key: "victim", Cost: 1}}, out[:]); err != nil {
					t.Fatal(err)
				}
				if !out[0].Allowed {
					return admitted, s.Stats()
				}
				admitted++
			}
			if !flood {
				continue
			}
			for range DefaultLeaseKeys { // one request each from as many other clients
				n++
				if err := s.Take(ctx, leaseT0, []core.Request{{Policy: p, Key: fmt.Sprint("c", n), Cost: 1}}, out[:]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	quiet, _ := run(false)
	got, st := run(true)
	if quiet != quota || got < quota-size {
		t.Errorf("the hot key got %d of its %d units alone and %d under a flood of other keys (stats %+v); want %d, and at least %d",
			quiet, quota, got, st, quota, quota-size)
	}
}

// leaseHot makes key hot and leased at now (HotThreshold requests), which
// leaves Size-1 units in its lease.
func leaseHot(t *testing.T, s *LeaseStore, p *core.Policy, key string, now time.Time) {
	t.Helper()
	var out [1]core.Decision
	for range DefaultHotThreshold {
		if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
			t.Fatalf("%s: %v %+v", key, err, out[0])
		}
	}
}

// leaseFlood decides n one-off keys at now.
func leaseFlood(t *testing.T, s *LeaseStore, p *core.Policy, now time.Time, n int) {
	t.Helper()
	var out [1]core.Decision
	for i := range n {
		if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: fmt.Sprint("c", i), Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
	}
}

// Several running leases at the least recently used end (keys that took a
// lease, then paused) all outlive a flood of one-off keys; leases that
// ended long ago protect nothing, so a running one behind them is kept.
func TestLeaseFloodKeepsRunningLeasesOnly(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 100, Window: time.Hour})
	s, err := NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10}) // MaxAge 1s
	if err != nil {
		t.Fatal(err)
	}
	for i := range 9 {
		leaseHot(t, s, p, fmt.Sprint("paused", i), leaseT0)
	}
	leaseFlood(t, s, p, leaseT0, DefaultLeaseKeys)
	if st := s.Stats(); st.ExpiredUnits != 0 {
		t.Errorf("9 running leases, then a flood of one-off keys: %d leased units lost (stats %+v)", st.ExpiredUnits, st)
	}

	s, err = NewLeaseStore(core.MustMemoryStore(nil), &LeaseConfig{Size: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaseEvictionScan {
		leaseHot(t, s, p, fmt.Sprint("gone", i), leaseT0) // ended at leaseT0+1s
	}
	now := leaseT0.Add(time.Minute)
	leaseHot(t, s, p, "victim", now)
	leaseFlood(t, s, p, now, DefaultLeaseKeys)
	s.mu.Lock()
	e, ok := s.keys.Peek(leaseKey{"api", "victim"})
	s.mu.Unlock()
	if !ok || e.left.Load() != 9 {
		t.Errorf("a running lease (9 units) behind %d ended ones, then a flood: kept %v (stats %+v)", leaseEvictionScan, ok, s.Stats())
	}
}

// contendedStore is a backend whose every lease request (cost above 1) is
// preceded by another process's charge of one unit of the same key: the
// contention of a fleet asking for the tail of a quota at once.
type contendedStore struct {
	core.Store
	other core.Store
	calls int
}

func (c *contendedStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	c.calls++
	if len(reqs) == 1 && reqs[0].Cost > 1 {
		var o [1]core.Decision
		_ = c.other.Take(ctx, now, []core.Request{{Policy: reqs[0].Policy, Key: reqs[0].Key, Cost: 1}}, o[:])
	}
	return c.Store.Take(ctx, now, reqs, out)
}

// TestLeaseRefusedUnderContention: the LeaseStore documents
// that a refused lease costs up to three backend calls (Size, then the
// backend's Remaining, then the request's own cost; Stats: "up to two
// more when a lease is refused"). Under contention each retry sees a
// smaller Remaining and asks again for it: one request costs one round
// trip per unit of the tail, with the key held meanwhile.
func TestLeaseRefusedUnderContention(t *testing.T) {
	procs := processes(t, 2)
	p := mustPolicy(t, core.Rule{Name: "zz", Algorithm: core.FixedWindow, Limit: 100, Window: time.Hour})
	// leave 20 units of the quota
	var o [1]core.Decision
	if err := procs[1].Take(context.Background(), leaseT0, []core.Request{{Policy: p, Key: "k", Cost: 80}}, o[:]); err != nil || !o[0].Allowed {
		t.Fatal(err, o[0])
	}
	backend := &contendedStore{Store: procs[0], other: procs[1]}
	s := mustLease(t, backend, LeaseConfig{Size: 50, HotThreshold: 1, MaxAge: time.Minute})
	if d := take(t, s, leaseT0, p, "k", 1); !d.Allowed {
		t.Fatalf("refused with units left: %+v", d)
	}
	if backend.calls > 3 {
		t.Fatalf("one request cost %d backend calls for a refused lease; documented: at most 3 (stats %+v)", backend.calls, s.Stats())
	}
}
