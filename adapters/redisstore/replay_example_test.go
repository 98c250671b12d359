package redisstore_test

import (
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
)

// A fleet shares its limits and its idempotency keys through one Redis: a
// retry that reaches another process is still charged once.
func ExampleNewReplayStore() {
	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	store, err := redisstore.New(client, nil)
	if err != nil {
		panic(err)
	}
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithStore(store)))
	replays, err := redisstore.NewReplayStore(client, nil)
	if err != nil {
		panic(err)
	}
	idem, err := ratelimit.NewIdempotency(limiter, &ratelimit.IdempotencyConfig{Store: replays})
	if err != nil {
		panic(err)
	}
	http.Handle("POST /charge", idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
}
