package bench

import (
	"testing"

	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// ourRedisPeers returns the rows of our Redis store (adapters/redisstore)
// behind core.Limiter.Allow, with the store's defaults (server time, 50 ms
// timeout, circuit breaker, adaptive pipelining): "ratelimit" (token
// bucket) and "ratelimit-fixedwindow" (fixed window, the same quota) on the
// shared client, configured as the package documentation shows
// (ContextTimeoutEnabled); "ratelimit-alone" and
// "ratelimit-fixedwindow-alone", the same with Config.Pipeline -1 (each
// decision sent alone); and "ratelimit-noctxtimeout" (token bucket) on
// a client left at go-redis's default, where the store runs each call in
// a goroutine of its own to bound it by its timeout (measured sequentially
// only).
func ourRedisPeers() []redisPeer {
	// Each algorithm has a prefix of its own: the rows would otherwise
	// share keys across the workloads of one server and read each other's
	// records (another policy's record is carried over on the script's
	// full path, not its fast path).
	newStore := func(b *testing.B, c *redis.Client, alg core.Algorithm, pipeline int) limiter {
		s, err := redisstore.New(c, &redisstore.Config{Prefix: "bench:" + alg.Name() + ":", Pipeline: pipeline})
		if err != nil {
			b.Fatal(err)
		}
		l, err := core.New(core.Rule{Name: "bench", Algorithm: alg, Limit: quotaLimit, Window: quotaWindow}, core.WithStore(s))
		if err != nil {
			b.Fatal(err)
		}
		return &coreLimiter{l: l}
	}
	tokenBucket := func(b *testing.B, c *redis.Client) limiter { return newStore(b, c, core.TokenBucket, 0) }
	return []redisPeer{
		{name: "ratelimit", new: tokenBucket},
		{
			name: "ratelimit-fixedwindow",
			new:  func(b *testing.B, c *redis.Client) limiter { return newStore(b, c, core.FixedWindow, 0) },
		},
		{
			name: "ratelimit-alone",
			new:  func(b *testing.B, c *redis.Client) limiter { return newStore(b, c, core.TokenBucket, -1) },
		},
		{
			name: "ratelimit-fixedwindow-alone",
			new:  func(b *testing.B, c *redis.Client) limiter { return newStore(b, c, core.FixedWindow, -1) },
		},
		{
			name:           "ratelimit-noctxtimeout",
			opts:           func(o *redis.Options) { o.ContextTimeoutEnabled = false },
			new:            tokenBucket,
			sequentialOnly: true,
		},
	}
}
