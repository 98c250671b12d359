package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestSharedQuota runs two instances of the example, each with its own
// Redis client, against one private Redis: they share one quota.
func TestSharedQuota(t *testing.T) {
	addr := redistest.Server(t)
	var urls []string
	for i := 0; i < 2; i++ {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		h, err := newHandler(client, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	var codes []int
	for i := 0; i < 7; i++ {
		resp, err := http.Get(urls[i%2] + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("X-RateLimit-Limit") != "5" {
			t.Fatalf("response %d lacks the rate-limit headers: %v", i, resp.Header)
		}
	}
	for i, c := range codes {
		want := http.StatusOK
		if i >= 5 {
			want = http.StatusTooManyRequests
		}
		if c != want {
			t.Fatalf("status codes %v, want five 200 then 429s across both instances", codes)
		}
	}
}
