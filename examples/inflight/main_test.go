package main

import (
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"
)

// TestThreeConcurrent replays the curl sequence of the package
// documentation against a real server, with a short sleep: of three
// concurrent requests one gets 429 at once and two 200 after the sleep; a
// request after them gets 200.
func TestThreeConcurrent(t *testing.T) {
	const sleep = 300 * time.Millisecond
	h, err := newHandler(sleep)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	type result struct {
		code    int
		elapsed time.Duration
		header  http.Header
	}
	get := func() result {
		start := time.Now()
		resp, err := srv.Client().Get(srv.URL + "/slow")
		if err != nil {
			t.Error(err)
			return result{}
		}
		resp.Body.Close()
		return result{resp.StatusCode, time.Since(start), resp.Header}
	}
	var (
		wg      sync.WaitGroup
		results [3]result
	)
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = get() }()
	}
	wg.Wait()
	sort.Slice(results[:], func(i, j int) bool { return results[i].code > results[j].code })
	refused := results[0]
	if refused.code != http.StatusTooManyRequests || results[1].code != 200 || results[2].code != 200 {
		t.Fatalf("codes %d %d %d, want one 429 and two 200", results[0].code, results[1].code, results[2].code)
	}
	if refused.elapsed >= sleep {
		t.Errorf("the 429 took %v, want it at once (before the %v sleep)", refused.elapsed, sleep)
	}
	for _, r := range results[1:] {
		if r.elapsed < sleep {
			t.Errorf("a 200 took %v, want at least the %v sleep", r.elapsed, sleep)
		}
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
