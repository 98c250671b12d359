package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// coldBurst sends 1,000 concurrent decisions to a store built a moment
// before, with the package's default breaker and the given Timeout, and
// returns how many failed, the breaker's state after, and what the burst
// cost the server for lack of warm-up: the connections it accepted and the
// NOSCRIPT replies it sent during the burst.
func coldBurst(t *testing.T, addr string, warm bool, timeout time.Duration) (failed int64, st BreakerState, dials, noscript int64) {
	t.Helper()
	stats := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	t.Cleanup(func() { stats.Close() })
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 2})
	t.Cleanup(func() { client.Close() })
	s, err := New(client, &Config{Prefix: uniquePrefix(t), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if warm {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dials0, noscript0 := serverCounts(t, stats)
	p := mustPolicy(t, core.Rule{Name: "burst", Limit: 1 << 20, Window: time.Hour})
	var nfailed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var out [1]core.Decision
			if err := s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
				if nfailed.Add(1) == 1 {
					t.Logf("first failure: %v", err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	dials1, noscript1 := serverCounts(t, stats)
	return nfailed.Load(), s.State(), dials1 - dials0, noscript1 - noscript0
}

// serverCounts returns the connections the server has accepted and the
// NOSCRIPT errors it has replied, from INFO (over c, whose one connection
// is already counted after the first call).
func serverCounts(t *testing.T, c *redis.Client) (conns, noscript int64) {
	t.Helper()
	info, err := c.Info(context.Background(), "stats", "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	conns = -1
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			conns, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "errorstat_NOSCRIPT:count="); ok {
			noscript, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if conns < 0 {
		t.Fatalf("no total_connections_received in INFO:\n%s", info)
	}
	return conns, noscript
}

// TestColdBurst sends 1,000 concurrent decisions right after a store is
// built and warmed (Warm) on a freshly started Redis, whose script cache
// is empty: no decision fails, the breaker stays closed, and the burst
// pays nothing for warm-up: the server accepts no connection (Warm opened
// the pool) and replies no NOSCRIPT (Warm loaded the script). These are
// counted by the server, not timed: the decisions run with a Timeout that
// a loaded test machine cannot exceed, so a failure can only mean a
// decision that needed warm-up. The same burst without Warm must show
// both costs, so the counts do see a cold store.
func TestColdBurst(t *testing.T) {
	for round := 0; round < 3; round++ {
		failed, st, dials, noscript := coldBurst(t, redistest.Server(t), true, 10*time.Second)
		if failed != 0 || st != BreakerClosed || dials != 0 || noscript != 0 {
			t.Fatalf("round %d after Warm: %d of 1000 decisions failed, breaker %v, %d connections dialled and %d NOSCRIPT replies during the burst; want none",
				round, failed, st, dials, noscript)
		}
	}
	failed, st, dials, noscript := coldBurst(t, redistest.Server(t), false, 10*time.Second)
	if dials == 0 || noscript == 0 {
		t.Fatalf("without Warm: %d connections dialled and %d NOSCRIPT replies during the burst, want some of each", dials, noscript)
	}
	t.Logf("without Warm: %d of 1000 failed, breaker %v, %d connections dialled, %d NOSCRIPT replies", failed, st, dials, noscript)
	// With the default Timeout, report what happens (it depends on the
	// machine's load).
	failed, st, dials, noscript = coldBurst(t, redistest.Server(t), false, 0)
	t.Logf("without Warm, default Timeout: %d of 1000 failed, breaker %v, %d connections dialled, %d NOSCRIPT replies", failed, st, dials, noscript)
}

// slowScripts delays every script call by d, as a loaded Redis would.
type slowScripts struct{ d time.Duration }

func (slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}
func (slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestPacingByMaxActiveConns: a client that may hold fewer connections
// (MaxActiveConns) than its PoolSize, where go-redis fails a call beyond
// them at once ("connection pool exhausted"): Warm opens that many, and a
// burst on a slow but healthy Redis is paced by them, every decision
// answered and the breaker closed.
func TestPacingByMaxActiveConns(t *testing.T) {
	client := newClient(t, redistest.Server(t), func(o *redis.Options) {
		o.PoolSize = 16
		o.MaxActiveConns = 2
		o.ContextTimeoutEnabled = true
	})
	client.AddHook(slowScripts{2 * time.Millisecond})
	s := newStore(t, client, &Config{ClientTime: true, Timeout: 10 * time.Second})
	if err := s.Warm(context.Background()); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	p := mustPolicy(t, core.Rule{Name: "paced", Algorithm: core.FixedWindow, Limit: 1000, Window: time.Hour})
	var mu sync.Mutex
	var errs []error
	hammer(t, 16, 4, func(w, i int) bool {
		_, err := takeOne(s, context.Background(), p, "k")
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return err == nil
	})
	if len(errs) > 0 || s.State() != BreakerClosed {
		t.Fatalf("%d of 64 decisions failed on a healthy Redis (breaker %v): %v", len(errs), s.State(), errs)
	}
}

// TestWarmBoundedByContext checks that Warm returns when its context ends
// on a Redis that hangs (a stopped process), also through a client
// without ContextTimeoutEnabled, whose reads go-redis bounds only by its
// ReadTimeout (3 s by default): the warm-up is abandoned, as decisions'
// calls are, and Close waits for it once Redis answers again.
func TestWarmBoundedByContext(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s, err := New(client, &Config{Prefix: uniquePrefix(t), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(srv.Pid(), syscall.SIGCONT)
		}
	}()
	// Dials succeed (the kernel accepts them); the PINGs get no answer.
	client.Close()
	client = redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4, MaxRetries: -1})
	s, err = New(client, &Config{Prefix: uniquePrefix(t), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Warm(ctx)
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("Warm on a hung Redis with a 200ms deadline: %v after %v, want an error at the deadline", err, took)
	}
	syscall.Kill(srv.Pid(), syscall.SIGCONT)
	stopped = false
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the abandoned warm-up: %v", err)
	}
}
