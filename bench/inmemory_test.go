package bench

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// memCapacity is the key capacity of the bounded peers in the decision
// workloads: twice the largest working set, so that an existing key is
// never evicted (NewKey evicts at steady state, as a bounded store must).
const memCapacity = 200_000

const hotKey = "198.51.100.7"

// keys returns n distinct 15-byte keys.
func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("k%014d", i)
	}
	return ks
}

// clones returns copies of ks in memory of their own. The timed loops
// decide with these while the limiters were filled with the originals, as
// in a server where every request builds its key afresh: a limiter that
// keeps the caller's string does not get its key comparisons for free
// (Go compares strings sharing a pointer without reading them).
func clones(ks []string) []string {
	cs := make([]string, len(ks))
	for i, k := range ks {
		cs[i] = strings.Clone(k)
	}
	return cs
}

func forEachPeer(b *testing.B, f func(b *testing.B, p peer)) {
	for _, p := range peers() {
		b.Run(p.name, func(b *testing.B) { f(b, p) })
	}
}

// BenchmarkHotKey decides one existing key from one goroutine.
func BenchmarkHotKey(b *testing.B) {
	forEachPeer(b, func(b *testing.B, p peer) {
		l := p.newLimiter(b, memCapacity)
		defer closeLimiter(l)
		l.Allow(hotKey)
		key := strings.Clone(hotKey)
		b.ReportAllocs()
		for b.Loop() {
			l.Allow(key)
		}
	})
}

// BenchmarkHotKeyParallel decides one existing key from GOMAXPROCS
// goroutines.
func BenchmarkHotKeyParallel(b *testing.B) {
	forEachPeer(b, func(b *testing.B, p peer) {
		l := p.newLimiter(b, memCapacity)
		defer closeLimiter(l)
		l.Allow(hotKey)
		key := strings.Clone(hotKey)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(key)
			}
		})
	})
}

// BenchmarkKeys100kParallel decides 100,000 existing keys in a scattered
// order from GOMAXPROCS goroutines (with fresh copies of the keys, see
// clones).
func BenchmarkKeys100kParallel(b *testing.B) {
	ks := keys(100_000)
	fresh := clones(ks)
	forEachPeer(b, func(b *testing.B, p peer) {
		l := p.newLimiter(b, memCapacity)
		defer closeLimiter(l)
		for _, k := range ks {
			l.Allow(k)
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			for pb.Next() {
				i += 7919
				l.Allow(fresh[i%uint64(len(fresh))])
			}
		})
	})
}

// BenchmarkNewKey decides a key never seen before on every operation, from
// one goroutine, in a limiter that already holds memCapacity other keys
// (filled before the timer starts), so that bounded peers evict from the
// first timed decision: the steady state of a full store. Keys come from a
// pre-built list of 2^20; when it wraps the limiter is replaced and filled
// again (timer stopped), so that no peer ever sees a key twice. The fill
// also grows the process's heap before any peer is timed: otherwise the
// first peer of a process pays the page faults of the heap's growth (about
// 200 ns per decision here) and the others do not.
func BenchmarkNewKey(b *testing.B) {
	const n = 1 << 20
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "n" + strconv.FormatInt(int64(1e13+i), 10) // 15 bytes
	}
	fill := make([]string, memCapacity)
	for i := range fill {
		fill[i] = "f" + strconv.FormatInt(int64(1e13+i), 10)
	}
	filled := func(b *testing.B, p peer) limiter {
		l := p.newLimiter(b, memCapacity)
		for _, k := range fill {
			l.Allow(k)
		}
		return l
	}
	forEachPeer(b, func(b *testing.B, p peer) {
		closeLimiter(newKeys(b, ks, func() limiter { return filled(b, p) }))
	})
}

// newKeys times b.N decisions, one on each key of ks in turn, on the
// limiter next returns, replaced by the next one (timer stopped) each time
// the keys wrap, so that no limiter sees a key twice. It returns the last
// limiter, open, with the timer stopped.
func newKeys(b *testing.B, ks []string, next func() limiter) limiter {
	l := next()
	b.ReportAllocs()
	b.ResetTimer()
	j := 0
	for i := 0; i < b.N; i++ {
		if j == len(ks) {
			b.StopTimer()
			closeLimiter(l)
			l = next()
			b.StartTimer()
			j = 0
		}
		l.Allow(ks[j])
		j++
	}
	b.StopTimer()
	return l
}

// BenchmarkNewKeyGrowing decides a key never seen before on every
// operation, from one goroutine, in a limiter that starts empty and holds
// every key (heapCapacity): the store grows to heapKeys keys and bounded
// peers never evict, as in the first table of our performance targets.
// Timed with -benchtime 1000000x (heapKeys), one run is one growth from
// empty to full; past heapKeys decisions the limiter is replaced (timer
// stopped).
// Before the timer starts, a throwaway limiter of the same peer is filled
// with the same keys and dropped, so that every row finds the process's
// heap already grown (see BenchmarkNewKey).
func BenchmarkNewKeyGrowing(b *testing.B) {
	ks := make([]string, heapKeys)
	for i := range ks {
		ks[i] = "g" + strconv.FormatInt(int64(1e13+i), 10) // 15 bytes
	}
	fresh := func(b *testing.B, p peer) limiter {
		runtime.GC()
		return p.newLimiter(b, heapCapacity)
	}
	forEachPeer(b, func(b *testing.B, p peer) {
		if b.N > 1 {
			warm := p.newLimiter(b, heapCapacity)
			for _, k := range ks {
				warm.Allow(k)
			}
			closeLimiter(warm)
		}
		l := newKeys(b, ks, func() limiter { return fresh(b, p) })
		if c, ok := l.(*coreLimiter); ok {
			// The last limiter decided the last (b.N-1)%heapKeys+1 keys.
			if n, want := c.Len(), (b.N-1)%heapKeys+1; n != want {
				b.Fatalf("the store holds %d keys, want %d: it evicted%s", n, want, failures(l))
			}
		}
		closeLimiter(l)
	})
}
