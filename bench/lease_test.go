package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// The quota-lease workloads (adapters/redisstore LeaseStore and
// RefusalCache) against the private redis-server. Each compares the Redis
// store deciding exactly ("exact") with the same store behind a LeaseStore
// of the given lease size ("lease-N"), with the LeaseStore's defaults
// otherwise (a key is hot from 10 decisions per second; leases last at
// most one second). Decisions use Redis's clock, as in production. They
// report "rtt/1k" (Redis round trips per 1,000 decisions, counted by a
// client hook), and the parallel ones "decisions/s".

// leaseModes are the stores compared: exact, then leases of these sizes.
var leaseModes = []int64{0, 10, 100}

func leaseModeName(size int64) string {
	if size == 0 {
		return "exact"
	}
	return fmt.Sprintf("lease-%d", size)
}

// leaseStore returns the Redis store over c, behind a LeaseStore of size
// units unless size is 0.
func leaseStore(b *testing.B, c redis.UniversalClient, prefix string, size int64) (core.Store, *redisstore.LeaseStore) {
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	if size == 0 {
		return s, nil
	}
	l, err := redisstore.NewLeaseStore(s, &redisstore.LeaseConfig{Size: size})
	if err != nil {
		b.Fatal(err)
	}
	return l, l
}

func leaseLimiter(b *testing.B, s core.Store, rule core.Rule) *coreLimiter {
	l, err := core.New(rule, core.WithStore(s))
	if err != nil {
		b.Fatal(err)
	}
	return &coreLimiter{l: l}
}

// BenchmarkLeaseHotKey decides one hot key, one decision at a time, under a
// quota it never exhausts: the round trips and latency leases save.
func BenchmarkLeaseHotKey(b *testing.B) {
	for _, size := range leaseModes {
		b.Run(leaseModeName(size), func(b *testing.B) {
			c, h := redisClient(b, nil)
			s, _ := leaseStore(b, c, "bench-lease:", size)
			l := leaseLimiter(b, s, core.Rule{Name: "hot", Limit: quotaLimit, Window: quotaWindow})
			for range 100 { // warm up: script loaded, key hot
				l.Allow("hot")
			}
			rtt0 := h.n.Load()
			b.ReportAllocs()
			b.ResetTimer()
			refused := 0
			for i := 0; i < b.N; i++ {
				if !l.Allow("hot") {
					refused++
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(h.n.Load()-rtt0)*1000/float64(b.N), "rtt/1k")
			if refused > 0 {
				b.Fatalf("%d of %d decisions refused (or failed)%s", refused, b.N, failures(l))
			}
		})
	}
}

// BenchmarkLeaseHotKeyParallel64 decides one hot key from 64 goroutines
// under a quota it never exhausts, and reports decisions per second.
func BenchmarkLeaseHotKeyParallel64(b *testing.B) {
	for _, size := range leaseModes {
		b.Run(leaseModeName(size), func(b *testing.B) {
			c, h := redisClient(b, nil)
			var wg sync.WaitGroup
			for range redisParallelism {
				wg.Go(func() { c.Ping(context.Background()) })
			}
			wg.Wait()
			s, _ := leaseStore(b, c, "bench-lease:", size)
			l := leaseLimiter(b, s, core.Rule{Name: "hot", Limit: quotaLimit, Window: quotaWindow})
			for range 100 {
				l.Allow("hot")
			}
			rtt0 := h.n.Load()
			var refused atomic.Int64
			b.SetParallelism(max(1, redisParallelism/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if !l.Allow("hot") {
						refused.Add(1)
					}
				}
			})
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(h.n.Load()-rtt0)*1000/float64(b.N), "rtt/1k")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			if n := refused.Load(); n > 0 {
				b.Fatalf("%d of %d decisions refused (or failed)%s", n, b.N, failures(l))
			}
		})
	}
}

// Admission rounds: leaseProcs processes (each its own client and stores)
// share one key's quota of leaseQuota units per year (a token bucket that
// refills nothing during a round); 64 goroutines spread over them ask for
// twice the quota.
const (
	leaseProcs = 4
	leaseQuota = 5000
)

