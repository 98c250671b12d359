package core_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

var t0 = time.Unix(1_800_000_000, 0)

type recorder struct {
	mu        sync.Mutex
	decisions []core.DecisionEvent
	errs      []core.ErrorEvent
	evictions []core.EvictionEvent
}

func (r *recorder) ObserveDecision(e core.DecisionEvent) {
	r.mu.Lock()
	r.decisions = append(r.decisions, e)
	r.mu.Unlock()
}
func (r *recorder) ObserveError(e core.ErrorEvent) {
	r.mu.Lock()
	r.errs = append(r.errs, e)
	r.mu.Unlock()
}
func (r *recorder) ObserveEviction(e core.EvictionEvent) {
	r.mu.Lock()
	r.evictions = append(r.evictions, e)
	r.mu.Unlock()
}

func take(t *testing.T, s core.Store, now time.Time, p *core.Policy, key string) core.Decision {
	t.Helper()
	var out [1]core.Decision
	if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil {
		t.Fatalf("take %q: %v", key, err)
	}
	return out[0]
}

func TestMemoryConfig(t *testing.T) {
	for _, cfg := range []core.MemoryConfig{{Capacity: -1}, {Shards: -1}} {
		if _, err := core.NewMemoryStore(&cfg); err == nil {
			t.Errorf("NewMemoryStore(%+v) accepted a negative value", cfg)
		}
	}
	m := core.MustMemoryStore(nil)
	if m.Capacity() > core.DefaultCapacity || m.Capacity() < core.DefaultCapacity-core.DefaultShards {
		t.Errorf("default capacity = %d, want at most %d and within one per shard of it", m.Capacity(), core.DefaultCapacity)
	}
}

// TestMemoryCapacityHonoured fills stores of every size with twice their
// configured capacity: Capacity never exceeds the configuration, and Len
// never exceeds Capacity.
func TestMemoryCapacityHonoured(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "cap", Limit: 1, Window: time.Hour})
	for _, cfg := range []core.MemoryConfig{
		{Capacity: 1}, {Capacity: 3}, {Capacity: 10}, {Capacity: 100}, {Capacity: 1000}, {Capacity: 5000},
		{Capacity: 10, Shards: 64}, {Capacity: 100, Shards: 3}, {Capacity: 1000, Shards: 1},
	} {
		m := core.MustMemoryStore(&cfg)
		if c := m.Capacity(); c > cfg.Capacity || c < 1 {
			t.Errorf("%+v: Capacity() = %d, want in [1, %d]", cfg, c, cfg.Capacity)
		}
		for i := 0; i < 2*cfg.Capacity; i++ {
			take(t, m, t0, p, fmt.Sprint("k", i))
			if m.Len() > m.Capacity() {
				t.Fatalf("%+v: holds %d keys after %d, Capacity() %d", cfg, m.Len(), i+1, m.Capacity())
			}
		}
		// Below 128 keys, or with Shards 1, the store is one shard holding
		// exactly Capacity keys.
		if cfg.Shards == 1 || cfg.Shards == 0 && cfg.Capacity < 128 {
			if m.Capacity() != cfg.Capacity || m.Len() != cfg.Capacity {
				t.Errorf("%+v: Capacity() = %d, Len() = %d, want both %d", cfg, m.Capacity(), m.Len(), cfg.Capacity)
			}
		}
	}
}

func TestMemoryEvictionCountedAndReported(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: rec})
	p := core.MustPolicy(core.Rule{Name: "e", Limit: 1, Window: time.Minute})
	for i := 0; i < 64; i++ {
		take(t, m, t0, p, fmt.Sprint("k", i))
	}
	if m.Len() != 64 || m.Evictions() != 0 {
		t.Fatalf("Len %d Evictions %d, want 64 and 0", m.Len(), m.Evictions())
	}
	// k0 is exhausted and least recently used: a new key evicts it, which
	// is counted and reported, and k0 comes back with a fresh quota.
	take(t, m, t0, p, "new")
	if m.Len() != 64 || m.Evictions() != 1 {
		t.Fatalf("after overflow: Len %d Evictions %d, want 64 and 1", m.Len(), m.Evictions())
	}
	if len(rec.evictions) != 1 || rec.evictions[0].Key != "k0" || rec.evictions[0].PolicyName != "e" || rec.evictions[0].Stale != time.Minute {
		t.Fatalf("eviction events: %+v", rec.evictions)
	}
	if d := take(t, m, t0, p, "k0"); !d.Allowed {
		t.Fatal("evicted key should have started over")
	}
}

func TestMemoryRecoveredKeysDroppedSilently(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: rec})
	p := core.MustPolicy(core.Rule{Name: "r", Limit: 10, Window: time.Second})
	for i := 0; i < 64; i++ {
		take(t, m, t0, p, fmt.Sprint("k", i))
	}
	// A second later every bucket is full again: replacing those keys loses
	// nothing and is not an eviction.
	for i := 0; i < 64; i++ {
		take(t, m, t0.Add(time.Second), p, fmt.Sprint("n", i))
	}
	if m.Evictions() != 0 || len(rec.evictions) != 0 {
		t.Fatalf("recovered keys counted as evictions: %d %+v", m.Evictions(), rec.evictions)
	}
}

