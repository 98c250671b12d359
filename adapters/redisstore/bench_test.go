package redisstore

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Benchmarks run against a private local redis-server (loopback, one
// connection per goroutine). Each reports cmds/op: the Redis commands
// executed per decision, from INFO commandstats (the EVALSHA and the
// commands the script runs: TIME, GET, SET for a bucket).

// serverStats returns the total calls of every command but INFO, and the
// microseconds the server spent in scripts (EVALSHA and EVAL, including
// the commands they ran).
func serverStats(b *testing.B, c redis.UniversalClient) (calls, scriptMicros int64) {
	b.Helper()
	stats, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for k, v := range redistest.ParseInfo(stats) {
		if !strings.HasPrefix(k, "cmdstat_") || k == "cmdstat_info" {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if s, ok := strings.CutPrefix(f, "calls="); ok {
				x, _ := strconv.ParseInt(s, 10, 64)
				calls += x
			}
			if s, ok := strings.CutPrefix(f, "usec="); ok && (k == "cmdstat_evalsha" || k == "cmdstat_eval") {
				x, _ := strconv.ParseInt(s, 10, 64)
				scriptMicros += x
			}
		}
	}
	return calls, scriptMicros
}

// serverMeter reports cmds/op and server-us/op (Redis CPU in the script
// per decision) over a benchmark's loop.
type serverMeter struct {
	b             *testing.B
	c             redis.UniversalClient
	calls, micros int64
}

func startMeter(b *testing.B, c redis.UniversalClient) *serverMeter {
	m := &serverMeter{b: b, c: c}
	m.calls, m.micros = serverStats(b, c)
	return m
}

func (m *serverMeter) report() {
	calls, micros := serverStats(m.b, m.c)
	n := float64(m.b.N)
	m.b.ReportMetric(float64(calls-m.calls)/n, "cmds/op")
	m.b.ReportMetric(float64(micros-m.micros)/n, "server-us/op")
}

func benchStore(b *testing.B, cfg *Config) (*Store, *redis.Client) {
	b.Helper()
	srv := redistest.Start(b)
	client := newClient(b, srv.Addr(), func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.PoolSize = 128
	})
	return newStore(b, client, cfg), client
}

func benchPolicy(b *testing.B, a core.Algorithm) *core.Policy {
	// A quota too large to run out: every decision charges and writes.
	limit := int64(1 << 40)
	if a == core.SlidingWindowCounter {
		limit = 1<<31 - 1
	}
	return mustPolicy(b, withBurst(core.Rule{Name: "bench-" + a.Name(), Algorithm: a, Limit: limit, Window: time.Hour}))
}

// BenchmarkTake measures the latency of one decision (one round trip) per
// algorithm, in server-time mode.
func BenchmarkTake(b *testing.B) {
	for _, a := range core.Algorithms() {
		b.Run(a.Name(), func(b *testing.B) {
			s, client := benchStore(b, nil)
			p := benchPolicy(b, a)
			reqs := []core.Request{{Policy: p, Key: "203.0.113.7", Cost: 1}}
			var out [1]core.Decision
			ctx := context.Background()
			if a == core.SlidingWindowLog {
				// One entry per instant: keep the log short.
				reqs[0].Policy = mustPolicy(b, core.Rule{Name: "bench-log", Algorithm: a, Limit: 1 << 40, Window: time.Millisecond})
			}
			if err := s.Take(ctx, time.Now(), reqs, out[:]); err != nil {
				b.Fatal(err)
			}
			m := startMeter(b, client)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := s.Take(ctx, time.Time{}, reqs, out[:]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			m.report()
		})
	}
}

// BenchmarkTakeBatch measures a layered batch of three requests (per IP,
// per user, per route) in one script call.
func BenchmarkTakeBatch(b *testing.B) {
	s, client := benchStore(b, nil)
	ip := mustPolicy(b, core.Rule{Name: "ip", Limit: 1 << 40, Window: time.Hour})
	user := mustPolicy(b, core.Rule{Name: "user", Limit: 1 << 40, Window: time.Hour})
	route := mustPolicy(b, core.Rule{Name: "route", Algorithm: core.SlidingWindowCounter, Limit: 1 << 31, Window: time.Hour})
	reqs := []core.Request{{Policy: ip, Key: "203.0.113.7", Cost: 1}, {Policy: user, Key: "alice", Cost: 1}, {Policy: route, Key: "GET /", Cost: 1}}
	var out [3]core.Decision
	ctx := context.Background()
	m := startMeter(b, client)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Take(ctx, time.Time{}, reqs, out[:]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	m.report()
}

// BenchmarkTakeParallel measures throughput with about 64 goroutines
// deciding at once, on one hot key and spread over 10,000 keys; ns/op is
// the inverse of the throughput, also reported as decisions/s.
func BenchmarkTakeParallel(b *testing.B) {
	for _, keys := range []int{1, 10_000} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			s, client := benchStore(b, nil)
			p := benchPolicy(b, core.TokenBucket)
			names := make([]string, keys)
			for i := range names {
				names[i] = "client-" + strconv.Itoa(i)
			}
			var seq atomic.Int64
			m := startMeter(b, client)
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var out [1]core.Decision
				reqs := []core.Request{{Policy: p, Cost: 1}}
				ctx := context.Background()
				for pb.Next() {
					reqs[0].Key = names[int(seq.Add(1))%keys]
					if err := s.Take(ctx, time.Time{}, reqs, out[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			elapsed := time.Since(start)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			m.report()
		})
	}
}