// BenchmarkLeaseAdmitted runs one admission round per op and reports the
// units admitted ("admitted/op", which must not exceed leaseQuota), the
// units leased but never spent ("expired/op", refused early), the round
// trips of the round ("rtt/op") and its decisions per second. The
// "lease-100+cache" row puts a RefusalCache in front of the LeaseStore, so
// the refused half of the demand costs no round trips.
func BenchmarkLeaseAdmitted(b *testing.B) {
	type mode struct {
		size  int64
		cache bool
	}
	for _, m := range []mode{{0, false}, {10, false}, {100, false}, {100, true}} {
		name := leaseModeName(m.size)
		if m.cache {
			name += "+cache"
		}
		size := m.size
		b.Run(name, func(b *testing.B) {
			clients := make([]*redis.Client, leaseProcs)
			hooks := make([]*rttCounter, leaseProcs)
			for i := range clients {
				clients[i], hooks[i] = redisClient(b, func(o *redis.Options) { o.PoolSize = redisParallelism / leaseProcs })
			}
			rule := core.Rule{Name: "round", Limit: leaseQuota, Window: 365 * 24 * time.Hour}
			var admitted, expired, rtt int64
			var elapsed time.Duration
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				prefix := fmt.Sprintf("bench-round-%d-%d:", time.Now().UnixNano(), n)
				ls := make([]*coreLimiter, leaseProcs)
				leases := make([]*redisstore.LeaseStore, leaseProcs)
				var rtt0 int64
				for i := range ls {
					var s core.Store
					s, leases[i] = leaseStore(b, clients[i], prefix, size)
					if m.cache {
						var err error
						if s, err = redisstore.NewRefusalCache(s, nil); err != nil {
							b.Fatal(err)
						}
					}
					ls[i] = leaseLimiter(b, s, rule)
					rtt0 += hooks[i].n.Load()
				}
				var got atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for g := range redisParallelism {
					wg.Go(func() {
						l := ls[g%leaseProcs]
						for range 2 * leaseQuota / redisParallelism {
							if l.Allow("k") {
								got.Add(1)
							}
						}
					})
				}
				wg.Wait()
				elapsed += time.Since(start)
				admitted += got.Load()
				for i := range ls {
					rtt += hooks[i].n.Load()
					if leases[i] != nil {
						expired += int64(leases[i].Stats().ExpiredUnits)
					}
					if n, err := ls[i].Failures(); n > 0 {
						b.Fatalf("%d decisions failed: %v", n, err)
					}
				}
				rtt -= rtt0
				if got.Load() > leaseQuota {
					b.Fatalf("admitted %d, above the quota %d", got.Load(), leaseQuota)
				}
			}
			b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
			b.ReportMetric(float64(expired)/float64(b.N), "expired/op")
			b.ReportMetric(float64(rtt)/float64(b.N), "rtt/op")
			b.ReportMetric(float64(b.N*2*leaseQuota)/elapsed.Seconds(), "decisions/s")
		})
	}
}

// BenchmarkRefusedKey hammers a key its quota refuses, from 64 goroutines:
// with the Redis store alone ("exact") and behind a RefusalCache ("cache"),
// which answers without a round trip until the refusal's RetryAfter.
func BenchmarkRefusedKey(b *testing.B) {
	for _, cached := range []bool{false, true} {
		name := "exact"
		if cached {
			name = "cache"
		}
		b.Run(name, func(b *testing.B) {
			c, h := redisClient(b, nil)
			var s core.Store
			s, _ = leaseStore(b, c, "bench-refused:", 0)
			var cache *redisstore.RefusalCache
			if cached {
				var err error
				if cache, err = redisstore.NewRefusalCache(s, nil); err != nil {
					b.Fatal(err)
				}
				s = cache
			}
			l := leaseLimiter(b, s, core.Rule{Name: "refused", Limit: 1, Window: time.Hour})
			l.Allow("k")
			rtt0 := h.n.Load()
			var admitted atomic.Int64
			b.SetParallelism(max(1, redisParallelism/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if l.Allow("k") {
						admitted.Add(1)
					}
				}
			})
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(h.n.Load()-rtt0)*1000/float64(b.N), "rtt/1k")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			if cache != nil {
				st := cache.Stats()
				b.ReportMetric(float64(st.Hits)*100/float64(st.Hits+st.Misses), "hit-%")
			}
			if n, err := l.Failures(); n > 0 || admitted.Load() > 0 {
				b.Fatalf("%d admitted beyond the quota; %d failed: %v", admitted.Load(), n, err)
			}
		})
	}
}
