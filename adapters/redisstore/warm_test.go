package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// coldBurst sends 1,000 concurrent decisions to a store built a moment
// before, with the package's default Timeout and breaker, and returns how
// many failed and the breaker's state after.
func coldBurst(t *testing.T, addr string, warm bool) (int64, BreakerState) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 2})
	t.Cleanup(func() { client.Close() })
	s, err := New(client, &Config{Prefix: uniquePrefix(t)})
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
	p := mustPolicy(t, core.Rule{Name: "burst", Limit: 1 << 20, Window: time.Hour})
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var out [1]core.Decision
			if err := s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
				if failed.Add(1) == 1 {
					t.Logf("first failure: %v", err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	return failed.Load(), s.State()
}

// TestColdBurst sends 1,000 concurrent decisions right after a store is
// built and warmed (Warm) on a freshly started Redis, whose script cache
// is empty: none may fail and the breaker stays closed.
func TestColdBurst(t *testing.T) {
	for round := 0; round < 3; round++ {
		addr := redistest.Server(t)
		failed, st := coldBurst(t, addr, true)
		if failed != 0 || st != BreakerClosed {
			t.Fatalf("round %d: %d of 1000 decisions failed after Warm, breaker %v", round, failed, st)
		}
	}
	// Without Warm, report what happens (it depends on the machine's load).
	failed, st := coldBurst(t, redistest.Server(t), false)
	t.Logf("without Warm: %d of 1000 failed, breaker %v", failed, st)
}
