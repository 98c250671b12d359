package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// The examples talk to the Redis server at redisAddr (a Cluster seed at
// clusterAddrs). TestMain points redisAddr at a private server (or
// REDIS_ADDR's), and TestExamples runs the Cluster example against a
// private Cluster.
var (
	redisAddr    = "localhost:6379"
	clusterAddrs = []string{"localhost:7000", "localhost:7001", "localhost:7002"}
)

// A Limiter whose quota lives in Redis: every process using the same Redis
// and Prefix shares it. The store reads Redis's clock, so the Limiter's
// clock does not matter.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "example:"})
	if err != nil {
		panic(err)
	}
	// Load the script and open the connections before serving.
	if err := store.Warm(context.Background()); err != nil {
		fmt.Println("Redis unavailable:", err)
		return
	}
	limiter, err := core.New(core.Rule{Name: "api", Limit: 3, Window: time.Minute}, core.WithStore(store))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		d, err := limiter.Allow(ctx, "203.0.113.7")
		if err != nil {
			fmt.Println("Redis unavailable:", err) // apply your fail policy
			return
		}
		fmt.Printf("allowed=%v remaining=%d retry-after>0=%v\n", d.Allowed, d.Remaining, d.RetryAfter > 0)
	}
	// Output:
	// allowed=true remaining=2 retry-after>0=false
	// allowed=true remaining=1 retry-after>0=false
	// allowed=true remaining=0 retry-after>0=false
	// allowed=false remaining=0 retry-after>0=true
}

// A layered batch (per IP and per user) decided in one atomic script call:
// the refused third request charges neither layer.
func Example_layered() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "example-layered:"})
	if err != nil {
		panic(err)
	}
	if err := store.Warm(context.Background()); err != nil {
		panic(err)
	}
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	perUser := core.MustPolicy(core.Rule{Name: "per-user", Limit: 2, Window: time.Minute})
	limiter := core.Must(core.NewWithPolicy(nil, core.WithStore(store)))
	var out [2]core.Decision
	for i := 0; i < 3; i++ {
		ok, err := limiter.Take(context.Background(), []core.Request{
			{Policy: perIP, Key: "203.0.113.7", Cost: 1},
			{Policy: perUser, Key: "alice", Cost: 1},
		}, out[:])
		if err != nil {
			panic(err)
		}
		fmt.Printf("admitted=%v per-ip remaining=%d per-user allowed=%v\n", ok, out[0].Remaining, out[1].Allowed)
	}
	// Output:
	// admitted=true per-ip remaining=9 per-user allowed=true
	// admitted=true per-ip remaining=8 per-user allowed=true
	// admitted=false per-ip remaining=8 per-user allowed=false
}

// On a Redis Cluster, TagByKey puts every policy's state of one key in
// one hash slot, so a client IP limited per second and per hour is decided
// in one atomic call. Batches spanning slots are still decided correctly,
// in two or three round trips (see the package documentation).
func Example_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs, ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{
		Prefix:  "example-cluster:",
		HashTag: redisstore.TagByKey,
		Timeout: 250 * time.Millisecond, // spread batches take two round trips
	})
	if err != nil {
		panic(err)
	}
	if err := store.Warm(context.Background()); err != nil {
		panic(err)
	}
	perSecond := core.MustPolicy(core.Rule{Name: "ip-burst", Limit: 2, Window: time.Second})
	perHour := core.MustPolicy(core.Rule{Name: "ip-hour", Limit: 1000, Window: time.Hour})
	var out [2]core.Decision
	for i := 0; i < 3; i++ {
		err := store.Take(context.Background(), time.Now(), []core.Request{
			{Policy: perSecond, Key: "198.51.100.4", Cost: 1},
			{Policy: perHour, Key: "198.51.100.4", Cost: 1},
		}, out[:])
		if err != nil {
			panic(err)
		}
		fmt.Printf("burst allowed=%v, hour remaining=%d\n", out[0].Allowed, out[1].Remaining)
	}
}

// With a Fallback, a Store whose Redis is unreachable decides locally
// instead of failing: each instance then enforces the quota on its own.
// The breaker stops trying Redis after two failures, for a minute.
func Example_fallback() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialerRetries: 1}) // nothing listens there
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{
		Timeout:  20 * time.Millisecond,
		Fallback: core.MustMemoryStore(nil),
		Breaker:  &redisstore.BreakerConfig{Failures: 2, OpenFor: time.Minute},
	})
	if err != nil {
		panic(err)
	}
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 2, Window: time.Minute})
	var out [1]core.Decision
	for i := 0; i < 3; i++ {
		err := store.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
		fmt.Printf("err=%v allowed=%v breaker=%v\n", err, out[0].Allowed, store.State())
	}
	// Output:
	// err=<nil> allowed=true breaker=closed
	// err=<nil> allowed=true breaker=open
	// err=<nil> allowed=false breaker=open
}

// By default, the decisions of concurrent requests share round trips to
// Redis while it is busy. A positive Config.Pipeline makes them share
// always: here 100 goroutines decide through at most 2 calls in flight at
// once, and each decision is still exact. Config.Pipeline -1 sends each
// decision alone.
func ExampleConfig_pipeline() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "example:", Pipeline: 2})
	if err != nil {
		panic(err)
	}
	limiter, err := core.New(core.Rule{Name: "pipelined", Limit: 60, Window: time.Minute}, core.WithStore(store))
	if err != nil {
		panic(err)
	}
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := limiter.Allow(context.Background(), "203.0.113.9")
			switch {
			case err != nil:
				fmt.Println("Redis unavailable:", err)
			case d.Allowed:
				allowed.Add(1)
			default:
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Println("allowed:", allowed.Load(), "refused:", refused.Load())
	// Output:
	// allowed: 60 refused: 40
}

// OnStateChange reports the breaker's transitions, for logs and alerts.
func ExampleConfig_onStateChange() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialerRetries: 1})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{
		Timeout: 20 * time.Millisecond,
		Breaker: &redisstore.BreakerConfig{Failures: 1},
		OnStateChange: func(from, to redisstore.BreakerState) {
			fmt.Printf("redis breaker: %v -> %v\n", from, to)
		},
	})
	if err != nil {
		panic(err)
	}
	p := core.MustPolicy(core.PerSecond(10))
	var out [1]core.Decision
	err = store.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	fmt.Println(err != nil)
	// Output:
	// redis breaker: closed -> open
	// true
}

// TagByKey as a Config.HashTag.
func ExampleTagByKey() {
	fmt.Println(redisstore.TagByKey("per-ip", "203.0.113.7"))
	// Output: 203.0.113.7
}

// A decision whose caller has gone (its context canceled, say, because the
// HTTP client disconnected) fails with an error that matches the context's
// and IsCallerGone: not a Redis failure, so it never opens the breaker.
func ExampleIsCallerGone() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // not contacted
	defer client.Close()
	store, err := redisstore.New(client, nil)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client went away
	p := core.MustPolicy(core.PerSecond(10))
	var out [1]core.Decision
	err = store.Take(ctx, time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	fmt.Println(errors.Is(err, context.Canceled), redisstore.IsCallerGone(err), store.State())
	// Output: true true closed
}
