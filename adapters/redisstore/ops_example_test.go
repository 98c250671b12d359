package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// exampleOps returns a Limiter over a Redis store with its own prefix, and
// a function that releases it.
func exampleOps(prefix string, rule core.Rule) (*core.Limiter, func(), error) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	store, err := redisstore.New(client, &redisstore.Config{Prefix: fmt.Sprintf("%s%d:", prefix, time.Now().UnixNano()), Timeout: time.Second})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	l, err := core.New(rule, core.WithStore(store))
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return l, func() { store.Close(); client.Close() }, nil
}

// Refund gives back what a request was charged, in Redis as in memory:
// here a failed login is counted and a successful one is not.
func ExampleStore_Refund() {
	l, done, err := exampleOps("example-refund:", core.Rule{Name: "login", Algorithm: core.FixedWindow, Limit: 5, Window: 15 * time.Minute})
	if err != nil {
		panic(err)
	}
	defer done()
	ctx := context.Background()
	for _, ok := range []bool{true, false, true} {
		d, err := l.Allow(ctx, "alice")
		if err != nil {
			fmt.Println("Redis unavailable:", err) // apply your fail policy
			return
		}
		if ok { // a successful login: not counted
			if err := l.Refund(ctx, []core.Request{{Policy: l.Policy(), Key: "alice", Cost: 1}}); err != nil {
				fmt.Println("refund failed:", err)
				return
			}
		}
		fmt.Println("login ok:", ok, "remaining after the charge:", d.Remaining)
	}
}

// Peek reports the decision a request would get from Redis, charging
// nothing.
func ExampleStore_Peek() {
	l, done, err := exampleOps("example-peek:", core.PerMinute(3).Named("api"))
	if err != nil {
		panic(err)
	}
	defer done()
	ctx := context.Background()
	out := make([]core.Decision, 1)
	for i := 0; i < 2; i++ {
		ok, err := l.Peek(ctx, []core.Request{{Policy: l.Policy(), Key: "alice", Cost: 3}}, out)
		if err != nil {
			fmt.Println("Redis unavailable:", err)
			return
		}
		fmt.Println("3 would be admitted:", ok)
	}
}

// Reset forgets a key in Redis: its next request finds the quota whole.
func ExampleStore_Reset() {
	l, done, err := exampleOps("example-reset:", core.PerHour(1).Named("login"))
	if err != nil {
		panic(err)
	}
	defer done()
	ctx := context.Background()
	l.Allow(ctx, "alice")
	d, _ := l.Allow(ctx, "alice")
	fmt.Println("before:", d.Allowed)
	if err := l.Reset(ctx, nil, "alice"); err != nil {
		fmt.Println("Redis unavailable:", err)
		return
	}
	d, _ = l.Allow(ctx, "alice")
	fmt.Println("after a reset:", d.Allowed)
}
