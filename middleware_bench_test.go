package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// benchWriter is a minimal, reusable ResponseWriter, so that the benchmark
// measures the middleware rather than the recorder.
type benchWriter struct {
	h    http.Header
	code int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.code = code }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }

func (w *benchWriter) reset() {
	clear(w.h)
	w.code = 0
}

const benchIPs = 10_000

// benchRequests returns benchIPs requests from distinct peers.
func benchRequests() []*http.Request {
	reqs := make([]*http.Request, benchIPs)
	for i := range reqs {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:4321", i>>16&255, i>>8&255, i&255)
		reqs[i] = r
	}
	return reqs
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })

// benchHandler is a per-IP limit generous enough that every request is
// admitted, with both header sets.
func benchHandler(b *testing.B, layers []ratelimit.Layer, opts ...ratelimit.Option) http.Handler {
	b.Helper()
	l, err := ratelimit.New(layers, append([]ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return l.Handler(okHandler)
}

func perIPLayer() []ratelimit.Layer {
	return []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1000).Named("per-ip")}}
}

func runSequential(b *testing.B, h http.Handler) {
	reqs := benchRequests()
	w := &benchWriter{h: make(http.Header)}
	for _, r := range reqs { // warm up: every key exists
		w.reset()
		h.ServeHTTP(w, r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		w.reset()
		h.ServeHTTP(w, reqs[i])
		if w.code != http.StatusNoContent {
			b.Fatalf("status %d", w.code)
		}
		if i++; i == len(reqs) {
			i = 0
		}
	}
}

func runParallel(b *testing.B, h http.Handler) {
	reqs := benchRequests()
	w := &benchWriter{h: make(http.Header)}
	for _, r := range reqs {
		w.reset()
		h.ServeHTTP(w, r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		w := &benchWriter{h: make(http.Header)}
		i := int(seed.Add(1)*7919) % len(reqs)
		for pb.Next() {
			w.reset()
			h.ServeHTTP(w, reqs[i])
			if i++; i == len(reqs) {
				i = 0
			}
		}
	})
}

func BenchmarkHandler(b *testing.B) {
	b.Run("sequential", func(b *testing.B) { runSequential(b, benchHandler(b, perIPLayer())) })
	b.Run("parallel", func(b *testing.B) { runParallel(b, benchHandler(b, perIPLayer())) })
	b.Run("layered/sequential", func(b *testing.B) {
		runSequential(b, benchHandler(b, []ratelimit.Layer{
			perIPLayer()[0],
			{Key: ratelimit.Global("all"), Rule: core.PerSecond(1 << 40).Named("global")},
		}))
	})
	b.Run("reset-delta/sequential", func(b *testing.B) {
		runSequential(b, benchHandler(b, perIPLayer(), ratelimit.WithResetDelta()))
	})
	b.Run("partition-key/sequential", func(b *testing.B) {
		runSequential(b, benchHandler(b, perIPLayer(), ratelimit.WithPartitionKey()))
	})
	b.Run("x-set/sequential", func(b *testing.B) {
		runSequential(b, benchHandler(b, bigIPLayer(), ratelimit.WithHeaders(ratelimit.XRateLimitHeaders)))
	})
	b.Run("bare/sequential", func(b *testing.B) { runSequential(b, okHandler) })
}

// bigIPLayer is perIPLayer with a quota whose Remaining is beyond the
// small-number cache of header values.
func bigIPLayer() []ratelimit.Layer {
	return []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1 << 30).Named("per-ip")}}
}

// TestHandlerOneAllocation checks that an admitted request costs one
// allocation with both header sets, for one layer and for two, and with
// the default X-RateLimit set when X-RateLimit-Remaining is beyond the
// small-number cache.
func TestHandlerOneAllocation(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	layered := []ratelimit.Layer{
		perIPLayer()[0],
		{Key: ratelimit.Global("all"), Rule: core.PerSecond(1 << 40).Named("global")},
	}
	for name, layers := range map[string][]ratelimit.Layer{"one layer": perIPLayer(), "two layers": layered} {
		allocs, w := handlerAllocs(ratelimit.Must(ratelimit.New(layers, ratelimit.WithHeaders(ratelimit.AllHeaders))))
		if allocs > 1 || w.code != http.StatusNoContent || w.h.Get(ratelimit.HeaderRateLimit) == "" {
			t.Errorf("%s: %v allocations per request (status %d, headers %v), want 1", name, allocs, w.code, w.h)
		}
		if items := mustParseSF(t, w.h.Get(ratelimit.HeaderRateLimit)); len(items) != len(layers) {
			t.Errorf("%s: RateLimit %q has %d items, want %d", name, w.h.Get(ratelimit.HeaderRateLimit), len(items), len(layers))
		}
	}
	allocs, w := handlerAllocs(ratelimit.Must(ratelimit.New(bigIPLayer())))
	if rem, _ := strconv.ParseInt(w.h.Get(ratelimit.HeaderRateLimitRemaining), 10, 64); allocs > 1 || w.code != http.StatusNoContent || rem <= 4096 {
		t.Errorf("X-RateLimit set: %v allocations per request (status %d, headers %v), want 1", allocs, w.code, w.h)
	}
}

// handlerAllocs returns the allocations per request of l's Handler around
// okHandler, serving one request again and again, and the writer of the
// last response.
func handlerAllocs(l *ratelimit.Limiter) (float64, *benchWriter) {
	h := l.Handler(okHandler)
	w := &benchWriter{h: make(http.Header)}
	r := benchRequests()[0]
	h.ServeHTTP(w, r)
	allocs := testing.AllocsPerRun(200, func() {
		w.reset()
		h.ServeHTTP(w, r)
	})
	return allocs, w
}
