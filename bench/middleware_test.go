package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// benchWriter is a minimal, reusable ResponseWriter, so that the benchmarks
// measure the middleware rather than a recorder.
type benchWriter struct {
	h    http.Header
	code int
}

func (w *benchWriter) Header() http.Header { return w.h }

func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *benchWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(b), nil
}

func (w *benchWriter) reset() {
	clear(w.h)
	w.code = 0
}

// mwIPs is the number of distinct client addresses the middleware
// workloads cycle through.
const mwIPs = 10_000

// mwRequests returns mwIPs GET requests from distinct peers.
func mwRequests() []*http.Request {
	reqs := make([]*http.Request, mwIPs)
	for i := range reqs {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:4321", i>>16&255, i>>8&255, i&255)
		reqs[i] = r
	}
	return reqs
}

var noContent = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })

// mwSetup builds p's handler, serves a request from every address once
// (every key exists afterwards) and checks the response. It uses requests
// of its own, so that the keys a limiter keeps do not share memory with the
// requests of the timed loop (see clones).
func mwSetup(b *testing.B, p mwPeer) http.Handler {
	h := p.wrap(b, noContent)
	w := &benchWriter{h: make(http.Header)}
	for _, r := range mwRequests() {
		w.reset()
		h.ServeHTTP(w, r)
		if w.code != http.StatusNoContent {
			b.Fatalf("%s: status %d, headers %v", p.name, w.code, w.h)
		}
	}
	return h
}

func forEachMiddleware(b *testing.B, f func(b *testing.B, p mwPeer)) {
	for _, p := range mwPeers() {
		b.Run(p.name, func(b *testing.B) { f(b, p) })
	}
}

// BenchmarkMiddleware serves requests from 10,000 client IPs in turn
// through each peer's net/http middleware around a handler answering 204,
// from one goroutine.
func BenchmarkMiddleware(b *testing.B) {
	reqs := mwRequests()
	forEachMiddleware(b, func(b *testing.B, p mwPeer) {
		h := mwSetup(b, p)
		w := &benchWriter{h: make(http.Header)}
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
	})
}

// BenchmarkMiddlewareParallel is BenchmarkMiddleware from GOMAXPROCS
// goroutines, each with its own writer.
func BenchmarkMiddlewareParallel(b *testing.B) {
	reqs := mwRequests()
	forEachMiddleware(b, func(b *testing.B, p mwPeer) {
		h := mwSetup(b, p)
		var bad atomic.Int64
		serveParallel(b, len(reqs), func(w *benchWriter, i int) {
			w.reset()
			h.ServeHTTP(w, reqs[i])
			if w.code != http.StatusNoContent {
				bad.Add(1)
			}
		})
		if n := bad.Load(); n > 0 {
			b.Fatalf("%d responses were not 204", n)
		}
	})
}

// serveParallel runs do from GOMAXPROCS goroutines, each with its own
// writer, over the request indexes 0..n-1 in turn from a scattered start,
// and reports allocations.
func serveParallel(b *testing.B, n int, do func(w *benchWriter, i int)) {
	var seed atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &benchWriter{h: make(http.Header)}
		i := int(seed.Add(1)*7919) % n
		for pb.Next() {
			do(w, i)
			if i++; i == n {
				i = 0
			}
		}
	})
}