func TestMemoryKeepActive(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, KeepActive: true})
	p := core.MustPolicy(core.Rule{Name: "ka", Limit: 1, Window: time.Minute})
	ip := core.MustPolicy(core.Rule{Name: "ka-ip", Limit: 100, Window: time.Minute})
	victim := "over-limit-client"
	take(t, m, t0, p, victim)
	if d := take(t, m, t0, p, victim); d.Allowed {
		t.Fatal("victim should be over its limit")
	}
	for i := 0; i < 63; i++ {
		take(t, m, t0, p, fmt.Sprint("flood", i))
	}
	// The store is full of keys holding state: new keys are refused with
	// ErrStoreFull, and the victim stays limited.
	var out [2]core.Decision
	err := m.Take(context.Background(), t0, []core.Request{{Policy: p, Key: "flood-x", Cost: 1}}, out[:1])
	if !errors.Is(err, core.ErrStoreFull) || out[0].Allowed {
		t.Fatalf("new key in a full KeepActive store: %+v, %v", out[0], err)
	}
	// A batch with an existing key and a new one is refused whole.
	err = m.Take(context.Background(), t0, []core.Request{{Policy: ip, Key: "flood1", Cost: 1}, {Policy: p, Key: "flood-y", Cost: 1}}, out[:])
	if !errors.Is(err, core.ErrStoreFull) || out[0].Allowed || out[1].Allowed {
		t.Fatalf("batch in a full store: %+v, %v", out, err)
	}
	if m.Evictions() != 0 {
		t.Fatalf("KeepActive evicted %d keys", m.Evictions())
	}
	if d := take(t, m, t0.Add(time.Second), p, victim); d.Allowed {
		t.Fatal("flood released the over-limit client")
	}
	// Once the quotas have recovered, ClockTolerance ago (no decision
	// however late could still read them), new keys fit again.
	if d := take(t, m, t0.Add(time.Minute+core.ClockTolerance), p, "later"); !d.Allowed {
		t.Fatal("recovered store still refuses")
	}
}

// TestMemoryCardinalityAttack pushes a million random keys through a small
// store: the heap stays bounded, the key count stays at capacity and the
// evictions are all counted.
func TestMemoryCardinalityAttack(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the million-key flood")
	}
	const capacity, flood = 10_000, 1_000_000
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: capacity})
	p := core.MustPolicy(core.Rule{Name: "flood", Limit: 5, Window: time.Hour})
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var out [1]core.Decision
	var peak uint64
	before := heap()
	key := make([]byte, 0, 32)
	for i := 0; i < flood; i++ {
		key = fmt.Appendf(key[:0], "%016x", uint64(i)*0x9E3779B97F4A7C15)
		if err := m.Take(context.Background(), t0, []core.Request{{Policy: p, Key: string(key), Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
		if i%250_000 == 0 {
			peak = max(peak, heap())
		}
	}
	after := heap()
	peak = max(peak, after)
	if m.Len() > m.Capacity() {
		t.Fatalf("Len %d exceeds Capacity %d", m.Len(), m.Capacity())
	}
	if ev := m.Evictions(); ev < flood-uint64(m.Capacity()) {
		t.Fatalf("evictions %d, want at least %d", ev, flood-m.Capacity())
	}
	growth := int64(peak) - int64(before)
	t.Logf("%d keys through a %d-key store: heap %d -> %d bytes (peak growth %d, %.0f bytes/key held)", flood, m.Capacity(), before, after, growth, float64(growth)/float64(m.Capacity()))
	if growth > 400*int64(m.Capacity()) {
		t.Fatalf("heap grew %d bytes for %d keys: not bounded by capacity", growth, m.Capacity())
	}
}

func TestMemoryLogGrowsAndPrunes(t *testing.T) {
	m := core.MustMemoryStore(nil)
	p := core.MustPolicy(core.Rule{Name: "log", Algorithm: core.SlidingWindowLog, Limit: 1000, Window: time.Second})
	n := 0
	for i := 0; i < 3000; i++ {
		if take(t, m, t0.Add(time.Duration(i)*time.Millisecond), p, "k").Allowed {
			n++
		}
	}
	if n != 3000 {
		t.Fatalf("1 request per ms against 1000 per second admitted %d of 3000", n)
	}
	if d := take(t, m, t0.Add(2999*time.Millisecond), p, "k"); d.Allowed || d.RetryAfter != time.Millisecond {
		t.Fatalf("full log: %+v, want refused with RetryAfter 1ms", d)
	}
}

// TestMemoryRecoveredDroppedFirst puts a key that still holds state at the
// least recently used end of a full shard, with recovered keys behind it:
// a new key drops a recovered one, silently, and the limited key stays
// limited.
func TestMemoryRecoveredDroppedFirst(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: rec})
	long := core.MustPolicy(core.Rule{Name: "day", Limit: 1, Window: 24 * time.Hour})
	short := core.MustPolicy(core.Rule{Name: "sec", Limit: 1, Window: time.Second})
	take(t, m, t0, long, "limited")
	for i := 0; i < 63; i++ {
		take(t, m, t0, short, fmt.Sprint("s", i))
	}
	later := t0.Add(2 * time.Second) // every "sec" key has recovered
	for i := 0; i < 10; i++ {
		if d := take(t, m, later, long, fmt.Sprint("new", i)); !d.Allowed {
			t.Fatalf("new key %d refused", i)
		}
	}
	if m.Evictions() != 0 || len(rec.evictions) != 0 {
		t.Fatalf("a key holding state was evicted while recovered keys were examined: %d %+v", m.Evictions(), rec.evictions)
	}
	if d := take(t, m, later, long, "limited"); d.Allowed {
		t.Fatal("the limited key was forgotten: admitted again within its day")
	}
}

