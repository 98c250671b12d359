package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// prefixSeq makes every test's key prefix unique, so tests may share a
// server (REDIS_ADDR) without sharing state.
var prefixSeq atomic.Int64

func uniquePrefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return fmt.Sprintf("rltest:%d:%s:%d:", time.Now().UnixNano(), name, prefixSeq.Add(1))
}

// newClient returns a client of the server at addr, closed when t ends.
func newClient(t testing.TB, addr string, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, PoolSize: 64, MaxRetries: -1}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// newClusterClient returns a client of the cluster at addrs, closed when t
// ends.
func newClusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return c
}

// newStore returns a Store over client with a unique prefix, a generous
// Timeout unless cfg sets one, and the rest of cfg.
func newStore(t testing.TB, client redis.UniversalClient, cfg *Config) *Store {
	t.Helper()
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = uniquePrefix(t)
	}
	if c.Timeout == 0 {
		// Tests of decisions must not fail on a slow moment of a loaded
		// test machine; the fault tests set the timeout they test.
		c.Timeout = 10 * time.Second
	}
	s, err := New(client, &c)
	if err != nil {
		t.Fatal(err)
	}
	if testTakeScript != nil {
		s.script = testTakeScript
	}
	return s
}

func mustPolicy(t testing.TB, r core.Rule) *core.Policy {
	t.Helper()
	p, err := core.NewPolicy(r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// take decides one request.
func take(t testing.TB, s core.Store, at time.Time, p *core.Policy, key string, cost int64) core.Decision {
	t.Helper()
	var out [1]core.Decision
	if err := s.Take(context.Background(), at, []core.Request{{Policy: p, Key: key, Cost: cost}}, out[:]); err != nil {
		t.Fatalf("Take(%s, %q, %d): %v", p.Name(), key, cost, err)
	}
	return out[0]
}

var _ = redistest.Server

// hammer runs workers goroutines each calling f each times, and returns how
// many calls reported an admission.
func hammer(t testing.TB, workers, each int, f func(w, i int) bool) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if f(w, i) {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(admitted.Load())
}
