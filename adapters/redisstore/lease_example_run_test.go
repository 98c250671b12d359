package redisstore_test

import (
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
)

// TestLeaseExampleRedis runs ExampleLeaseStore_redis against a private
// server and checks what it prints.
func TestLeaseExampleRedis(t *testing.T) {
	// The other examples run after the tests, against the server TestMain
	// chose: point redisAddr back at it when this test's server stops.
	saved := redisAddr
	redisAddr = redistest.Server(t)
	t.Cleanup(func() { redisAddr = saved })
	got := captureStdout(t, ExampleLeaseStore_redis)
	if want := "allowed=true backend calls=1 cache misses=1\n"; got != want {
		t.Fatalf("ExampleLeaseStore_redis printed %q, want %q", got, want)
	}
}
