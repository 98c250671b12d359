package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestThreeConcurrent replays the curl sequence of the package
// documentation against a real server: of three concurrent requests one
// gets 429 at once and two 200 once their work ends; a request after them
// gets 200. The work waits on a gate rather than a timer, so the test does
// not depend on the machine's speed.
func TestThreeConcurrent(t *testing.T) {
	started, gate := make(chan struct{}, 3), make(chan struct{})
	h, err := newHandlerWith(func(ctx context.Context) bool {
		started <- struct{}{}
		<-gate
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	type result struct {
		code   int
		header http.Header
	}
	get := func() result {
		resp, err := srv.Client().Get(srv.URL + "/slow")
		if err != nil {
			t.Error(err)
			return result{}
		}
		resp.Body.Close()
		return result{resp.StatusCode, resp.Header}
	}
	var (
		wg   sync.WaitGroup
		slow [2]result
	)
	for i := range slow {
		wg.Add(1)
		go func() { defer wg.Done(); slow[i] = get() }()
	}
	<-started
	<-started // both hold their slots
	refused := get()
	if refused.code != http.StatusTooManyRequests {
		t.Fatalf("third concurrent request: %d, want 429 at once", refused.code)
	}
	close(gate)
	wg.Wait()
	if slow[0].code != 200 || slow[1].code != 200 {
		t.Fatalf("the two slow requests: %d %d, want 200 200", slow[0].code, slow[1].code)
	}
	for name, want := range map[string]string{
		"Retry-After":           "1",
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"RateLimit-Policy":      `"in-flight";q=2;qu="concurrent-requests"`, // the rate layer was not asked
		"RateLimit":             `"in-flight";r=0;t=1`,
	} {
		if got := refused.header.Get(name); got != want {
			t.Errorf("429 %s = %q, want %q", name, got, want)
		}
	}
	if r := get(); r.code != 200 {
		t.Fatalf("after they finished: %d, want 200", r.code)
	}
}