// TestMemoryEvictionScanBound shows the documented bound: when the
// EvictionScan least recently used keys all hold state, the least recently
// used of them is evicted even though recovered keys sit further on.
func TestMemoryEvictionScanBound(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: rec})
	long := core.MustPolicy(core.Rule{Name: "day", Limit: 1, Window: 24 * time.Hour})
	short := core.MustPolicy(core.Rule{Name: "sec", Limit: 1, Window: time.Second})
	for i := 0; i < core.EvictionScan; i++ {
		take(t, m, t0, long, fmt.Sprint("held", i))
	}
	for i := core.EvictionScan; i < 64; i++ {
		take(t, m, t0, short, fmt.Sprint("s", i))
	}
	later := t0.Add(2 * time.Second)
	take(t, m, later, long, "new0")
	if m.Evictions() != 1 || len(rec.evictions) != 1 || rec.evictions[0].Key != "held0" {
		t.Fatalf("evictions %d %+v, want held0 evicted", m.Evictions(), rec.evictions)
	}
	// The other examined keys were moved to the front: the next new key
	// finds a recovered key at the tail and evicts nothing.
	take(t, m, later, long, "new1")
	if m.Evictions() != 1 {
		t.Fatalf("evictions %d after a second new key, want 1", m.Evictions())
	}
	for i := 1; i < core.EvictionScan; i++ {
		if d := take(t, m, later, long, fmt.Sprint("held", i)); d.Allowed {
			t.Fatalf("held%d was forgotten", i)
		}
	}
}

// TestMemoryKeepActiveRetryAfter checks that a new key refused by a full
// KeepActive store is told exactly when room frees up.
func TestMemoryKeepActiveRetryAfter(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 16, Shards: 1, KeepActive: true})
	p := core.MustPolicy(core.Rule{Name: "ka", Limit: 2, Window: time.Minute})
	for i := 0; i < 16; i++ {
		take(t, m, t0.Add(time.Duration(i)*time.Second), p, fmt.Sprint("k", i))
	}
	// k0 used 1 of 2 tokens at t0: whole again at t0+30s, forgettable
	// ClockTolerance later.
	at := t0.Add(20 * time.Second)
	wait := 10*time.Second + core.ClockTolerance
	var out [2]core.Decision
	err := m.Take(context.Background(), at, []core.Request{{Policy: p, Key: "new", Cost: 1}}, out[:1])
	if !errors.Is(err, core.ErrStoreFull) || out[0].Allowed || out[0].RetryAfter != wait {
		t.Fatalf("full store: %+v, %v; want refused with RetryAfter %v and ErrStoreFull", out[0], err, wait)
	}
	if out[0].Remaining != 2 || out[0].Limit != 2 {
		t.Fatalf("refusal reports Remaining %d Limit %d, want the new key's whole quota 2/2", out[0].Remaining, out[0].Limit)
	}
	// A batch is refused whole, with the same RetryAfter on each decision.
	err = m.Take(context.Background(), at, []core.Request{{Policy: p, Key: "k5", Cost: 1}, {Policy: p, Key: "new", Cost: 1}}, out[:])
	if !errors.Is(err, core.ErrStoreFull) || out[0].Allowed || out[1].Allowed || out[0].RetryAfter != wait || out[1].RetryAfter != wait {
		t.Fatalf("batch in a full store: %+v, %v", out, err)
	}
	// One nanosecond early is still refused; exactly on time is admitted.
	err = m.Take(context.Background(), at.Add(wait-1), []core.Request{{Policy: p, Key: "new", Cost: 1}}, out[:1])
	if !errors.Is(err, core.ErrStoreFull) || out[0].RetryAfter != 1 {
		t.Fatalf("1ns before RetryAfter: %+v, %v", out[0], err)
	}
	if d := take(t, m, at.Add(wait), p, "new"); !d.Allowed {
		t.Fatalf("at RetryAfter: %+v", d)
	}
}

// TestMemoryKeepActiveRetryAfterSeveralKeys: a batch needing two new keys
// in a full KeepActive shard has room only when both least recently used
// keys have recovered: its RetryAfter is the later of the two, never the
// earlier (in Take and in Peek).
func TestMemoryKeepActiveRetryAfterSeveralKeys(t *testing.T) {
	ctx := context.Background()
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 1, KeepActive: true})
	lim, err := core.New(core.Rule{Limit: 1, Window: time.Second}, core.WithStore(m))
	if err != nil {
		t.Fatal(err)
	}
	short := core.MustPolicy(core.Rule{Name: "short", Limit: 1, Window: time.Second})
	long := core.MustPolicy(core.Rule{Name: "long", Limit: 1, Window: time.Hour})
	take(t, m, t0, short, "a") // whole again at t0+1s
	take(t, m, t0, long, "b")  // whole again at t0+1h
	ip := core.MustPolicy(core.Rule{Name: "ip", Limit: 10, Window: time.Minute})
	user := core.MustPolicy(core.Rule{Name: "user", Limit: 10, Window: time.Minute})
	batch := []core.Request{{Policy: ip, Key: "1.2.3.4", Cost: 1}, {Policy: user, Key: "alice", Cost: 1}}
	var out [2]core.Decision
	wait := time.Hour + core.ClockTolerance // b forgettable, ClockTolerance after it recovers
	if _, err := lim.PeekAt(ctx, t0, batch, out[:]); !errors.Is(err, core.ErrStoreFull) || out[0].RetryAfter != wait {
		t.Fatalf("Peek of the batch in a full store: %+v, %v; want ErrStoreFull, RetryAfter %v", out, err, wait)
	}
	err = m.Take(ctx, t0, batch, out[:])
	if !errors.Is(err, core.ErrStoreFull) || out[0].RetryAfter != wait || out[1].RetryAfter != wait {
		t.Fatalf("batch in a full store: %+v, %v; want ErrStoreFull, RetryAfter %v", out, err, wait)
	}
	if err := m.Take(ctx, t0.Add(wait-1), batch, out[:]); !errors.Is(err, core.ErrStoreFull) {
		t.Fatalf("1ns before RetryAfter: %+v, %v; want ErrStoreFull", out, err)
	}
	if err := m.Take(ctx, t0.Add(wait), batch, out[:]); err != nil || !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("at RetryAfter: %+v, %v; want admitted", out, err)
	}
}

