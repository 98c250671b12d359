package redisstore

import (
	"testing"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
)

func TestConformance(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	storetest.Run(t, func(t *testing.T) core.Store {
		return newStore(t, client, &Config{ClientTime: true})
	})
}
