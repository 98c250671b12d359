package ratelimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// resultEnv serves requests through HandlerWithResult and records what the
// next handler read with ResultFromContext.
type resultEnv struct {
	l      *ratelimit.Limiter
	h      http.Handler
	got    *ratelimit.Result
	gotOK  bool
	served int
}

func newResultEnv(t *testing.T, layers []ratelimit.Layer, opts ...ratelimit.Option) *resultEnv {
	t.Helper()
	e := &resultEnv{l: mwLimiter(t, layers, opts...)}
	e.h = e.l.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.served++
		e.got, e.gotOK = ratelimit.ResultFromContext(r.Context())
	}))
	return e
}

func (e *resultEnv) do(r *http.Request) *httptest.ResponseRecorder {
	e.got, e.gotOK = nil, false
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func TestHandlerWithResultLayers(t *testing.T) {
	e := newResultEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 3, Window: time.Minute}},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}},
	})
	for i, want := range []struct {
		status           int
		ipLeft, userLeft int64
	}{{200, 2, 1}, {200, 1, 0}, {429, 0, 0}} {
		w := e.do(mwUserReq("192.0.2.1:1", "alice"))
		if w.Code != want.status {
			t.Fatalf("request %d: status %d, want %d", i, w.Code, want.status)
		}
		if want.status != 200 {
			if e.served != i || e.gotOK {
				t.Fatalf("refused request %d: served %d, result %v", i, e.served, e.gotOK)
			}
			continue
		}
		if !e.gotOK || e.got == nil {
			t.Fatalf("request %d: no Result in the handler's context", i)
		}
		res := e.got
		if !res.Proceed || res.Skipped || res.Err != nil || len(res.Layers) != 2 {
			t.Fatalf("request %d: Result %+v", i, res)
		}
		for j, lr := range []struct {
			name, key string
			left      int64
		}{{"per-ip", "192.0.2.1", want.ipLeft}, {"per-user", "alice", want.userLeft}} {
			got := res.Layers[j]
			if got.Decision.Policy.Name() != lr.name || got.Key != lr.key || got.Decision.Remaining != lr.left || !got.Decision.Allowed {
				t.Errorf("request %d layer %d: %s key %q remaining %d allowed %v, want %s %q %d",
					i, j, got.Decision.Policy.Name(), got.Key, got.Decision.Remaining, got.Decision.Allowed, lr.name, lr.key, lr.left)
			}
		}
		if h := w.Header().Get(ratelimit.HeaderRateLimitRemaining); h != fmt.Sprint(min(want.ipLeft, want.userLeft)) {
			t.Errorf("request %d: X-RateLimit-Remaining %q", i, h)
		}
	}
}

// More layers than the context holds inline (3), or than Admit keeps on
// the stack (6): their results must still be whole.
func TestHandlerWithResultManyLayers(t *testing.T) {
	for _, n := range []int{1, 3, 6} {
		var layers []ratelimit.Layer
		for i := range n {
			layers = append(layers, ratelimit.Layer{Key: ratelimit.MustClientIP(),
				Rule: core.Rule{Name: fmt.Sprintf("l%d", i), Limit: int64(10 + i), Window: time.Minute}})
		}
		e := newResultEnv(t, layers)
		e.do(mwReq("192.0.2.1:1"))
		if !e.gotOK || len(e.got.Layers) != n {
			t.Fatalf("%d layers: Result %v %+v", n, e.gotOK, e.got)
		}
		for i, lr := range e.got.Layers {
			if lr.Decision.Remaining != int64(9+i) || lr.Decision.Policy.Name() != fmt.Sprintf("l%d", i) {
				t.Errorf("%d layers: layer %d: %s remaining %d", n, i, lr.Decision.Policy.Name(), lr.Decision.Remaining)
			}
		}
	}
}

func TestHandlerWithResultSkippedAndNoLayer(t *testing.T) {
	e := newResultEnv(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 1, Window: time.Minute}}},
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/health" }))
	e.do(httptest.NewRequest(http.MethodGet, "/health", nil))
	if !e.gotOK || !e.got.Skipped || !e.got.Proceed || len(e.got.Layers) != 0 {
		t.Fatalf("skipped: %v %+v", e.gotOK, e.got)
	}
	e.do(mwReq("192.0.2.1:1")) // anonymous: the per-user layer does not apply
	if !e.gotOK || e.got.Skipped || !e.got.Proceed || len(e.got.Layers) != 0 {
		t.Fatalf("anonymous: %v %+v", e.gotOK, e.got)
	}
}

// A store failure served under fail-open carries its error to the handler.
func TestHandlerWithResultFailOpen(t *testing.T) {
	e := newResultEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute}}},
		ratelimit.WithStore(&mwFailStore{}))
	w := e.do(mwReq("192.0.2.1:1"))
	if w.Code != 200 || !e.gotOK || !errors.Is(e.got.Err, ratelimit.ErrStoreFailure) || !e.got.Proceed {
		t.Fatalf("status %d, result %v %+v", w.Code, e.gotOK, e.got)
	}
}