// TestMemoryKeepActiveClockBack: after the clock steps back, a full
// KeepActive store refuses a new key for at most the held key's own
// recovery time from the first decision after the step, not for the step.
func TestMemoryKeepActiveClockBack(t *testing.T) {
	ctx := context.Background()
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1, Shards: 1, KeepActive: true})
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 1, Window: time.Second})
	take(t, m, t0.Add(time.Hour), p, "a")
	var out [1]core.Decision
	// The clock steps back an hour; a new client arrives.
	err := m.Take(ctx, t0, []core.Request{{Policy: p, Key: "b", Cost: 1}}, out[:])
	wait := time.Second + core.ClockTolerance
	if !errors.Is(err, core.ErrStoreFull) || out[0].RetryAfter != wait {
		t.Fatalf("after a 1h step back: %+v, %v; want ErrStoreFull with RetryAfter %v (the rule's recovery, then ClockTolerance)", out[0], err, wait)
	}
	if err := m.Take(ctx, t0.Add(wait), []core.Request{{Policy: p, Key: "b", Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
		t.Fatalf("at RetryAfter: %+v, %v; want admitted", out[0], err)
	}
}

// TestMemoryBatchLargerThanShard checks that a batch with more keys in one
// shard than the shard holds is refused whole, with no RetryAfter promise,
// and stores nothing.
func TestMemoryBatchLargerThanShard(t *testing.T) {
	for _, keep := range []bool{false, true} {
		m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1, KeepActive: keep})
		var reqs []core.Request
		for i := 0; i < 5; i++ {
			p := core.MustPolicy(core.Rule{Name: fmt.Sprint("layer", i), Limit: 10, Window: time.Minute})
			reqs = append(reqs, core.Request{Policy: p, Key: "k", Cost: 1})
		}
		out := make([]core.Decision, len(reqs))
		err := m.Take(context.Background(), t0, reqs, out)
		if !errors.Is(err, core.ErrStoreFull) {
			t.Fatalf("KeepActive %v: 5 new keys in a 4-key shard: err = %v, want ErrStoreFull", keep, err)
		}
		for i, d := range out {
			if d.Allowed || d.RetryAfter != 0 || d.Remaining != 10 {
				t.Fatalf("KeepActive %v: decision %d = %+v, want refused, RetryAfter 0, Remaining 10", keep, i, d)
			}
		}
		if m.Len() != 0 {
			t.Fatalf("KeepActive %v: refused batch stored %d keys", keep, m.Len())
		}
		// Two held keys and three new ones do not fit either.
		if err := m.Take(context.Background(), t0, reqs[:2], out); err != nil {
			t.Fatal(err)
		}
		if err := m.Take(context.Background(), t0, reqs, out); !errors.Is(err, core.ErrStoreFull) {
			t.Fatalf("KeepActive %v: 2 held + 3 new keys in a 4-key shard: err = %v", keep, err)
		}
		if d := take(t, m, t0, reqs[0].Policy, "k"); d.Remaining != 8 {
			t.Fatalf("KeepActive %v: held key charged by a refused batch: Remaining %d, want 8", keep, d.Remaining)
		}
	}
}

// TestZeroFakeClock decides with a zero-value FakeClock, which reads the
// zero time.Time: a new key is whole.
func TestZeroFakeClock(t *testing.T) {
	for _, a := range core.Algorithms() {
		r := core.Rule{Algorithm: a, Limit: 3, Window: time.Minute}
		if a == core.LeakyBucket {
			r.Burst = 3
		}
		l := core.Must(core.New(r, core.WithClock(&core.FakeClock{})))
		d, err := l.AllowN(context.Background(), "k", 3)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s on a zero FakeClock: %+v %v, want 3 admitted", a.Name(), d, err)
		}
		if d, _ := l.Allow(context.Background(), "k"); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Minute {
			t.Fatalf("%s on a zero FakeClock, 4th request: %+v", a.Name(), d)
		}
	}
}

// A decision moves a key that may have drifted into the back half of its
// shard to the front of the LRU at once, even within the second of its last
// move, so the key evicted is the one least recently decided (see
// TestMemShardLazyRecency for keys in the front half).
func TestMemoryDecisionRenewsRecency(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1, Observer: rec})
	p := core.MustPolicy(core.Rule{Name: "r", Limit: 10, Window: time.Hour})
	for i, k := range []string{"a", "b", "c", "d"} {
		take(t, m, t0.Add(time.Duration(i)*time.Millisecond), p, k)
	}
	take(t, m, t0.Add(500*time.Millisecond), p, "a")
	take(t, m, t0.Add(600*time.Millisecond), p, "e")
	if len(rec.evictions) != 1 || rec.evictions[0].Key != "b" || rec.evictions[0].PolicyName != "r" {
		t.Fatalf("eviction events %+v, want one of key b", rec.evictions)
	}
}

// Deciding a known key allocates nothing, and a new key costs one
// allocation (its LRU entry) in a full store, evicting or dropping a key.
func TestMemoryAllocations(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1024, Shards: 1})
	p := core.MustPolicy(core.Rule{Name: "a", Limit: 1 << 20, Window: time.Second})
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%014d", i)
	}
	reqs := []core.Request{{Policy: p, Cost: 1}}
	var out [1]core.Decision
	ctx := context.Background()
	for _, k := range keys[:2048] { // fill the store, then overflow it
		reqs[0].Key = k
		m.Take(ctx, t0, reqs, out[:])
	}
	reqs[0].Key = keys[2047]
	if n := testing.AllocsPerRun(100, func() { m.Take(ctx, t0, reqs, out[:]) }); n != 0 {
		t.Errorf("a known key: %v allocations, want 0", n)
	}
	i := 2048
	if n := testing.AllocsPerRun(1000, func() {
		reqs[0].Key = keys[i]
		i++
		m.Take(ctx, t0, reqs, out[:])
	}); n > 1 {
		t.Errorf("a new key: %v allocations, want at most 1", n)
	}
	if m.Len() != 1024 {
		t.Fatalf("Len %d, want 1024", m.Len())
	}
}

