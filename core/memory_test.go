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
	if m.Capacity() < core.DefaultCapacity || m.Capacity() > core.DefaultCapacity+core.DefaultShards*64 {
		t.Errorf("default capacity = %d, want about %d", m.Capacity(), core.DefaultCapacity)
	}
	small := core.MustMemoryStore(&core.MemoryConfig{Capacity: 100})
	if small.Capacity() < 100 || small.Capacity() > 128 {
		t.Errorf("capacity 100 gives %d keys", small.Capacity())
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
	// Once the quotas recover, new keys fit again.
	if d := take(t, m, t0.Add(time.Minute), p, "later"); !d.Allowed {
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
