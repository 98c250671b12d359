package redisstore_test

import (
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
)

// TestLeaseExampleRedis runs ExampleLeaseStore_redis against a private
// server and checks what it prints.
func TestLeaseExampleRedis(t *testing.T) {
	redisAddr = redistest.Server(t)
	got := captureStdout(t, ExampleLeaseStore_redis)
	if want := "allowed=true backend calls=1 cache misses=1\n"; got != want {
		t.Fatalf("ExampleLeaseStore_redis printed %q, want %q", got, want)
	}
}