// A refund moves its key to the front of the LRU, as a decision does (the
// key is in the back half of its shard); Peek moves nothing.
func TestMemoryRefundRenewsRecencyPeekDoesNot(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1, Observer: rec})
	p := core.MustPolicy(core.Rule{Name: "r", Limit: 10, Window: time.Hour})
	ctx := context.Background()
	var out [1]core.Decision
	// a costs 2, so that it still holds state after its refund of 1.
	if err := m.Take(ctx, t0, []core.Request{{Policy: p, Key: "a", Cost: 2}}, out[:]); err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"b", "c", "d"} {
		take(t, m, t0.Add(time.Duration(i+1)*time.Millisecond), p, k)
	}
	if err := m.Peek(ctx, t0.Add(5*time.Millisecond), []core.Request{{Policy: p, Key: "b", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if err := m.Refund(ctx, t0.Add(6*time.Millisecond), []core.Request{{Policy: p, Key: "a", Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	take(t, m, t0.Add(7*time.Millisecond), p, "e")
	if len(rec.evictions) != 1 || rec.evictions[0].Key != "b" {
		t.Fatalf("eviction events %+v, want one of key b", rec.evictions)
	}
}

// With an Observer, an eviction reports the key's text and its policy's
// Name, also after the key was reset and stored again under another Name.
func TestMemoryEvictionEventsNameTheKey(t *testing.T) {
	rec := &recorder{}
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 1, Observer: rec})
	p := core.MustPolicy(core.Rule{Name: "p", Limit: 10, Window: time.Hour})
	q := core.MustPolicy(core.Rule{Name: "q", Limit: 10, Window: time.Hour})
	ctx := context.Background()
	take(t, m, t0, p, "x")
	if err := m.Reset(ctx, p, "x"); err != nil {
		t.Fatal(err)
	}
	take(t, m, t0.Add(time.Millisecond), q, "x")
	take(t, m, t0.Add(2*time.Millisecond), p, "y")
	take(t, m, t0.Add(3*time.Millisecond), p, "z") // evicts q's x
	take(t, m, t0.Add(4*time.Millisecond), q, "w") // evicts p's y
	want := []core.EvictionEvent{{PolicyName: "q", Key: "x"}, {PolicyName: "p", Key: "y"}}
	if len(rec.evictions) != len(want) {
		t.Fatalf("eviction events %+v, want %+v", rec.evictions, want)
	}
	for i, w := range want {
		if e := rec.evictions[i]; e.PolicyName != w.PolicyName || e.Key != w.Key {
			t.Fatalf("eviction event %d: %+v, want %+v", i, e, w)
		}
	}
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2", m.Len())
	}
}

// TestMemoryRefusedBatchEvictsNothing: a batch that can never fit one of
// its shards is refused before any other shard evicts a key for it, so a
// client over its limit is not released by it.
func TestMemoryRefusedBatchEvictsNothing(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 2})
	p := core.MustPolicy(core.Rule{Name: "p", Limit: 1, Window: time.Hour})
	now := time.Unix(1_800_000_000, 0)
	take := func(reqs ...core.Request) ([]core.Decision, error) {
		out := make([]core.Decision, len(reqs))
		err := m.Take(context.Background(), now, reqs, out)
		return out, err
	}
	if out, err := take(core.Request{Policy: p, Key: "victim", Cost: 1}); err != nil || !out[0].Allowed {
		t.Fatalf("victim's first request: %+v %v", out, err)
	}
	// Three new keys of three policies: at least two land in one shard of
	// one key, so the batch can never fit.
	var reqs []core.Request
	for i := range 3 {
		reqs = append(reqs, core.Request{Policy: core.MustPolicy(core.Rule{Name: fmt.Sprintf("q%d", i), Limit: 5, Window: time.Hour}), Key: "new", Cost: 1})
	}
	if _, err := take(reqs...); !errors.Is(err, core.ErrStoreFull) {
		t.Fatalf("a batch too large for its shards: %v, want core.ErrStoreFull", err)
	}
	if out, err := take(core.Request{Policy: p, Key: "victim", Cost: 1}); err != nil || out[0].Allowed {
		t.Fatalf("victim after the refused batch: %+v %v, want still refused (not evicted)", out[0], err)
	}
	if m.Evictions() != 0 {
		t.Fatalf("%d evictions for a refused batch, want 0", m.Evictions())
	}
}

// budget is a custom algorithm for the memory store tests: Limit units that
// never refill, the units used kept in register A.
type budget struct{}

func (budget) Name() string                           { return "budget" }
func (budget) Validate(core.Rule) error               { return nil }
func (budget) Capacity(r core.Rule) int64             { return r.Limit }
func (budget) Expiry(*core.Policy, *core.State) int64 { return core.MaxTime }

func (budget) Decide(p *core.Policy, s *core.State, cost, now int64, commit bool, d *core.Decision) {
	*d = core.Decision{Limit: p.Capacity(), Policy: p, Remaining: p.Capacity() - s.A}
	if s.A+cost > p.Capacity() {
		d.RetryAfter = time.Hour
		return
	}
	d.Allowed = true
	d.Remaining -= cost
	if commit {
		s.A += cost
	}
}

