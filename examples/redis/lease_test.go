package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLeaseSharedQuota runs two instances of the example with -lease 2
// against one private Redis and sends 40 concurrent requests from one
// client, alternating between them: neither instance, nor both together,
// admits more than the quota of 5 (plus what the token bucket refills
// while the test runs, half a unit per second). A decision that times out
// on a loaded machine is served without rate-limit headers (the example
// fails open); those are counted apart, as they are not admissions by the
// limiter.
func TestLeaseSharedQuota(t *testing.T) {
	addr := redistest.Server(t)
	var urls []string
	for i := 0; i < 2; i++ {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		warmUp(t, client)
		h, err := newHandler(client, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	var admitted [2]atomic.Int64
	var failedOpen atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(urls[i%2] + "/")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				if resp.Header.Get("X-RateLimit-Limit") == "" {
					failedOpen.Add(1)
					return
				}
				admitted[i%2].Add(1)
			case http.StatusTooManyRequests:
				if resp.Header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	refill := int64(elapsed / (2 * time.Second))
	a, b := admitted[0].Load(), admitted[1].Load()
	if a > 5+refill || b > 5+refill || a+b > 5+refill {
		t.Fatalf("instances admitted %d and %d (%d together) of a quota of 5 (+%d refilled)", a, b, a+b, refill)
	}
	// Within a second no lease has ended and less than a unit refilled:
	// every unit leased was spent, so the whole quota was admitted.
	if n := failedOpen.Load(); n > 0 {
		t.Logf("%d decisions timed out and were served unlimited", n)
	} else if elapsed < 900*time.Millisecond && a+b != 5 {
		t.Fatalf("instances admitted %d and %d in %v, want the whole quota of 5", a, b, elapsed)
	}
}

// warmUp dials connections of client ahead of the test's burst.
func warmUp(t *testing.T, client *redis.Client) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := client.Ping(context.Background()).Err(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}