// Handler and Admit store no Result, and a KeyFunc deciding a request never
// sees one.
func TestResultAbsent(t *testing.T) {
	if _, ok := ratelimit.ResultFromContext(t.Context()); ok {
		t.Fatal("Result in an empty context")
	}
	var seen []bool
	key := func(r *http.Request) (string, error) {
		_, ok := ratelimit.ResultFromContext(r.Context())
		seen = append(seen, ok)
		return "k", nil
	}
	l := mwLimiter(t, []ratelimit.Layer{{Key: key, Rule: core.Rule{Name: "g", Limit: 5, Window: time.Minute}}})
	var inHandler []bool
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := ratelimit.ResultFromContext(r.Context())
		inHandler = append(inHandler, ok)
	})
	l.Handler(next).ServeHTTP(httptest.NewRecorder(), mwReq("192.0.2.1:1"))
	l.HandlerWithResult(next).ServeHTTP(httptest.NewRecorder(), mwReq("192.0.2.1:1"))
	if fmt.Sprint(seen, inHandler) != "[false false] [false true]" {
		t.Fatalf("KeyFunc saw a Result %v, handler %v", seen, inHandler)
	}
}

// AdmitWithResult returns the request it decided; the caller's request is
// not changed.
func TestAdmitWithResult(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute}}})
	r := mwReq("192.0.2.1:1")
	r2, ok := l.AdmitWithResult(httptest.NewRecorder(), r)
	if !ok || r2 == r {
		t.Fatalf("ok %v, same request %v", ok, r2 == r)
	}
	if _, ok := ratelimit.ResultFromContext(r.Context()); ok {
		t.Fatal("the caller's request carries a Result")
	}
	if res, ok := ratelimit.ResultFromContext(r2.Context()); !ok || res.Layers[0].Decision.Remaining != 0 {
		t.Fatalf("Result %v %+v", ok, res)
	}
	w := httptest.NewRecorder()
	r3, ok := l.AdmitWithResult(w, r)
	if ok || w.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: ok %v status %d", ok, w.Code)
	}
	if _, ok := ratelimit.ResultFromContext(r3.Context()); ok {
		t.Fatal("a refused request carries a Result")
	}
}

func TestHandlerWithResultNilPanics(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1)}})
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	l.HandlerWithResult(nil)
}

// The per-request cost of HandlerWithResult, against BenchmarkHandler's.
func BenchmarkHandlerWithResult(b *testing.B) {
	l, err := ratelimit.New(perIPLayer(), ratelimit.WithHeaders(ratelimit.AllHeaders))
	if err != nil {
		b.Fatal(err)
	}
	runSequential(b, l.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := ratelimit.ResultFromContext(r.Context()); !ok {
			b.Fatal("no Result")
		}
		w.WriteHeader(http.StatusNoContent)
	})))
}

// HandlerWithResult costs exactly two allocations per request more than
// Handler for one or two layers, three for more; Handler pays nothing for it.
func TestHandlerWithResultAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	for _, tc := range []struct{ layers, extra int }{{1, 2}, {2, 2}, {3, 3}} {
		var layers []ratelimit.Layer
		for i := range tc.layers {
			layers = append(layers, ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1000).Named(fmt.Sprint("l", i))})
		}
		l := ratelimit.Must(ratelimit.New(layers, ratelimit.WithHeaders(ratelimit.AllHeaders)))
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
		allocs := func(h http.Handler) float64 {
			w := &mwWriter{h: make(http.Header)}
			r := mwReq("192.0.2.1:1")
			h.ServeHTTP(w, r)
			n := testing.AllocsPerRun(200, func() {
				clear(w.h)
				h.ServeHTTP(w, r)
			})
			if w.code != 204 {
				t.Fatalf("status %d", w.code)
			}
			return n
		}
		plain, with := allocs(l.Handler(next)), allocs(l.HandlerWithResult(next))
		if with-plain != float64(tc.extra) {
			t.Errorf("%d layers: Handler %v allocations, HandlerWithResult %v: want %d more", tc.layers, plain, with, tc.extra)
		}
	}
}

// Nested Limiters: the handler finds the decision of the innermost one.
func TestResultFromContextInnermost(t *testing.T) {
	outer := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "outer", Limit: 5, Window: time.Minute}}})
	inner := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "inner", Limit: 3, Window: time.Minute}}})
	var got string
	h := outer.HandlerWithResult(inner.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if res, ok := ratelimit.ResultFromContext(r.Context()); ok {
			got = fmt.Sprint(res.Layers[0].Decision.Policy.Name(), res.Layers[0].Decision.Remaining)
		}
	})))
	h.ServeHTTP(httptest.NewRecorder(), mwReq("192.0.2.1:1"))
	if got != "inner2" {
		t.Fatalf("got %q, want inner2", got)
	}
}