// TestMemoryCustomAlgorithm decides a custom algorithm through each
// single-request path of the store: a new key, an existing one, a new key
// refused by a full KeepActive store, and a record of a built-in policy
// under the same Name read by the custom one (its units carry over).
func TestMemoryCustomAlgorithm(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 1, KeepActive: true})
	p := core.MustPolicy(core.Rule{Name: "trial", Algorithm: budget{}, Limit: 3, Window: time.Hour})
	for i, want := range []int64{2, 1, 0} {
		if d := take(t, m, t0, p, "a"); !d.Allowed || d.Remaining != want {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i+1, d, want)
		}
	}
	if d := take(t, m, t0, p, "a"); d.Allowed || d.Remaining != 0 || d.RetryAfter != time.Hour {
		t.Fatalf("fourth take: %+v, want refused for an hour", d)
	}
	take(t, m, t0, p, "b")
	var out [1]core.Decision
	err := m.Take(context.Background(), t0, []core.Request{{Policy: p, Key: "c", Cost: 1}}, out[:])
	if !errors.Is(err, core.ErrStoreFull) || out[0].Allowed || out[0].Remaining != 3 || out[0].Limit != 3 {
		t.Fatalf("new key in a full store: %+v, %v; want refused, showing the whole quota of 3", out[0], err)
	}
	// A token bucket of 4 under the same Name, 2 used: the budget of 3
	// starts with those 2 units charged.
	m2 := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1})
	tb := core.MustPolicy(core.Rule{Name: "trial", Limit: 4, Window: time.Hour})
	take(t, m2, t0, tb, "a")
	take(t, m2, t0, tb, "a")
	if d := take(t, m2, t0, p, "a"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("budget after 2 units of a token bucket: %+v, want allowed with 0 remaining", d)
	}
}

// A KeepActive store keeps exact recency: the key it examines is the least
// recently used one, so a key used recently never stands in front of older
// recovered keys and refuses a new key in their place.
func TestMemoryKeepActiveExactRecency(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1, KeepActive: true})
	q := core.MustPolicy(core.Rule{Name: "q", Limit: 1, Window: time.Millisecond})
	p := core.MustPolicy(core.Rule{Name: "p", Limit: 100, Window: time.Hour})
	take(t, m, t0, q, "a")
	take(t, m, t0, p, "b")
	take(t, m, t0, q, "c")
	take(t, m, t0, q, "d")
	take(t, m, t0.Add(time.Second), p, "b")   // b: 2 from the front, used again
	take(t, m, t0.Add(2*time.Second), q, "e") // drops a, recovered
	// c and d have recovered and were used before b: one of them makes room.
	if d := take(t, m, t0.Add(3*time.Second), q, "f"); !d.Allowed {
		t.Fatalf("f refused (RetryAfter %v): the store examined b, not the least recently used key", d.RetryAfter)
	}
}

