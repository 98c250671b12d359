package bench

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	_ "unsafe" // go:linkname
)

// paddedCounter is a counter alone on its cache line.
type paddedCounter struct {
	n atomic.Int64
	_ [56]byte
}

// paddedMutex is a mutex alone on its cache line.
type paddedMutex struct {
	mu sync.Mutex
	_  [56]byte
}

// BenchmarkCacheLine measures what this machine charges for memory that
// two cores write, the cost behind every limiter's parallel rows: from
// GOMAXPROCS goroutines, an atomic add to one counter they all write
// ("shared") against one counter each ("private"), and a lock and unlock
// of one of 64 mutexes picked at random, shared by all goroutines as a
// MemoryStore's shard locks are ("locks-shared") against a set of 64 for
// each goroutine ("locks-private"). ns/op is the wall time per operation
// of all goroutines together, as in the parallel workloads. "handoff"
// passes one cache line back and forth between two goroutines, each
// waiting for the other's write before its own: its ns/op is the time a
// line takes to move from one core to the other (when GOMAXPROCS is at
// least 2; the benchmark is skipped otherwise).
func BenchmarkCacheLine(b *testing.B) {
	b.Run("private", func(b *testing.B) {
		var next atomic.Int64
		cs := make([]paddedCounter, 64)
		b.RunParallel(func(pb *testing.PB) {
			c := &cs[next.Add(1)%int64(len(cs))]
			for pb.Next() {
				c.n.Add(1)
			}
		})
	})
	b.Run("shared", func(b *testing.B) {
		var c paddedCounter
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.n.Add(1)
			}
		})
	})
	b.Run("handoff", func(b *testing.B) {
		if runtime.GOMAXPROCS(0) < 2 {
			b.Skip("needs two cores")
		}
		var c paddedCounter
		var wg sync.WaitGroup
		n := int64(b.N)
		for turn := range int64(2) {
			wg.Go(func() {
				for v := turn; v < n; v += 2 {
					for c.n.Load() != v {
					}
					c.n.Store(v + 1)
				}
			})
		}
		wg.Wait()
	})
	locks := func(b *testing.B, set func() []paddedMutex) {
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			ms := set()
			x := seed.Add(1) * 0x9e3779b97f4a7c15
			for pb.Next() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				m := &ms[x&63].mu
				m.Lock()
				m.Unlock()
			}
		})
	}
	b.Run("locks-private", func(b *testing.B) {
		locks(b, func() []paddedMutex { return make([]paddedMutex, 64) })
	})
	b.Run("locks-shared", func(b *testing.B) {
		shared := make([]paddedMutex, 64)
		locks(b, func() []paddedMutex { return shared })
	})
}

//go:linkname procyield runtime.procyield
func procyield(cycles uint32)

// BenchmarkSpinRound measures one round of the spin of a sync.Mutex whose
// holder runs on another core: the runtime's procyield(30), thirty PAUSE
// instructions (see sync's runtime_doSpin). A goroutine that finds a
// shard's lock held waits at least this long before it looks again, up to
// four rounds before it sleeps.
func BenchmarkSpinRound(b *testing.B) {
	for b.Loop() {
		procyield(30)
	}
}
