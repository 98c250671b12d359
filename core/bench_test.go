package core_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// benchRule is generous enough that most decisions admit, as in production.
func benchRule(a core.Algorithm) core.Rule {
	r := core.Rule{Name: "bench", Algorithm: a, Limit: 1 << 30, Window: time.Second}
	if a == core.SlidingWindowLog {
		r.Limit = 1000 // its memory is O(Limit) per key
	}
	return r
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("203.0.%03d.%03d:x", i/256%256, i%256)[:15]
		if n > 65536 {
			keys[i] = fmt.Sprintf("k%014d", i)
		}
	}
	return keys
}

func forEachAlgorithm(b *testing.B, f func(b *testing.B, l *core.Limiter)) {
	for _, a := range core.Algorithms() {
		b.Run(a.Name(), func(b *testing.B) {
			m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 200_000})
			f(b, core.Must(core.New(benchRule(a), core.WithStore(m))))
		})
	}
}

func BenchmarkHotKey(b *testing.B) {
	forEachAlgorithm(b, func(b *testing.B, l *core.Limiter) {
		ctx := context.Background()
		l.Allow(ctx, "198.51.100.7")
		b.ReportAllocs()
		for b.Loop() {
			l.Allow(ctx, "198.51.100.7")
		}
	})
}

func BenchmarkHotKeyParallel(b *testing.B) {
	forEachAlgorithm(b, func(b *testing.B, l *core.Limiter) {
		ctx := context.Background()
		l.Allow(ctx, "198.51.100.7")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(ctx, "198.51.100.7")
			}
		})
	})
}

func BenchmarkKeys100kParallel(b *testing.B) {
	keys := benchKeys(100_000)
	forEachAlgorithm(b, func(b *testing.B, l *core.Limiter) {
		ctx := context.Background()
		for _, k := range keys {
			l.Allow(ctx, k)
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			for pb.Next() {
				i += 7919
				l.Allow(ctx, keys[i%uint64(len(keys))])
			}
		})
	})
}

func BenchmarkNewKey(b *testing.B) {
	keys := benchKeys(1 << 20)
	forEachAlgorithm(b, func(b *testing.B, l *core.Limiter) {
		ctx := context.Background()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Allow(ctx, keys[i&(1<<20-1)])
			i++
		}
	})
}

// BenchmarkBatch decides a two-layer batch (per-IP then per-user) on
// existing keys.
func BenchmarkBatch(b *testing.B) {
	ip := core.MustPolicy(core.Rule{Name: "ip", Limit: 1 << 30, Window: time.Second})
	user := core.MustPolicy(core.Rule{Name: "user", Limit: 1 << 30, Window: time.Second})
	l := core.Must(core.NewWithPolicy(nil))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		reqs := [2]core.Request{{Policy: ip, Key: "198.51.100.7", Cost: 1}, {Policy: user, Key: "alice", Cost: 1}}
		var out [2]core.Decision
		l.Take(ctx, reqs[:], out[:])
	}
}

// BenchmarkHeapPerKey inserts 1,000,000 keys of 15 bytes into a store that
// holds them all and reports the heap bytes per key (LRU overhead, state and
// the key included).
func BenchmarkHeapPerKey(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%014d", i)
	}
	for _, a := range core.Algorithms() {
		b.Run(a.Name(), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b.StartTimer()
				// Shards fill unevenly: 5% headroom holds every key.
				m := core.MustMemoryStore(&core.MemoryConfig{Capacity: n + n/20})
				p := core.MustPolicy(core.Rule{Name: "b", Algorithm: a, Limit: 100, Window: time.Minute})
				var out [1]core.Decision
				now := time.Now()
				for _, k := range keys {
					m.Take(context.Background(), now, []core.Request{{Policy: p, Key: k, Cost: 1}}, out[:])
				}
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&after)
				if m.Len() != n {
					b.Fatalf("store holds %d keys, want %d", m.Len(), n)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
				runtime.KeepAlive(m)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkFloodHeldKeys decides new keys against a full store whose keys
// all still hold state: each new key examines up to EvictionScan keys
// before evicting one, the worst case of an insertion.
func BenchmarkFloodHeldKeys(b *testing.B) {
	keys := benchKeys(1 << 20)
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 10_000})
	l := core.Must(core.New(core.Rule{Name: "flood", Limit: 5, Window: time.Hour}, core.WithStore(m), core.WithClock(core.NewFakeClock(time.Unix(1_800_000_000, 0)))))
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(ctx, keys[i&(1<<20-1)])
		i++
	}
	if m.Len() > m.Capacity() {
		b.Fatalf("Len %d beyond Capacity %d", m.Len(), m.Capacity())
	}
}