// TestPeekKeepsRecency: a Peek does not renew a key in the LRU, so it
// never changes which key a later Take finds oldest.
func TestPeekKeepsRecency(t *testing.T) {
	short := core.MustPolicy(core.Rule{Name: "short", Limit: 1, Window: time.Second})
	long := core.MustPolicy(core.Rule{Name: "long", Limit: 1, Window: time.Hour})
	for _, peek := range []bool{false, true} {
		m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 1, KeepActive: true})
		var out [1]core.Decision
		for _, r := range []core.Request{{Policy: short, Key: "a", Cost: 1}, {Policy: long, Key: "b", Cost: 1}} {
			if err := m.Take(context.Background(), t0, []core.Request{r}, out[:]); err != nil {
				t.Fatal(err)
			}
		}
		now := t0.Add(2 * time.Second) // a has recovered, b has not
		if peek {
			if err := m.Peek(context.Background(), now, []core.Request{{Policy: short, Key: "a", Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Take(context.Background(), now, []core.Request{{Policy: short, Key: "c", Cost: 1}}, out[:]); err != nil {
			t.Fatalf("peek %v: a new key in a store whose oldest key has recovered: %v", peek, err)
		}
	}
}

// TestMemoryConversionFromFastShapingBucket: a shaping bucket whose queue
// holds more units than an int64 counts (a valid policy of MaxLimit per
// millisecond, an hour of MaxDelay, read after a clock stepped back)
// converts to another policy without overflowing: refused, no panic.
func TestMemoryConversionFromFastShapingBucket(t *testing.T) {
	a := core.MustPolicy(core.Rule{Name: "ov", Algorithm: core.LeakyBucket, Limit: core.MaxLimit, Window: time.Millisecond, Burst: 1, MaxDelay: time.Hour})
	b := core.MustPolicy(core.Rule{Name: "ov", Limit: 10, Window: time.Second})
	m := core.MustMemoryStore(nil)
	if d := take(t, m, t0.Add(2*time.Hour), a, "k"); !d.Allowed {
		t.Fatal(d)
	}
	if d := take(t, m, t0, b, "k"); d.Allowed {
		t.Fatalf("under 10/s: %+v, want refused (the shaping bucket's queue is far beyond 10)", d)
	}
}

// TestPeekClampsUnderRequestPolicy: a Peek under a leaky bucket of the
// record's Identity but less MaxDelay writes the state clamped under its
// own policy, as its Take would, so that its RetryAfter holds: a request
// at that time is admitted.
func TestPeekClampsUnderRequestPolicy(t *testing.T) {
	m := core.MustMemoryStore(nil)
	shape := core.MustPolicy(core.Rule{Name: "n", Algorithm: core.LeakyBucket, Limit: 3, Window: 999 * time.Millisecond, Burst: 3, MaxDelay: time.Second})
	meter := core.MustPolicy(core.Rule{Name: "n", Algorithm: core.LeakyBucket, Limit: 3, Window: 999 * time.Millisecond, Burst: 3})
	t0 := time.Unix(1_800_000_000, 0)
	var d [1]core.Decision
	for range 2 { // the second is queued 999ms
		if err := m.Take(context.Background(), t0, []core.Request{{Policy: shape, Key: "k", Cost: 3}}, d[:]); err != nil || !d[0].Allowed {
			t.Fatalf("shaping take: %+v %v", d[0], err)
		}
	}
	at := t0.Add(637867 * time.Microsecond)
	req := []core.Request{{Policy: meter, Key: "k", Cost: 3}}
	if err := m.Peek(context.Background(), at, req, d[:]); err != nil || d[0].Allowed {
		t.Fatalf("peek: %+v %v, want refused", d[0], err)
	}
	var p [1]core.Decision
	if err := m.Take(context.Background(), at.Add(d[0].RetryAfter), req, p[:]); err != nil || !p[0].Allowed {
		t.Fatalf("at the peek's RetryAfter %v: %+v %v, want admitted", d[0].RetryAfter, p[0], err)
	}
}

// TestSlidingLogRefundKeepsExpired: a refund that finds the charge gone
// from the window (nothing to give back) leaves the log as it is, so that
// a clock stepping back counts the charge again (dropping it would credit
// it).
func TestSlidingLogRefundKeepsExpired(t *testing.T) {
	m := core.MustMemoryStore(nil)
	p := core.MustPolicy(core.Rule{Name: "n", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Second})
	t0 := time.Unix(1_800_000_000, 0)
	var d [1]core.Decision
	if err := m.Take(context.Background(), t0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, d[:]); err != nil || !d[0].Allowed {
		t.Fatal(d[0], err)
	}
	if err := m.Refund(context.Background(), t0.Add(1345*time.Millisecond), []core.Request{{Policy: p, Key: "k", Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Take(context.Background(), t0.Add(300*time.Millisecond), []core.Request{{Policy: p, Key: "k", Cost: 3}}, d[:]); err != nil || d[0].Allowed {
		t.Fatalf("after the clock stepped back into the charge's window: %+v %v, want refused (the charge counts)", d[0], err)
	}
}

// TestMemoryHotKeyExactUnderMixedAccess decides one key from two
// goroutines, which makes it its shard's hot record, while two others
// reach the same shard otherwise: batches holding the key, a Peek of it,
// decisions on other keys. Every access must see the key's State as the
// last decision left it: the key admits exactly its quota, and a Peek
// never reports more left than an earlier one did.
func TestMemoryHotKeyExactUnderMixedAccess(t *testing.T) {
	for _, a := range []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowCounter} {
		t.Run(a.Name(), func(t *testing.T) {
			const limit = 300
			m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1})
			rule := core.Rule{Name: "hot", Algorithm: a, Limit: limit, Window: time.Hour}
			if a == core.LeakyBucket {
				rule.Burst = limit
			}
			p := core.MustPolicy(rule)
			ctx := context.Background()
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				admitted int
				errs     []error
			)
			count := func(n int, err error) {
				mu.Lock()
				admitted += n
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						var out [1]core.Decision
						err := m.Take(ctx, t0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
						count(int(b2i(out[0].Allowed)), err)
					}
				}()
			}
			wg.Add(2)
			go func() { // batches holding the key
				defer wg.Done()
				for i := 0; i < 100; i++ {
					reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}, {Policy: p, Key: fmt.Sprint("b", i%8), Cost: 1}}
					var out [2]core.Decision
					err := m.Take(ctx, t0, reqs, out[:])
					count(int(b2i(out[0].Allowed && out[1].Allowed)), err)
				}
			}()
			go func() { // Peeks of the key, and decisions on other keys
				defer wg.Done()
				last := int64(limit)
				for i := 0; i < 100; i++ {
					var out [1]core.Decision
					if err := m.Peek(ctx, t0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
						count(0, err)
						return
					}
					if out[0].Remaining > last {
						count(0, fmt.Errorf("a Peek reported %d left after %d", out[0].Remaining, last))
					}
					last = out[0].Remaining
					err := m.Take(ctx, t0, []core.Request{{Policy: p, Key: fmt.Sprint("o", i%8), Cost: 1}}, out[:])
					count(0, err)
				}
			}()
			wg.Wait()
			if len(errs) > 0 {
				t.Fatal(errs[0])
			}
			if admitted != limit {
				t.Fatalf("the key admitted %d requests, want exactly its quota %d", admitted, limit)
			}
			if d := peekOne(t, m, p, "k"); d.Remaining != 0 {
				t.Fatalf("a Peek after the quota was spent reports %d left", d.Remaining)
			}
		})
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func peekOne(t *testing.T, m *core.MemoryStore, p *core.Policy, key string) core.Decision {
	t.Helper()
	var out [1]core.Decision
	if err := m.Peek(context.Background(), t0, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestMemoryHotKeyEveryAccessSeesItsState decides a key five times, which
// makes it its shard's hot record (its State kept apart from its slot),
// then reaches it by every other way: each must find the five charges.
func TestMemoryHotKeyEveryAccessSeesItsState(t *testing.T) {
	const limit = 10
	p := core.MustPolicy(core.Rule{Name: "hot", Limit: limit, Window: time.Hour})
	other := core.MustPolicy(core.Rule{Name: "hot", Algorithm: core.FixedWindow, Limit: limit, Window: time.Hour})
	ctx := context.Background()
	one := func(pol *core.Policy, key string) []core.Request {
		return []core.Request{{Policy: pol, Key: key, Cost: 1}}
	}
	cases := []struct {
		name string
		// after runs on the store whose key "k" was decided five times,
		// and returns the Remaining it reads for k (a Peek's is that of
		// a decision that charges).
		after func(t *testing.T, m *core.MemoryStore) int64
		want  int64
	}{
		{"a Peek", func(t *testing.T, m *core.MemoryStore) int64 {
			return peekOne(t, m, p, "k").Remaining
		}, limit - 6},
		{"a decision", func(t *testing.T, m *core.MemoryStore) int64 {
			return take(t, m, t0, p, "k").Remaining
		}, limit - 6},
		{"a batch", func(t *testing.T, m *core.MemoryStore) int64 {
			var out [2]core.Decision
			reqs := append(one(p, "k"), one(p, "x")...)
			if err := m.Take(ctx, t0, reqs, out[:]); err != nil {
				t.Fatal(err)
			}
			return out[0].Remaining
		}, limit - 6},
		{"a refund", func(t *testing.T, m *core.MemoryStore) int64 {
			if err := m.Refund(ctx, t0, one(p, "k")); err != nil {
				t.Fatal(err)
			}
			return peekOne(t, m, p, "k").Remaining
		}, limit - 5},
		{"a reset", func(t *testing.T, m *core.MemoryStore) int64 {
			if err := m.Reset(ctx, p, "k"); err != nil {
				t.Fatal(err)
			}
			return take(t, m, t0, p, "k").Remaining
		}, limit - 1},
		{"another policy of its Name", func(t *testing.T, m *core.MemoryStore) int64 {
			return take(t, m, t0, other, "k").Remaining
		}, limit - 6},
		{"another key made hot, then a Peek", func(t *testing.T, m *core.MemoryStore) int64 {
			take(t, m, t0, p, "y")
			take(t, m, t0, p, "y")
			take(t, m, t0, p, "y")
			return peekOne(t, m, p, "k").Remaining
		}, limit - 6},
		{"another key made hot, then a decision", func(t *testing.T, m *core.MemoryStore) int64 {
			take(t, m, t0, p, "y")
			take(t, m, t0, p, "y")
			return take(t, m, t0, p, "k").Remaining
		}, limit - 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1})
			for i := 0; i < 5; i++ {
				take(t, m, t0, p, "k")
			}
			if got := c.after(t, m); got != c.want {
				t.Fatalf("%d left, want %d", got, c.want)
			}
		})
	}
}

