package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
)

// calls counts the batches its Store decides: the round trips a Redis
// store would make. The examples run over a core.MemoryStore so that they
// need no server; in production the backend is a *redisstore.Store.
type calls struct {
	core.Store
	n atomic.Int64
}

func (c *calls) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	c.n.Add(1)
	return c.Store.Take(ctx, now, reqs, out)
}

// A hot key leases 10 units at a time: 100 decisions cost the backend 10
// calls instead of 100, and never more than the quota is admitted.
func ExampleNewLeaseStore() {
	backend := &calls{Store: core.MustMemoryStore(nil)}
	leases, err := redisstore.NewLeaseStore(backend, &redisstore.LeaseConfig{
		Size:         10,          // units per lease
		MaxAge:       time.Second, // a lease is spent within a second or lost
		HotThreshold: 1,           // every key is hot (the default is 10 per second)
	})
	if err != nil {
		panic(err)
	}
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	limiter, err := core.New(core.Rule{Name: "api", Limit: 100, Window: time.Hour},
		core.WithStore(leases), core.WithClock(clock))
	if err != nil {
		panic(err)
	}
	admitted := 0
	for i := 0; i < 100; i++ {
		d, err := limiter.Allow(context.Background(), "tenant-1")
		if err != nil {
			panic(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	st := leases.Stats()
	fmt.Printf("admitted %d in %d backend calls (%d leases, %d decided locally)\n", admitted, backend.n.Load(), st.Leases, st.Local)
	d, _ := limiter.Allow(context.Background(), "tenant-1")
	fmt.Println("101st allowed:", d.Allowed)
	// Output:
	// admitted 100 in 10 backend calls (10 leases, 90 decided locally)
	// 101st allowed: false
}

// A RefusalCache in front of the LeaseStore: once the backend refuses a
// key, the key is refused locally until the backend's RetryAfter has
// passed, so a client hammering it costs the backend nothing.
func ExampleNewRefusalCache() {
	backend := &calls{Store: core.MustMemoryStore(nil)}
	leases, err := redisstore.NewLeaseStore(backend, &redisstore.LeaseConfig{Size: 10, HotThreshold: 1})
	if err != nil {
		panic(err)
	}
	cache, err := redisstore.NewRefusalCache(leases, &redisstore.RefusalCacheConfig{MaxKeys: 10000})
	if err != nil {
		panic(err)
	}
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	limiter, err := core.New(core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 100, Window: time.Minute},
		core.WithStore(cache), core.WithClock(clock))
	if err != nil {
		panic(err)
	}
	admitted := 0
	var last core.Decision
	for i := 0; i < 1000; i++ {
		last, err = limiter.Allow(context.Background(), "tenant-1")
		if err != nil {
			panic(err)
		}
		if last.Allowed {
			admitted++
		}
	}
	st := cache.Stats()
	fmt.Printf("admitted %d of 1000 in %d backend calls\n", admitted, backend.n.Load())
	fmt.Printf("refusal cache: %d hits, %d misses\n", st.Hits, st.Misses)
	fmt.Println("retry after:", last.RetryAfter)

	clock.Advance(time.Minute) // the refusal has ended: a new window
	d, _ := limiter.Allow(context.Background(), "tenant-1")
	fmt.Println("a minute later allowed:", d.Allowed)
	// Output:
	// admitted 100 of 1000 in 12 backend calls
	// refusal cache: 899 hits, 101 misses
	// retry after: 1m0s
	// a minute later allowed: true
}

// The decorators wired over Redis, outermost first: the refusal cache,
// then the leases, then the Redis store.
func ExampleLeaseStore_redis() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "example-lease:", Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	leases, err := redisstore.NewLeaseStore(store, &redisstore.LeaseConfig{Size: 20, MaxAge: 500 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	cache, err := redisstore.NewRefusalCache(leases, nil)
	if err != nil {
		panic(err)
	}
	limiter, err := core.New(core.PerSecond(1000).Named("api"), core.WithStore(cache))
	if err != nil {
		panic(err)
	}
	d, err := limiter.Allow(context.Background(), "tenant-1")
	if err != nil {
		fmt.Println("Redis unavailable:", err) // apply your fail policy
		return
	}
	fmt.Printf("allowed=%v backend calls=%d cache misses=%d\n", d.Allowed, leases.Stats().BackendCalls, cache.Stats().Misses)
}
