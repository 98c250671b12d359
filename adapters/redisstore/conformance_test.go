package redisstore

import (
	"testing"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestConformance(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	storetest.Run(t, func(t *testing.T) core.Store {
		return newStore(t, client, &Config{ClientTime: true})
	})
}

// TestConformanceAdaptivePipeline runs the suite through the adaptive
// pipeliner, the default on a client with ContextTimeoutEnabled.
func TestConformanceAdaptivePipeline(t *testing.T) {
	client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	storetest.Run(t, func(t *testing.T) core.Store {
		s := newStore(t, client, &Config{ClientTime: true})
		if s.pipe == nil || s.pipe.linger == 0 {
			t.Fatal("the default store does not pipeline adaptively")
		}
		return s
	})
}
