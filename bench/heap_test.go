package bench

import (
	"flag"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
)

var heapProfile = flag.String("heap-profile", "", "write a heap profile of our token-bucket store holding the 1,000,000 keys of BenchmarkHeapPerKey to this file")

// heapKeys is the number of keys BenchmarkHeapPerKey inserts.
const heapKeys = 1_000_000

// heapCapacity is the capacity given to bounded peers: 5% headroom over
// heapKeys, as core's own heap benchmark gives, because our store bounds
// each of its shards and keys do not hash perfectly evenly. The benchmark
// checks that our store kept every key.
const heapCapacity = heapKeys * 105 / 100

// BenchmarkHeapPerKey inserts 1,000,000 keys of 15 bytes into a limiter
// that can hold them all and reports the live heap bytes per key after a
// GC ("B/key"): state, index overhead and the stored key. Each key is built
// fresh (one 16-byte allocation) as a server builds it from a request, so a
// peer that retains the caller's string pays for it, and one that copies
// it pays for its copy. Run it with -benchtime 1x.
func BenchmarkHeapPerKey(b *testing.B) { benchHeapPerKey(b, 1) }

// BenchmarkHeapPerKeyUsedAgain is BenchmarkHeapPerKey with every key
// decided a second time, in the same order, once all are held: our store
// then holds each key in its golang-lru list (a key used once is held in
// its shard's ring; see core.MemoryStore), the most a key costs it.
func BenchmarkHeapPerKeyUsedAgain(b *testing.B) { benchHeapPerKey(b, 2) }

func benchHeapPerKey(b *testing.B, rounds int) {
	forEachPeer(b, func(b *testing.B, p peer) {
		var buf [32]byte
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			runtime.GC()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.StartTimer()
			l := p.newLimiter(b, heapCapacity)
			for range rounds {
				for k := 0; k < heapKeys; k++ {
					key := string(strconv.AppendInt(append(buf[:0], 'h'), int64(1e13+k), 10))
					if !l.Allow(key) && p.name != "ratelimit-swlog" {
						b.Fatalf("key %d refused", k)
					}
				}
			}
			b.StopTimer()
			if n, ok := l.(interface{ Len() int }); ok && n.Len() >= 0 && n.Len() != heapKeys {
				b.Fatalf("the store holds %d keys, want %d", n.Len(), heapKeys)
			}
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/heapKeys, "B/key")
			if *heapProfile != "" && p.name == "ratelimit" && rounds == 1 {
				writeHeapProfile(b, *heapProfile)
			}
			runtime.KeepAlive(l)
			closeLimiter(l)
			b.StartTimer()
		}
	})
}

// writeHeapProfile writes the live heap (as of the last GC) to path.
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
