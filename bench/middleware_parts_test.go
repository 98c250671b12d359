package bench

import (
	"context"
	"net/http"
	"testing"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// mwPart is one piece of our middleware's work in BenchmarkMiddleware,
// measured alone: do serves (or decides) request i with the writer w.
type mwPart struct {
	name string
	// setup returns do, after any warm-up (every key exists afterwards).
	setup func(tb testing.TB, reqs []*http.Request) func(w *benchWriter, i int)
}

// mwParts are the pieces of the "ratelimit" row of BenchmarkMiddleware:
// the client-IP key alone, the store's decision alone (core.Limiter.Allow
// on the same 10,000 addresses), and the whole middleware writing no
// headers, the X-RateLimit set, and both sets (the row itself).
func mwParts() []mwPart {
	rule := core.Rule{Name: "per-ip", Limit: quotaLimit, Window: quotaWindow}
	key := ratelimit.MustClientIP()
	mw := func(set ratelimit.HeaderSet) func(tb testing.TB, reqs []*http.Request) func(w *benchWriter, i int) {
		return func(tb testing.TB, reqs []*http.Request) func(w *benchWriter, i int) {
			l, err := ratelimit.New([]ratelimit.Layer{{Key: key, Rule: rule}}, ratelimit.WithHeaders(set))
			if err != nil {
				tb.Fatal(err)
			}
			h := l.Handler(noContent)
			w := &benchWriter{h: make(http.Header)}
			for _, r := range mwRequests() { // requests of its own, as mwSetup
				w.reset()
				h.ServeHTTP(w, r)
				if w.code != http.StatusNoContent {
					tb.Fatalf("status %d", w.code)
				}
			}
			return func(w *benchWriter, i int) {
				w.reset()
				h.ServeHTTP(w, reqs[i])
			}
		}
	}
	return []mwPart{
		{name: "key", setup: func(tb testing.TB, reqs []*http.Request) func(*benchWriter, int) {
			for _, r := range reqs {
				if _, err := key(r); err != nil {
					tb.Fatal(err)
				}
			}
			return func(_ *benchWriter, i int) { _, _ = key(reqs[i]) }
		}},
		{name: "store", setup: func(tb testing.TB, reqs []*http.Request) func(*benchWriter, int) {
			l := core.Must(core.New(rule))
			ips := make([]string, len(reqs))
			for i, r := range reqs {
				ips[i], _ = key(r)
				l.Allow(context.Background(), ips[i])
			}
			return func(_ *benchWriter, i int) { l.Allow(context.Background(), ips[i]) }
		}},
		{name: "no-headers", setup: mw(ratelimit.NoHeaders)},
		{name: "x-headers", setup: mw(ratelimit.XRateLimitHeaders)},
		{name: "all-headers", setup: mw(ratelimit.AllHeaders)},
	}
}

// BenchmarkMiddlewareParts measures the pieces of our row of
// BenchmarkMiddleware, in the same way (10,000 client IPs in turn, one
// goroutine).
func BenchmarkMiddlewareParts(b *testing.B) {
	reqs := mwRequests()
	for _, p := range mwParts() {
		b.Run(p.name, func(b *testing.B) {
			do := p.setup(b, reqs)
			w := &benchWriter{h: make(http.Header)}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				do(w, i)
				if i++; i == len(reqs) {
					i = 0
				}
			}
		})
	}
}

// BenchmarkMiddlewarePartsParallel is BenchmarkMiddlewareParts from
// GOMAXPROCS goroutines, as BenchmarkMiddlewareParallel.
func BenchmarkMiddlewarePartsParallel(b *testing.B) {
	reqs := mwRequests()
	for _, p := range mwParts() {
		b.Run(p.name, func(b *testing.B) {
			serveParallel(b, len(reqs), p.setup(b, reqs))
		})
	}
}
