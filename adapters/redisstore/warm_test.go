package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