// TestEvictionStaleAfterClockStepBack: a record charged an hour ahead of
// a clock that then stepped back is evicted with a Stale of how long it
// matters now that a decision would clamp it (at most a Window and
// ClockTolerance), not the hour it was ahead.
func TestEvictionStaleAfterClockStepBack(t *testing.T) {
	for _, a := range []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowLog, core.SlidingWindowCounter} {
		t.Run(a.Name(), func(t *testing.T) {
			rec := &recorder{}
			m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1, Observer: rec})
			rule := core.Rule{Name: "p", Algorithm: a, Limit: 10, Window: time.Second}
			if a == core.LeakyBucket {
				rule.Burst = 10
			}
			p := core.MustPolicy(rule)
			var out [1]core.Decision
			if err := m.Take(context.Background(), t0.Add(time.Hour), []core.Request{{Policy: p, Key: "a", Cost: 10}}, out[:]); err != nil {
				t.Fatal(err)
			}
			take(t, m, t0, p, "b") // the clock stepped back an hour; a is evicted
			if len(rec.evictions) != 1 || rec.evictions[0].Key != "a" {
				t.Fatalf("evictions %+v, want a's", rec.evictions)
			}
			if s, bound := rec.evictions[0].Stale, time.Second+core.ClockTolerance; s <= 0 || s > bound {
				t.Errorf("Stale %v, want in (0, %v]", s, bound)
			}
		})
	}
}

// TestMemoryKeepActiveLateCaller checks that a full KeepActive store does
// not forget a key the moment it recovers: a request whose time was read
// just before (within ClockTolerance, which every algorithm reads as the
// state's own time) and that reaches the store after a new key came is
// decided on the key's record, as in a store with room, never on a fresh
// quota.
func TestMemoryKeepActiveLateCaller(t *testing.T) {
	ctx := context.Background()
	for _, alg := range core.Algorithms() {
		p := core.MustPolicy(core.Rule{Name: "d", Algorithm: alg, Limit: 3, Window: 100 * time.Millisecond})
		start := time.Unix(1_700_000_000, 0) // a multiple of the window
		run := func(cfg *core.MemoryConfig) (admitted int) {
			l := core.Must(core.NewWithPolicy(p, core.WithStore(core.MustMemoryStore(cfg))))
			take := func(key string, at time.Time) (core.Decision, error) {
				out := make([]core.Decision, 1)
				_, err := l.TakeAt(ctx, at, []core.Request{{Policy: p, Key: key, Cost: 1}}, out)
				return out[0], err
			}
			for range 3 {
				take("a", start)
			}
			d, _ := take("a", start.Add(time.Millisecond))
			recovered := start.Add(time.Millisecond + d.ResetAfter)
			take("b", recovered) // a new key, when a has just recovered
			late := recovered.Add(-time.Millisecond)
			for range 3 {
				if d, err := take("a", late); err == nil && d.Allowed {
					admitted++
				}
			}
			return admitted
		}
		roomy := run(&core.MemoryConfig{Capacity: 64, Shards: 1})
		full := run(&core.MemoryConfig{Capacity: 1, Shards: 1, KeepActive: true})
		if full != roomy {
			t.Errorf("%s: a late request admitted %d times by a full KeepActive store, %d by one with room", alg.Name(), full, roomy)
		}
	}
}
