package core

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkKeys100kParallelSteps splits a decision of the Keys100kParallel
// workload (100,000 keys in a store of 200,000, decided from GOMAXPROCS
// goroutines in a scattered order, every decision admitted) into steps,
// each row adding one to the row before it:
//
//   - lookup: the key's hash, the shard's lock, the key's record found
//     (memShard.find: the slab searched from the key's home slot) and
//     written back unchanged: the store's structure, with no algorithm;
//   - take-fixed-now: the store's whole decision (the record loaded, the
//     token bucket decided, the record written back) at a fixed time;
//   - take: the same at the Limiter's clock, read once per decision;
//   - allow: Limiter.Allow, the public call the workload makes.
//
// Two rows stand apart: clock reads the Limiter's clock alone, and
// algorithm decides the token bucket alone on a state of each goroutine's
// own, without the store. No row writes memory the goroutines share beyond
// what the store itself writes.
func BenchmarkKeys100kParallelSteps(b *testing.B) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = string(fmt.Appendf(nil, "k%014d", i)) // 15 bytes, each its own allocation
	}
	rule := Rule{Name: "bench", Limit: 1 << 30, Window: time.Hour}
	m := MustMemoryStore(&MemoryConfig{Capacity: 2 * n})
	l := Must(New(rule, WithStore(m)))
	p := l.policy
	for _, k := range keys {
		if d, err := l.Allow(context.Background(), k); err != nil || !d.Allowed {
			b.Fatalf("filling: %+v, %v", d, err)
		}
	}
	now := l.NowUnixNano()
	run := func(b *testing.B, do func(k string) bool) {
		var seq atomic.Uint64
		var refused atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			bad := int64(0)
			for pb.Next() {
				i += 7919
				if !do(keys[i%n]) {
					bad++
				}
			}
			refused.Add(bad)
		})
		if r := refused.Load(); r > 0 {
			b.Fatalf("%d decisions refused or missing", r)
		}
	}
	b.Run("clock", func(b *testing.B) {
		run(b, func(string) bool { return l.NowUnixNano() > 0 })
	})
	b.Run("algorithm", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var (
				st State
				d  Decision
			)
			t := now
			for pb.Next() {
				t += 1000
				gcraDecide(p, &st, 1, t, true, &d)
				if !d.Allowed {
					b.Error("the algorithm refused")
					return
				}
			}
		})
	})
	b.Run("lookup", func(b *testing.B) {
		run(b, func(k string) bool {
			r := Request{Policy: p, Key: k, Cost: 1}
			h := m.hash(&r)
			s := &m.shards[m.shard(h)]
			s.mu.Lock()
			var e memEntry
			_, sl, ok := s.find(h, &e)
			if ok {
				sl.A, sl.B = e.st.A, e.st.B
			}
			s.mu.Unlock()
			return ok
		})
	})
	take := func(k string, now int64) bool {
		reqs := [1]Request{{Policy: p, Key: k, Cost: 1}}
		var out [1]Decision
		return m.take(reqs[:], out[:], now) == nil && out[0].Allowed
	}
	b.Run("take-fixed-now", func(b *testing.B) {
		run(b, func(k string) bool { return take(k, now) })
	})
	b.Run("take", func(b *testing.B) {
		run(b, func(k string) bool { return take(k, l.NowUnixNano()) })
	})
	b.Run("allow", func(b *testing.B) {
		run(b, func(k string) bool {
			d, err := l.Allow(context.Background(), k)
			return err == nil && d.Allowed
		})
	})
}
