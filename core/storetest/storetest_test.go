package storetest_test

import (
	"testing"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
)

func TestMemoryStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		return core.MustMemoryStore(nil)
	})
}

func TestMemoryStoreOneShard(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		return core.MustMemoryStore(&core.MemoryConfig{Capacity: 1000, Shards: 1})
	})
}
