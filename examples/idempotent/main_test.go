package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// TestCurlSequence replays the sequence in the package documentation
// against a real server: k1, k1 again, k2, k3.
func TestCurlSequence(t *testing.T) {
	h, err := newHandler(core.NewFakeClock(time.Unix(1_800_000_000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	want := []struct {
		key       string
		status    int
		remaining string
	}{{"k1", 200, "1"}, {"k1", 200, "1"}, {"k2", 200, "0"}, {"k3", 429, "0"}}
	for i, w := range want {
		req, _ := http.NewRequest("POST", srv.URL+"/charge", nil)
		req.Header.Set("Idempotency-Key", w.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != w.status || resp.Header.Get("X-RateLimit-Remaining") != w.remaining {
			t.Errorf("request %d (%s): %d remaining=%s, want %d remaining=%s", i, w.key, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), w.status, w.remaining)
		}
	}
}
