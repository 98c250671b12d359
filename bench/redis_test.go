package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	httprateredis "github.com/go-chi/httprate-redis"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// TestMain stops the private redis-server, if a benchmark started one.
func TestMain(m *testing.M) {
	code := m.Run()
	stopRedis()
	os.Exit(code)
}

// A private redis-server, started on first use by the Redis benchmarks:
// internal/redistest is not importable from this module, so this is a
// minimal equivalent.
var (
	redisOnce sync.Once
	redisCmd  *exec.Cmd
	redisAddr string
	redisErr  error
)

func startRedis() {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		redisErr = err
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		redisErr = err
		return
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	redisAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	redisCmd = exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "yes")
	if err := redisCmd.Start(); err != nil {
		redisErr = err
		return
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			redisErr = fmt.Errorf("redis-server on %s did not answer PING: %w", redisAddr, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stopRedis() {
	if redisCmd != nil && redisCmd.Process != nil {
		redisCmd.Process.Kill()
		redisCmd.Wait()
	}
}

// redisParallelism is the number of goroutines of the parallel Redis
// workloads.
const redisParallelism = 64

// rttCounter is a go-redis hook counting round trips: one per command
// sent alone, one per pipeline or transaction.
type rttCounter struct{ n atomic.Int64 }

func (h *rttCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rttCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !bookkeeping(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *rttCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !bookkeeping(cmd) {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// bookkeeping reports commands that are not part of a decision: connection
// set-up and the benchmark's own INFO.
func bookkeeping(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client", "auth", "select", "ping", "info", "flushall":
		return true
	}
	return false
}

// redisClient returns a client of the private server, shared settings for
// every peer: a pool of redisParallelism connections, no retries. The
// server is flushed first (it is ours alone).
//
// The client honours context deadlines (ContextTimeoutEnabled), as
// adapters/redisstore's documentation configures it; the peers pass
// contexts without deadlines, so it changes nothing for them. opts, if
// set, adjusts the options.
func redisClient(b *testing.B, opts func(*redis.Options)) (*redis.Client, *rttCounter) {
	redisOnce.Do(startRedis)
	if redisErr != nil {
		b.Skip("no redis-server: ", redisErr)
	}
	o := &redis.Options{
		Addr:                  redisAddr,
		PoolSize:              redisParallelism,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	}
	if opts != nil {
		opts(o)
	}
	c := redis.NewClient(o)
	b.Cleanup(func() { c.Close() })
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	h := &rttCounter{}
	c.AddHook(h)
	return c, h
}

// serverStats returns the total calls of INFO commandstats (commands run
// inside scripts included, less the bookkeeping ones: INFO itself,
// connection set-up, PING, FLUSHALL, SCRIPT), the server's CPU time (INFO
// cpu, user plus system) in seconds, and the time the server spent running
// scripts (commandstats' usec of EVAL and EVALSHA, the commands they run
// included) in microseconds.
func serverStats(b *testing.B, c *redis.Client) (calls int64, cpu float64, script int64) {
	info, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				b.Fatalf("INFO cpu line %q: %v", line, err)
			}
			cpu += v
			continue
		}
		if !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		cmd, _, _ := strings.Cut(strings.TrimPrefix(name, "cmdstat_"), "|")
		switch cmd {
		case "info", "hello", "client", "ping", "select", "flushall", "script", "command":
			continue
		}
		n, more, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		calls += v
		if cmd == "eval" || cmd == "evalsha" {
			u, _, _ := strings.Cut(strings.TrimPrefix(more, "usec="), ",")
			us, err := strconv.ParseInt(u, 10, 64)
			if err != nil {
				b.Fatalf("commandstats line %q: %v", line, err)
			}
			script += us
		}
	}
	return calls, cpu, script
}

// redisPeer is one Redis-backed limiter built on a shared client.
type redisPeer struct {
	name string
	// opts, if set, adjusts the shared client options for this peer.
	opts func(*redis.Options)
	new  func(b *testing.B, c *redis.Client) limiter
	// sequentialOnly leaves the peer out of the 64-way workloads, to keep
	// their run short: it is measured by BenchmarkRedis alone.
	sequentialOnly bool
}

func redisPeers() []redisPeer {
	return append(ourRedisPeers(),
		redisPeer{
			name: "redis_rate",
			new: func(_ *testing.B, c *redis.Client) limiter {
				return redisRate{l: redis_rate.NewLimiter(c), lim: redis_rate.Limit{Rate: quotaLimit, Burst: quotaLimit, Period: quotaWindow}}
			},
		},
		redisPeer{
			name: "ulule",
			new: func(b *testing.B, c *redis.Client) limiter {
				s, err := ulredis.NewStore(c)
				if err != nil {
					b.Fatal(err)
				}
				return &ululeLimiter{l: ulule.New(s, ulule.Rate{Period: quotaWindow, Limit: quotaLimit})}
			},
		},
		redisPeer{
			name:           "httprate-redis",
			sequentialOnly: true,
			new: func(_ *testing.B, c *redis.Client) limiter {
				counter := httprateredis.NewCounter(&httprateredis.Config{Client: c, FallbackDisabled: true, WindowLength: quotaWindow})
				return &httprateLimiter{rl: httprate.NewRateLimiter(quotaLimit, quotaWindow,
					httprate.WithLimitCounter(counter), httprate.WithResponseHeaders(httprate.ResponseHeaders{}))}
			},
		},
	)
}

type redisRate struct {
	l   *redis_rate.Limiter
	lim redis_rate.Limit
}

func (r redisRate) Allow(key string) bool {
	res, err := r.l.Allow(context.Background(), key, r.lim)
	return err == nil && res.Allowed > 0
}

// redisKeys is the number of keys the sequential Redis workload cycles
// through.
const redisKeys = 10_000

func forEachRedisPeer(b *testing.B, f func(b *testing.B, l limiter, c *redis.Client, h *rttCounter)) {
	for _, p := range redisPeers() {
		b.Run(p.name, func(b *testing.B) {
			c, h := redisClient(b, p.opts)
			l := p.new(b, c)
			defer closeLimiter(l)
			f(b, l, c, h)
		})
	}
}

// reportRedis reports per decision the commands ("cmds/op", INFO
// commandstats), the round trips ("rtt/op", counted by a client hook), the
// redis-server CPU time in microseconds ("srv-us/op", INFO cpu: script
// execution, command parsing and socket I/O) and, of it, the time spent
// running the peer's script ("script-us/op", commandstats).
func reportRedis(b *testing.B, c *redis.Client, calls0 int64, cpu0 float64, script0, rtt int64) {
	b.StopTimer()
	calls, cpu, script := serverStats(b, c)
	b.ReportMetric(float64(calls-calls0)/float64(b.N), "cmds/op")
	b.ReportMetric(float64(rtt)/float64(b.N), "rtt/op")
	b.ReportMetric((cpu-cpu0)*1e6/float64(b.N), "srv-us/op")
	b.ReportMetric(float64(script-script0)/float64(b.N), "script-us/op")
}

// BenchmarkRedis decides redisKeys keys in turn, one decision at a time:
// the latency of a decision against a local redis-server.
func BenchmarkRedis(b *testing.B) {
	ks := keys(redisKeys)
	forEachRedisPeer(b, func(b *testing.B, l limiter, c *redis.Client, h *rttCounter) {
		for _, k := range ks[:100] {
			if !l.Allow(k) {
				b.Fatal("warm-up decision refused", failures(l))
			}
		}
		calls0, cpu0, script0 := serverStats(b, c)
		rtt0 := h.n.Load()
		b.ReportAllocs()
		b.ResetTimer()
		refused := 0
		for i := 0; i < b.N; i++ {
			if !l.Allow(ks[i%redisKeys]) {
				refused++
			}
		}
		reportRedis(b, c, calls0, cpu0, script0, h.n.Load()-rtt0)
		if refused > 0 {
			b.Fatalf("%d of %d decisions refused (or failed)%s", refused, b.N, failures(l))
		}
	})
}

// BenchmarkRedisHotKeyParallel64 decides one key from 64 goroutines and
// reports decisions per second: every decision updates the same record.
func BenchmarkRedisHotKeyParallel64(b *testing.B) {
	benchRedisParallel64(b, keys(1))
}

// BenchmarkRedisKeys100kParallel64 decides 100,000 keys from 64
// goroutines, in a scattered order, and reports decisions per second.
func BenchmarkRedisKeys100kParallel64(b *testing.B) {
	benchRedisParallel64(b, keys(100_000))
}

// benchRedisParallel64 decides the keys ks from redisParallelism
// goroutines with every peer not marked sequentialOnly.
func benchRedisParallel64(b *testing.B, ks []string) {
	n := uint64(len(ks))
	for _, p := range redisPeers() {
		if p.sequentialOnly {
			continue
		}
		b.Run(p.name, func(b *testing.B) {
			c, h := redisClient(b, p.opts)
			l := p.new(b, c)
			defer closeLimiter(l)
			// Warm up: every connection of the pool dialled first, outside
			// any limiter (a cold 64-way burst on a loaded machine can
			// exceed a store's own timeout while dialling), then every
			// limiter's scripts loaded.
			var wg sync.WaitGroup
			for range redisParallelism {
				wg.Go(func() { c.Ping(context.Background()) })
			}
			wg.Wait()
			for g := range redisParallelism {
				wg.Go(func() {
					for j := range 10 {
						l.Allow(ks[uint64(g*10+j)%n])
					}
				})
			}
			wg.Wait()
			calls0, cpu0, script0 := serverStats(b, c)
			rtt0 := h.n.Load()
			var seq atomic.Uint64
			var refused atomic.Int64
			b.SetParallelism(max(1, redisParallelism/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := seq.Add(7919) * 104729
				for pb.Next() {
					i += 7919
					if !l.Allow(ks[i%n]) {
						refused.Add(1)
					}
				}
			})
			elapsed := time.Since(start)
			reportRedis(b, c, calls0, cpu0, script0, h.n.Load()-rtt0)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			if n := refused.Load(); n > 0 {
				b.Fatalf("%d of %d decisions refused (or failed)%s", n, b.N, failures(l))
			}
		})
	}
}
