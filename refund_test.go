package ratelimit_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// loginHandler answers 200 for the password "good" and 401 otherwise.
var loginHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Password") == "good" {
		_, _ = w.Write([]byte("welcome"))
		return
	}
	http.Error(w, "wrong password", http.StatusUnauthorized)
})

func refundEnv(t *testing.T, layers []ratelimit.Layer, next http.Handler, opts ...ratelimit.Option) (*ratelimit.Limiter, http.Handler, *core.FakeClock) {
	t.Helper()
	clk := core.NewFakeClock(mwT0)
	l, err := ratelimit.New(layers, append([]ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithLogger(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l, l.Handler(next), clk
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// TestRefundCountsOnlyFailedLogins: 5 failed logins per IP per 15 minutes,
// successful logins never count: the 6th failed login is refused, whatever
// the successful ones in between.
func TestRefundCountsOnlyFailedLogins(t *testing.T) {
	_, h, _ := refundEnv(t, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "login", Algorithm: core.FixedWindow, Limit: 5, Window: 15 * time.Minute},
	}}, loginHandler, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	good, bad := mwReq("192.0.2.1:1", "Password", "good"), mwReq("192.0.2.1:1", "Password", "bad")
	for i := 0; i < 20; i++ {
		if rec := serve(h, good); rec.Code != 200 {
			t.Fatalf("successful login %d: %d", i, rec.Code)
		}
	}
	for i := 0; i < 5; i++ {
		rec := serve(h, bad)
		if rec.Code != 401 {
			t.Fatalf("failed login %d: %d", i+1, rec.Code)
		}
		// The headers describe the charge.
		if got, want := rec.Header().Get("X-RateLimit-Remaining"), []string{"4", "3", "2", "1", "0"}[i]; got != want {
			t.Fatalf("failed login %d: X-RateLimit-Remaining %q, want %q", i+1, got, want)
		}
		if rec := serve(h, good); rec.Code != 200 && i < 4 {
			t.Fatalf("successful login after %d failures: %d", i+1, rec.Code)
		}
	}
	if rec := serve(h, bad); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("6th failed login: %d, want 429", rec.Code)
	}
	// Another client is not concerned.
	if rec := serve(h, mwReq("192.0.2.2:1", "Password", "bad")); rec.Code != 401 {
		t.Fatalf("another client's failed login: %d", rec.Code)
	}
}

// TestRefundCountsOnlySuccessfulCalls: failed calls never count.
func TestRefundCountsOnlySuccessfulCalls(t *testing.T) {
	fail := true
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	_, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(3).Named("calls")}},
		next, ratelimit.WithRefund(ratelimit.RefundFailed))
	r := mwReq("192.0.2.1:1")
	for i := 0; i < 10; i++ {
		if rec := serve(h, r); rec.Code != http.StatusBadGateway {
			t.Fatalf("failed call %d: %d", i, rec.Code)
		}
	}
	fail = false
	for i := 0; i < 3; i++ {
		if rec := serve(h, r); rec.Code != http.StatusCreated {
			t.Fatalf("successful call %d: %d", i, rec.Code)
		}
	}
	if rec := serve(h, r); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("4th successful call: %d, want 429", rec.Code)
	}
}

// TestRefundAllLayers: a refund gives back every layer the request was
// charged by; refunds by status, not by other conditions.
func TestRefundAllLayers(t *testing.T) {
	l, h, _ := refundEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Minute}},
	}, loginHandler, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	good := mwUserReq("192.0.2.1:1", "alice", "Password", "good")
	bad := mwUserReq("192.0.2.1:1", "alice", "Password", "bad")
	for i := 0; i < 5; i++ {
		serve(h, good)
	}
	serve(h, bad)
	res := l.Peek(good)
	if len(res.Layers) != 2 || res.Layers[0].Decision.Remaining != 8 || res.Layers[1].Decision.Remaining != 1 {
		t.Fatalf("after 5 refunded and 1 charged: %+v, want per-ip 8 and per-user 1 left after this one", res.Layers)
	}
}

// TestRefundStatus: the status given to the refund decision.
func TestRefundStatus(t *testing.T) {
	for _, c := range []struct {
		name string
		h    http.HandlerFunc
		want int
	}{
		{"none", func(w http.ResponseWriter, r *http.Request) {}, 200},
		{"write", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("x")) }, 200},
		{"explicit", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) }, 404},
		{"informational first", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(103); w.WriteHeader(401) }, 401},
		{"flush", func(w http.ResponseWriter, r *http.Request) { w.(http.Flusher).Flush(); w.WriteHeader(500) }, 200},
		{"controller", func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).Flush()
			w.WriteHeader(500)
		}, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := 0
			_, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}}, c.h,
				ratelimit.WithRefund(func(r *http.Request, status int) bool { got = status; return false }))
			serve(h, mwReq("192.0.2.1:1"))
			if got != c.want {
				t.Fatalf("status %d, want %d", got, c.want)
			}
		})
	}
}

// TestRefundNothingUncharged: a panicking handler and a dry-run refusal
// are refunded nothing.
func TestRefundNothingUncharged(t *testing.T) {
	t.Run("panic", func(t *testing.T) {
		l, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2)}},
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("boom") }),
			ratelimit.WithRefund(func(*http.Request, int) bool { return true }))
		r := mwReq("192.0.2.1:1")
		func() {
			defer func() { _ = recover() }()
			serve(h, r)
		}()
		if res := l.Peek(r); res.Layers[0].Decision.Remaining != 0 {
			t.Fatalf("after a panic: Remaining after one more %d, want 0 (the panicking request stays charged)", res.Layers[0].Decision.Remaining)
		}
	})
	t.Run("dry-run refusal", func(t *testing.T) {
		first := true
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if first {
				first = false
				w.WriteHeader(401)
			}
		})
		l, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}}, next,
			ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithDryRun())
		r := mwReq("192.0.2.1:1")
		serve(h, r) // charged, 401: kept
		serve(h, r) // refused, served in dry run with 200: nothing to give back
		if res := l.Peek(r); res.Layers[0].Refused != true {
			t.Fatalf("a dry-run refusal was refunded: %+v", res.Layers)
		}
	})
}

// TestRefundPeekAndCopies: a Peek's Result charged nothing, so Refund gives
// nothing back for it; and a charge is refunded once, whichever copy of its
// Result asks (Decide returns Results by value).
func TestRefundPeekAndCopies(t *testing.T) {
	layers := []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(3).Named("per-ip").Using(core.FixedWindow)}}
	t.Run("peek", func(t *testing.T) {
		l, _, _ := refundEnv(t, layers, loginHandler)
		r := mwReq("192.0.2.1:1")
		admitted := 0
		for range 5 {
			if res := l.Peek(r); res.Proceed { // as a page showing the quota would
				if err := l.Refund(context.Background(), &res); err != nil {
					t.Fatal(err)
				}
			}
			if l.Decide(r).Proceed {
				admitted++
			}
		}
		if admitted != 3 {
			t.Fatalf("with a Peek's Result refunded before each request, %d of 5 admitted, want 3", admitted)
		}
	})
	t.Run("copies", func(t *testing.T) {
		l, _, _ := refundEnv(t, layers, loginHandler)
		r := mwReq("192.0.2.1:1")
		l.Decide(r)
		l.Decide(r)
		res := l.Decide(r)
		kept := res
		for _, p := range []*ratelimit.Result{&res, &kept, &res} {
			if err := l.Refund(context.Background(), p); err != nil {
				t.Fatal(err)
			}
		}
		admitted := 0
		for range 3 {
			if l.Decide(r).Proceed {
				admitted++
			}
		}
		if admitted != 1 {
			t.Fatalf("3 charged, one refunded through two copies: %d more admitted, want 1", admitted)
		}
	})
}

// TestRefundNeedsARefunder: a store without core.Refunder is refused at
// construction.
func TestRefundNeedsARefunder(t *testing.T) {
	_, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}},
		ratelimit.WithStore(takeOnly{core.MustMemoryStore(nil)}), ratelimit.WithRefund(ratelimit.RefundSuccessful))
	if err == nil {
		t.Fatal("WithRefund over a store without Refund: no error")
	}
	if _, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}}, ratelimit.WithRefund(nil)); err == nil {
		t.Fatal("WithRefund(nil): no error")
	}
}

type takeOnly struct{ s core.Store }

func (s takeOnly) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return s.s.Take(ctx, now, reqs, out)
}

// noRefundAlg is a custom algorithm that cannot refund.
type noRefundAlg struct{ core.Algorithm }

func (noRefundAlg) Name() string { return "no_refund" }

// TestRefundFailureReported: a refund the store refuses leaves the charge
// and reaches the Observer.
func TestRefundFailureReported(t *testing.T) {
	obs := &mwObserver{}
	l, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Algorithm: noRefundAlg{core.FixedWindow}, Limit: 1, Window: time.Minute}}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithObserver(obs))
	r := mwReq("192.0.2.1:1")
	if rec := serve(h, r); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	obs.mu.Lock()
	n := len(obs.errs)
	var err error
	if n > 0 {
		err = obs.errs[0].Err
	}
	obs.mu.Unlock()
	if n != 1 || !errors.Is(err, core.ErrRefundUnsupported) {
		t.Fatalf("observed %d errors (%v), want one wrapping ErrRefundUnsupported", n, err)
	}
	if rec := serve(h, r); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("after a failed refund: %d, want 429 (still charged)", rec.Code)
	}
	_ = l
}

// TestPeekChargesNothing: Limiter.Peek reports what Decide would, writes
// no state.
func TestPeekChargesNothing(t *testing.T) {
	l, h, _ := refundEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(3).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(1).Named("per-user")},
	}, mwOK)
	r := mwUserReq("192.0.2.1:1", "alice")
	for i := 0; i < 3; i++ {
		res := l.Peek(r)
		if !res.Proceed || len(res.Layers) != 2 || res.Layers[0].Decision.Remaining != 2 || res.Layers[1].Decision.Remaining != 0 {
			t.Fatalf("peek %d: %+v", i, res)
		}
	}
	serve(h, r)
	res := l.Peek(r)
	if res.Proceed || !res.Layers[1].Refused || res.Layers[0].Refused || res.RetryAfter() != time.Minute {
		t.Fatalf("peek after a charge: %+v (retry %v)", res, res.RetryAfter())
	}
	dec := l.Decide(r)
	if dec.Proceed != res.Proceed || dec.Layers[1].Decision != res.Layers[1].Decision || dec.Layers[0].Decision != res.Layers[0].Decision {
		t.Fatalf("Decide %+v != Peek %+v", dec, res)
	}
	// Over an unsupporting store, Peek fails as a store failure.
	l2 := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}},
		ratelimit.WithStore(takeOnly{core.MustMemoryStore(nil)}), ratelimit.WithLogger(nil)))
	if res := l2.Peek(r); !errors.Is(res.Err, core.ErrUnsupported) || !errors.Is(res.Err, ratelimit.ErrStoreFailure) {
		t.Fatalf("Peek without a Peeker: %v", res.Err)
	}
}

// TestReset: a layer's key is made whole; other layers and keys are not.
func TestReset(t *testing.T) {
	l, h, _ := refundEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerHour(2).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerHour(2).Named("per-user")},
	}, mwOK)
	r := mwUserReq("192.0.2.1:1", "alice")
	serve(h, r)
	serve(h, r)
	if rec := serve(h, r); rec.Code != 429 {
		t.Fatal(rec.Code)
	}
	ctx := context.Background()
	if err := l.Reset(ctx, "per-user", "alice"); err != nil {
		t.Fatal(err)
	}
	if rec := serve(h, r); rec.Code != 429 {
		t.Fatalf("per-ip still empty: %d", rec.Code)
	}
	if err := l.Reset(ctx, "per-ip", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if rec := serve(h, r); rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("after both resets: %d %q", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	if err := l.Reset(ctx, "nope", "alice"); !errors.Is(err, ratelimit.ErrUnknownLayer) {
		t.Fatalf("unknown layer: %v", err)
	}

	// A concurrency layer's slots are given back by their requests: Reset
	// refuses, and the slot stays held.
	cl := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1}})
	held := cl.Decide(mwReq("192.0.2.1:1"))
	defer held.Release()
	if err := cl.Reset(ctx, "in-flight", "192.0.2.1"); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("Reset of a concurrency layer: %v, want core.ErrUnsupported", err)
	}
	next := cl.Decide(mwReq("192.0.2.1:1"))
	defer next.Release()
	if !held.Proceed || next.Proceed {
		t.Fatalf("the slot held (%v) and the next request (%v): want the first admitted and the next refused", held.Proceed, next.Proceed)
	}
}

// TestHandlerWithRefundAllocs: Handler without WithRefund keeps its
// allocations; with it, a request costs at most one more allocation (the
// status recorder) and a refund one more (the context without its
// cancellation).
func TestHandlerWithRefundAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	allocs := func(opts ...ratelimit.Option) float64 {
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1000).Named("per-ip")},
		}, opts...))
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
		w := &mwWriter{h: make(http.Header)}
		r := mwReq("192.0.2.1:1")
		h.ServeHTTP(w, r)
		return testing.AllocsPerRun(200, func() { clear(w.h); h.ServeHTTP(w, r) })
	}
	base := allocs()
	if base > 1 {
		t.Errorf("Handler without WithRefund: %v allocations, want <= 1", base)
	}
	if n := allocs(ratelimit.WithRefund(ratelimit.RefundFailed)); n > base+1 {
		t.Errorf("WithRefund, no refund: %v allocations, want <= %v", n, base+1)
	}
	if n := allocs(ratelimit.WithRefund(ratelimit.RefundSuccessful)); n > base+2 {
		t.Errorf("WithRefund, refunded: %v allocations, want <= %v", n, base+2)
	}
}

// TestRefundWithResult: HandlerWithResult refunds as Handler does, and the
// handler still reads its Result.
func TestRefundWithResult(t *testing.T) {
	clk := core.NewFakeClock(mwT0)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("calls")}},
		ratelimit.WithClock(clk), ratelimit.WithLogger(nil), ratelimit.WithRefund(ratelimit.RefundSuccessful)))
	var seen []int64
	h := l.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := ratelimit.ResultFromContext(r.Context())
		if !ok {
			t.Fatal("no Result")
		}
		seen = append(seen, res.Layers[0].Decision.Remaining)
		if r.Header.Get("Fail") != "" {
			w.WriteHeader(500)
		}
	}))
	ok, fail := mwReq("192.0.2.1:1"), mwReq("192.0.2.1:1", "Fail", "1")
	for i := 0; i < 5; i++ {
		if rec := serve(h, ok); rec.Code != 200 {
			t.Fatalf("refunded call %d: %d", i, rec.Code)
		}
	}
	serve(h, fail)
	serve(h, fail)
	if rec := serve(h, ok); rec.Code != 429 {
		t.Fatalf("after 2 failures: %d, want 429", rec.Code)
	}
	want := []int64{1, 1, 1, 1, 1, 1, 0}
	if len(seen) != len(want) {
		t.Fatalf("handler saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("handler saw %v, want %v", seen, want)
		}
	}
}

// TestLimiterRefund: Limiter.Refund gives a Decide charge back once, and
// leaves Results that charged nothing alone.
func TestLimiterRefund(t *testing.T) {
	l, _, _ := refundEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(2).Named("per-user")},
	}, mwOK)
	ctx := context.Background()
	r := mwUserReq("192.0.2.1:1", "alice")
	res := l.Decide(r)
	if !res.Proceed {
		t.Fatal(res)
	}
	for i := 0; i < 3; i++ { // once only
		if err := l.Refund(ctx, &res); err != nil {
			t.Fatal(err)
		}
	}
	if p := l.Peek(r); p.Layers[0].Decision.Remaining != 4 || p.Layers[1].Decision.Remaining != 1 {
		t.Fatalf("after a refund (three calls): %+v, want 4 and 1 left after one more", p.Layers)
	}
	l.Decide(r)
	l.Decide(r)
	refused := l.Decide(r)
	if refused.Proceed {
		t.Fatal("third request admitted")
	}
	if err := l.Refund(ctx, &refused); err != nil {
		t.Fatal(err)
	}
	if p := l.Peek(r); p.Proceed || p.Layers[0].Decision.Remaining != 3 {
		t.Fatalf("a refused Result was refunded: %+v", p.Layers)
	}
	if err := l.Refund(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Over a store that cannot refund, the error says so.
	l2 := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1)}},
		ratelimit.WithStore(takeOnly{core.MustMemoryStore(nil)}), ratelimit.WithLogger(nil)))
	res = l2.Decide(r)
	if err := l2.Refund(ctx, &res); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("Refund without a Refunder: %v", err)
	}
}

// TestRefundAfterSetRules: a request charged under a rule that SetRules
// then replaced keeps its charge (the new rule's record cannot tell its
// units from later ones, and refunding under the old rule would carry the
// key's state back to its smaller capacity); set again to the same rule,
// the layer refunds it. Both Limiter.Refund and WithRefund's handler.
func TestRefundAfterSetRules(t *testing.T) {
	layers := []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(2).Named("ip")}}
	raise := func(t *testing.T, l *ratelimit.Limiter) {
		t.Helper()
		if err := l.SetRules(map[string]core.Rule{"ip": core.PerHour(100)}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 50; i++ {
			if !l.Decide(mwReq("192.0.2.1:1")).Proceed {
				t.Fatalf("request %d refused", i)
			}
		}
	}
	check := func(t *testing.T, l *ratelimit.Limiter) {
		t.Helper()
		// 51 charged (the first carried over), none refunded: 49 left, 48
		// after the peek's own unit.
		if p := l.Peek(mwReq("192.0.2.1:1")); p.Layers[0].Decision.Remaining != 48 {
			t.Fatalf("remaining %d after the refund, want 48 (the charge kept)", p.Layers[0].Decision.Remaining)
		}
	}
	t.Run("Refund", func(t *testing.T) {
		l, _, _ := refundEnv(t, layers, mwOK)
		res := l.Decide(mwReq("192.0.2.1:1"))
		raise(t, l)
		if err := l.Refund(context.Background(), &res); err != nil {
			t.Fatal(err)
		}
		check(t, l)
	})
	t.Run("WithRefund", func(t *testing.T) {
		var l *ratelimit.Limiter
		l, h, _ := refundEnv(t, layers, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			raise(t, l) // while this request is in its handler; 200: refunded
		}), ratelimit.WithRefund(ratelimit.RefundSuccessful))
		if rec := serve(h, mwReq("192.0.2.1:1")); rec.Code != http.StatusOK {
			t.Fatalf("status %d", rec.Code)
		}
		check(t, l)
	})
	t.Run("same rule again", func(t *testing.T) {
		l, _, _ := refundEnv(t, layers, mwOK)
		res := l.Decide(mwReq("192.0.2.1:1"))
		l.Decide(mwReq("192.0.2.1:1"))
		if err := l.SetRules(map[string]core.Rule{"ip": core.PerHour(2)}); err != nil {
			t.Fatal(err)
		}
		if err := l.Refund(context.Background(), &res); err != nil {
			t.Fatal(err)
		}
		if !l.Decide(mwReq("192.0.2.1:1")).Proceed {
			t.Fatal("refused after the refund: the same rule set again kept the charge")
		}
	})
	// A rule lowered below the charge's cost: the refund is made without
	// an error, the lowered layer keeps its charge, and the batch's other
	// layer, whose rule did not change, gets its whole charge back.
	t.Run("capacity lowered below the cost", func(t *testing.T) {
		cost := func(r *http.Request) int64 {
			if r.Header.Get("X-Big") != "" {
				return 3
			}
			return 1
		}
		l, _, _ := refundEnv(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip"), Cost: cost},
			{Key: ratelimit.Header("X-User"), Rule: core.PerMinute(10).Named("user"), Cost: cost},
		}, mwOK)
		res := l.Decide(mwReq("192.0.2.1:1", "X-User", "alice", "X-Big", "1"))
		if err := l.SetRules(map[string]core.Rule{"ip": core.PerMinute(2)}); err != nil {
			t.Fatal(err)
		}
		// Meets the key under the new rule: 2 units in use carried over,
		// refused.
		if l.Decide(mwReq("192.0.2.1:1", "X-User", "alice")).Proceed {
			t.Fatal("a request under the lowered rule was admitted: no units carried over")
		}
		if err := l.Refund(context.Background(), &res); err != nil {
			t.Fatalf("refund after the rule went below the charge's cost: %v", err)
		}
		// A request of cost 1, refused by the ip layer: the user layer
		// reports its state without the request, whole.
		p := l.Peek(mwReq("192.0.2.1:1", "X-User", "alice"))
		if ip, user := p.Layers[0].Decision, p.Layers[1].Decision; ip.Allowed || user.Remaining != 10 {
			t.Fatalf("after the refund: ip %+v, user %+v; want ip refusing (its charge stays) and user whole (10)", ip, user)
		}
	})
}

// TestRefundWithConcurrencyLayer: a refund gives back the rate layers and
// leaves the concurrency layer's slot to be given back as usual; Peek
// reports the rate layers only and takes no slot.
func TestRefundWithConcurrencyLayer(t *testing.T) {
	var inside *ratelimit.Limiter
	var peekInside ratelimit.Result
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peekInside = inside.Peek(r) // while this request holds the only slot
	})
	l, h, _ := refundEnv(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(3).Named("per-ip")},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1},
	}, next, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	inside = l
	r := mwReq("192.0.2.1:1")
	for i := 0; i < 5; i++ {
		if rec := serve(h, r); rec.Code != 200 {
			t.Fatalf("request %d: %d (the slot or the rate not given back)", i, rec.Code)
		}
	}
	if len(peekInside.Layers) != 1 || peekInside.Layers[0].Decision.Policy.Name() != "per-ip" || !peekInside.Proceed {
		t.Fatalf("Peek inside the handler: %+v, want the per-ip layer only, proceeding", peekInside)
	}
	if res := l.Peek(r); res.Layers[0].Decision.Remaining != 2 {
		t.Fatalf("after 5 refunded requests: %+v, want 2 left after one more", res.Layers)
	}
}

// TestRefundOnceWhenHandlerRefunds: a handler under HandlerWithResult that
// refunds its own Result, and then writes a status WithRefund would refund
// too, is refunded once.
func TestRefundOnceWhenHandlerRefunds(t *testing.T) {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "w", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour},
	}}, ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithClock(core.NewFakeClock(time.Unix(1_800_000_000, 0)))))
	var h http.Handler
	h = l.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Self-Refund") != "" {
			res, _ := ratelimit.ResultFromContext(r.Context())
			if err := l.Refund(context.WithoutCancel(r.Context()), res); err != nil {
				t.Error(err)
			}
			return // 200: WithRefund would refund it too
		}
		w.WriteHeader(http.StatusInternalServerError) // kept charged
	}))
	do := func(self bool) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		if self {
			r.Header.Set("X-Self-Refund", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	do(false)
	do(false) // two charges kept: 1 unit left
	do(true)  // charged, then refunded once: still 1 left
	admitted := 0
	for range 3 {
		if do(false) != http.StatusTooManyRequests {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("%d more admitted after two kept charges of 3, want 1 (a double refund gives back another's unit)", admitted)
	}
}

// TestRefundGivesBackOnlyItsCharge: a request whose handler outlives its
// charge (a window boundary, or other requests charged meanwhile) is
// refunded only what its own charge still holds: a failing request near
// the end of a window buys no quota in the next, and a sliding log or a
// bucket gives back none of the units of the requests charged since.
func TestRefundGivesBackOnlyItsCharge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  core.Rule
		start time.Duration // of the slow request, from a minute boundary
		steps []time.Duration
		want  int // admitted among the steps' requests
	}{
		// 3 a minute: the slow request is charged at 0:59, the fast ones
		// from 1:01; its refund, at the end, must not lift the window of
		// 1:00, of which 3 are admitted.
		{"fixed window", core.Rule{Name: "w", Limit: 3, Window: time.Minute, Algorithm: core.FixedWindow}, 59 * time.Second,
			[]time.Duration{2 * time.Second, 0, 0, 0, 0}, 3},
		// 2 in 10 s: X at 0, Y at 8, X refunded at 10 (its entry has left
		// the window): Y still holds its place until 18, so at 10 one
		// more is admitted, not two.
		{"sliding log", core.Rule{Name: "l", Limit: 2, Window: 10 * time.Second, Algorithm: core.SlidingWindowLog}, 0,
			[]time.Duration{8 * time.Second, 2 * time.Second, 0, 0}, 2},
		// The same with a bucket of 2 refilled one per 5 s: X at 0 has
		// given back all it held by 5, so its refund at 10 gives nothing.
		{"token bucket", core.Rule{Name: "b", Limit: 2, Window: 10 * time.Second}, 0,
			[]time.Duration{8 * time.Second, 2 * time.Second, 0, 0}, 2},
		// Refunded while its entry is in the window (X at 0, Y at 8, X
		// refunded at 9): X's place is given back, not Y's, so 9 is
		// admitted and 10 is not.
		{"sliding log, in the window", core.Rule{Name: "l", Limit: 2, Window: 10 * time.Second, Algorithm: core.SlidingWindowLog}, 0,
			[]time.Duration{8 * time.Second, time.Second, time.Second, 0}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Slow") != "" {
					close(entered)
					<-release
					w.WriteHeader(http.StatusBadGateway) // failed: refunded
				}
			})
			_, h, clk := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: tc.rule}}, next,
				ratelimit.WithRefund(ratelimit.RefundFailed))
			base := mwT0.Truncate(time.Minute).Add(time.Hour)
			clk.Set(base.Add(tc.start))
			slow := make(chan int)
			go func() {
				r := mwReq("192.0.2.1:1")
				r.Header.Set("X-Slow", "1")
				slow <- serve(h, r).Code
			}()
			<-entered
			admitted := 0
			for i, step := range tc.steps {
				clk.Advance(step)
				if i == 1 { // the slow request ends, after the first fast one
					close(release)
					if code := <-slow; code != http.StatusBadGateway {
						t.Fatalf("slow request: %d", code)
					}
				}
				if serve(h, mwReq("192.0.2.1:1")).Code == http.StatusOK {
					admitted++
				}
			}
			if admitted != tc.want {
				t.Fatalf("admitted %d of the %d requests after the slow one, want %d", admitted, len(tc.steps), tc.want)
			}
		})
	}
}

// TestRefundBusyBucket: a request charged in a bucket that was not full,
// refunded after its handler took one emission interval, gets its token
// back: its units had not begun to come back (those charged before it
// come back first).
func TestRefundBusyBucket(t *testing.T) {
	var clk *core.FakeClock
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			clk.Advance(100 * time.Millisecond) // works 100 ms, then fails
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	// 10 a second, a bucket of 10: one token per 100 ms.
	_, h, c := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "b", Limit: 10, Window: time.Second}}},
		next, ratelimit.WithRefund(ratelimit.RefundFailed))
	clk = c
	for i := range 9 {
		if code := serve(h, mwReq("192.0.2.1:1")).Code; code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	slow := mwReq("192.0.2.1:1")
	slow.Header.Set("X-Slow", "1")
	if code := serve(h, slow).Code; code != http.StatusBadGateway {
		t.Fatalf("slow request: %d", code)
	}
	// As if the slow request had never been made: 9 charged at 0, one
	// token back by 100 ms, so 2 are admitted now.
	admitted := 0
	for range 5 {
		if serve(h, mwReq("192.0.2.1:1")).Code == http.StatusOK {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("after the refund of a failed request: %d admitted at 100ms, want 2", admitted)
	}
}

// TestRefundCopiesRace: refunding one copy of a Result while another copy's
// Layers are read is no data race (run with -race).
func TestRefundCopiesRace(t *testing.T) {
	l, _, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(3).Named("per-ip")}}, http.NotFoundHandler())
	l.Decide(mwReq("192.0.2.1:1"))
	res := l.Decide(mwReq("192.0.2.1:1"))
	logged := res // a copy handed to a logger
	done := make(chan error)
	go func() { done <- l.Refund(context.Background(), &res) }()
	var names []string
	for _, lr := range logged.Layers {
		names = append(names, lr.Decision.Policy.Name())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "per-ip" {
		t.Fatalf("layers read: %v", names)
	}
	if err := l.Refund(context.Background(), &logged); err != nil {
		t.Fatal(err)
	}
	// Two charged, one of them refunded (once): one more leaves 1.
	if d := l.Peek(mwReq("192.0.2.1:1")); d.Layers[0].Decision.Remaining != 1 {
		t.Fatalf("after one of two charges refunded through two copies: Remaining after one more %d, want 1", d.Layers[0].Decision.Remaining)
	}
}

// TestRefundAfterAppendToLayers: a caller appending to a Result's Layers
// (its own list) does not reset the claim that refunds the charge once.
func TestRefundAfterAppendToLayers(t *testing.T) {
	l, _, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.Global("k"), Rule: core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 2, Window: time.Hour}}}, loginHandler)
	a := l.Decide(mwReq("192.0.2.1:1"))
	if b := l.Decide(mwReq("192.0.2.1:1")); !a.Proceed || !b.Proceed {
		t.Fatal("not admitted")
	}
	if err := l.Refund(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	_ = append(a.Layers, ratelimit.LayerResult{Key: "extra"})
	if err := l.Refund(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	if c, d := l.Decide(mwReq("192.0.2.1:1")), l.Decide(mwReq("192.0.2.1:1")); c.Proceed && d.Proceed {
		t.Fatal("the charge was refunded twice: two more admitted beside the one kept, in a window of 2")
	}
}

// slowRefundStore is a MemoryStore whose refunds take 3s of clk's time
// and fail.
type slowRefundStore struct {
	*core.MemoryStore
	clk *core.FakeClock
}

func (s slowRefundStore) Refund(context.Context, time.Time, []core.Request) error {
	s.clk.Advance(3 * time.Second)
	return errors.New("refund failed")
}

// TestLimiterRefundFailureReported: a refund through Limiter.Refund that
// fails is returned, reported to the Observer and logged once, as
// WithRefund's are.
func TestLimiterRefundFailureReported(t *testing.T) {
	logs, logOpt := newLogBuf()
	obs := &mwObserver{}
	clk := core.NewFakeClock(mwT0)
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5)}},
		ratelimit.WithClock(clk), logOpt, ratelimit.WithObserver(obs),
		ratelimit.WithStore(slowRefundStore{core.MustMemoryStore(nil), clk}))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res := l.Decide(mwReq("192.0.2.1:1"))
		if err := l.Refund(context.Background(), &res); err == nil {
			t.Fatal("the refund succeeded")
		}
	}
	nerr := obs.errCount()
	if nerr != 2 {
		t.Errorf("%d errors reported to the Observer, want 2", nerr)
	}
	if n := logs.count("refunding a request failed"); n != 1 {
		t.Errorf("logged %d times:\n%s", n, logs)
	}
}

// ctxRefundStore is a MemoryStore whose Refund, as a network store's does,
// fails with the context's error once it has ended.
type ctxRefundStore struct{ *core.MemoryStore }

func (s ctxRefundStore) Refund(ctx context.Context, now time.Time, reqs []core.Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.MemoryStore.Refund(ctx, now, reqs)
}

// TestRefundClientGoneNotReported: Limiter.Refund with a context that has
// ended (the request's, after its client hung up) returns the context's
// error, which is no store failure: neither reported to the Observer nor
// logged as a failed refund.
func TestRefundClientGoneNotReported(t *testing.T) {
	logs, logOpt := newLogBuf()
	obs := &mwObserver{}
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5)}},
		ratelimit.WithClock(core.NewFakeClock(mwT0)), logOpt, ratelimit.WithObserver(obs),
		ratelimit.WithStore(ctxRefundStore{core.MustMemoryStore(nil)}))
	if err != nil {
		t.Fatal(err)
	}
	res := l.Decide(mwReq("192.0.2.1:1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Refund(ctx, &res); !errors.Is(err, context.Canceled) {
		t.Fatalf("refund: %v, want context.Canceled", err)
	}
	n := obs.errCount()
	if n != 0 {
		t.Errorf("%d errors reported to the Observer", n)
	}
	if logs.count("refunding a request failed") != 0 {
		t.Errorf("logged:\n%s", logs)
	}
}

// plainStore hides a store's optional methods: a core.Store that is not a
// core.Refunder.
type plainStore struct{ core.Store }

// TestRefundStoreThatCannotRefund: Limiter.Refund over a store that is not
// a core.Refunder returns an error wrapping core.ErrUnsupported for a
// charge, and nil for a Result that charged nothing (only a concurrency
// layer applied: a slot is no charge).
func TestRefundStoreThatCannotRefund(t *testing.T) {
	l, err := ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.User(), Rule: core.PerMinute(5).Named("user")},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
	}, ratelimit.WithStore(plainStore{core.MustMemoryStore(nil)}))
	if err != nil {
		t.Fatal(err)
	}
	slotOnly := l.Decide(getFrom("192.0.2.1")) // anonymous: the user layer is skipped
	defer slotOnly.Release()
	if err := l.Refund(context.Background(), &slotOnly); err != nil {
		t.Errorf("a Result holding only a slot: %v, want nil", err)
	}
	charged := l.Decide(mwUserReq("192.0.2.1:1", "alice"))
	defer charged.Release()
	if err := l.Refund(context.Background(), &charged); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("a charge: %v, want core.ErrUnsupported", err)
	}
}

// TestRefundFailureLatency: a failed refund's latency, as the Observer
// sees it, is measured on the Limiter's clock, as every other latency.
func TestRefundFailureLatency(t *testing.T) {
	obs := &mwObserver{}
	clk := core.NewFakeClock(mwT0)
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5)}},
		ratelimit.WithClock(clk), ratelimit.WithLogger(nil), ratelimit.WithStore(slowRefundStore{core.MustMemoryStore(nil), clk}),
		ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	if rec := serve(l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), mwReq("192.0.2.1:1")); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) != 1 || obs.errs[0].Latency != 3*time.Second {
		t.Fatalf("observed %+v, want one error with the refund's 3s", obs.errs)
	}
}

// TestRefundStatusAfterUnsupportedFlush: behind http.TimeoutHandler, where
// the README places the limiter, the writer cannot flush, so a handler's
// flush starts no response and the status it writes next is the client's:
// WithRefund decides by that status.
func TestRefundStatusAfterUnsupportedFlush(t *testing.T) {
	got := 0
	l, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10)}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := http.NewResponseController(w).Flush(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("flush behind TimeoutHandler: %v, want http.ErrNotSupported", err)
			}
			http.Error(w, "backend down", http.StatusInternalServerError)
		}),
		ratelimit.WithRefund(func(r *http.Request, status int) bool { got = status; return status >= 500 }))
	rec := httptest.NewRecorder()
	http.TimeoutHandler(h, time.Minute, "timeout").ServeHTTP(rec, mwReq("192.0.2.1:1"))
	if rec.Code != http.StatusInternalServerError || got != http.StatusInternalServerError {
		t.Fatalf("the client got %d, WithRefund saw %d; want 500 both", rec.Code, got)
	}
	if res := l.Peek(mwReq("192.0.2.1:1")); res.Layers[0].Decision.Remaining != 9 {
		t.Errorf("after a refunded 500, Remaining after one more request %d, want 9", res.Layers[0].Decision.Remaining)
	}
}

// Writers with some of the optional interfaces, for
// TestRefundKeepsWriterInterfaces.
type (
	plainWriter struct{ h http.Header }
	// flushFailWriter flushes with an error, as net/http's response does
	// for a client gone.
	flushFailWriter struct{ plainWriter }
	// fullWriter has every optional interface.
	fullWriter struct {
		plainWriter
		flushed, hijacked, readFrom bool
		pushed                      []string
	}
)

var errFlushFailed = errors.New("flush: connection reset")

func (w *plainWriter) Header() http.Header         { return w.h }
func (w *plainWriter) WriteHeader(int)             {}
func (w *plainWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *flushFailWriter) FlushError() error       { return errFlushFailed }
func (w *fullWriter) Flush()                       { w.flushed = true }
func (w *fullWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.hijacked = true
	return nil, nil, nil
}
func (w *fullWriter) Push(target string, _ *http.PushOptions) error {
	w.pushed = append(w.pushed, target)
	return nil
}
func (w *fullWriter) ReadFrom(r io.Reader) (int64, error) {
	w.readFrom = true
	return io.Copy(io.Discard, r)
}

// TestRefundKeepsWriterInterfaces: under WithRefund the handler's writer
// has http.Flusher, http.Hijacker and http.Pusher exactly when the
// server's writer has them, io.Copy reaches the server's io.ReaderFrom, and
// a flush's error (http.ErrNotSupported where it cannot flush) reaches
// http.ResponseController, as without WithRefund.
func TestRefundKeepsWriterInterfaces(t *testing.T) {
	for _, refund := range []bool{false, true} {
		var opts []ratelimit.Option
		if refund {
			opts = append(opts, ratelimit.WithRefund(ratelimit.RefundFailed))
		}
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100)}},
			append(opts, ratelimit.WithClock(core.NewFakeClock(mwT0)))...))
		serveWith := func(w http.ResponseWriter, f func(w http.ResponseWriter)) {
			l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(w) })).ServeHTTP(w, mwReq("192.0.2.1:1"))
		}
		has := func(w http.ResponseWriter) (f, h, p bool) {
			_, f = w.(http.Flusher)
			_, h = w.(http.Hijacker)
			_, p = w.(http.Pusher)
			return f, h, p
		}

		serveWith(&plainWriter{h: http.Header{}}, func(w http.ResponseWriter) {
			if f, h, p := has(w); f || h || p {
				t.Errorf("refund %v: over a writer with no optional interface the handler's claims Flusher %v, Hijacker %v, Pusher %v", refund, f, h, p)
			}
			if err := http.NewResponseController(w).Flush(); !errors.Is(err, http.ErrNotSupported) {
				t.Errorf("refund %v: flush over a writer that cannot: %v, want http.ErrNotSupported", refund, err)
			}
		})
		serveWith(&flushFailWriter{plainWriter{h: http.Header{}}}, func(w http.ResponseWriter) {
			if err := http.NewResponseController(w).Flush(); !errors.Is(err, errFlushFailed) {
				t.Errorf("refund %v: a failed flush gave %v, want the server's error", refund, err)
			}
		})
		full := &fullWriter{plainWriter: plainWriter{h: http.Header{}}}
		serveWith(full, func(w http.ResponseWriter) {
			if f, h, p := has(w); !f || !h || !p {
				t.Fatalf("refund %v: over a writer with every optional interface the handler's claims Flusher %v, Hijacker %v, Pusher %v", refund, f, h, p)
			}
			w.(http.Flusher).Flush()
			_ = w.(http.Pusher).Push("/style.css", nil)
			_, _, _ = w.(http.Hijacker).Hijack()
			_, _ = io.Copy(w, io.LimitReader(strings.NewReader("file"), 1<<20))
		})
		if !full.flushed || !full.hijacked || !full.readFrom || len(full.pushed) != 1 {
			t.Errorf("refund %v: the server's writer saw flush %v, hijack %v, ReadFrom %v, pushes %v; want all", refund, full.flushed, full.hijacked, full.readFrom, full.pushed)
		}
	}
}

// shapedRefundDelays serves four requests of one key under rule with
// WithRefund(RefundFailed): A, whose handler fails (and is refunded) once
// B and C have been booked behind it, while whileA has run; then D. It
// returns the delays B, C and D were given.
func shapedRefundDelays(t *testing.T, rule core.Rule, whileA func(l *ratelimit.Limiter)) []time.Duration {
	t.Helper()
	clk := core.NewFakeClock(mwT0)
	inA := make(chan struct{})
	releaseA := make(chan struct{})
	var once sync.Once
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isA := false
		once.Do(func() { isA = true })
		if isA {
			close(inA)
			<-releaseA
			w.WriteHeader(http.StatusBadGateway) // refunded
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: rule}},
		ratelimit.WithClock(clk), ratelimit.WithLogger(nil), ratelimit.WithRefund(ratelimit.RefundFailed))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delays []time.Duration
	ratelimit.SetWaitFunc(l, func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
		return nil
	})
	h := l.Handler(next)
	done := make(chan struct{})
	go func() {
		serve(h, mwReq("192.0.2.1:1"))
		close(done)
	}()
	<-inA
	if whileA != nil {
		whileA(l)
	}
	for i := 0; i < 2; i++ { // B and C, booked while A runs
		if rec := serve(h, mwReq("192.0.2.1:1")); rec.Code != 200 {
			t.Fatalf("B/C: %d", rec.Code)
		}
	}
	close(releaseA)
	<-done
	serve(h, mwReq("192.0.2.1:1")) // D
	mu.Lock()
	defer mu.Unlock()
	return delays
}

// TestRefundShapingLayerKeepsCharge: a shaping leaky bucket (1 per second,
// requests spaced 1s apart) with WithRefund. A is served at once and its
// handler is still running when B and C are booked 1s and 2s later. A's
// handler fails and A is refunded. D, the next request, must be booked
// after C (3s): a refund would give back the bucket's latest unit, C's
// slot in the schedule, and release C and D at the same instant, so a
// shaping layer keeps its charge.
func TestRefundShapingLayerKeepsCharge(t *testing.T) {
	delays := shapedRefundDelays(t, core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}, nil)
	if len(delays) != 3 || delays[2] <= delays[1] {
		t.Fatalf("delays B, C, D = %v: D is released together with C (or before it)", delays)
	}
}

// TestRefundAfterResetKeepsLaterCharges: the Reset doc's use case ("after
// a successful login, say") with WithRefund(RefundSuccessful) (count only
// failed logins): a successful login resets its client's quota and is
// refunded when it returns. Failed logins charged while it ran (after the
// reset) must all stay charged: 5 of them spend the quota of 5, and the
// 6th is refused.
func TestRefundAfterResetKeepsLaterCharges(t *testing.T) {
	clk := core.NewFakeClock(mwT0)
	var l *ratelimit.Limiter
	inGood := make(chan struct{})
	releaseGood := make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Password") == "good" {
			if err := l.Reset(r.Context(), "login", "192.0.2.1"); err != nil {
				t.Error(err)
			}
			close(inGood)
			<-releaseGood
			_, _ = w.Write([]byte("welcome"))
			return
		}
		http.Error(w, "wrong password", http.StatusUnauthorized)
	})
	var err error
	l, err = ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "login", Limit: 5, Window: 15 * time.Minute}}},
		ratelimit.WithClock(clk), ratelimit.WithLogger(nil), ratelimit.WithRefund(ratelimit.RefundSuccessful))
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(next)
	done := make(chan struct{})
	go func() {
		serve(h, mwReq("192.0.2.1:1", "Password", "good"))
		close(done)
	}()
	<-inGood
	for i := 0; i < 5; i++ { // failed logins while the good one runs, after its reset
		if rec := serve(h, mwReq("192.0.2.1:1", "Password", "bad")); rec.Code != 401 {
			t.Fatalf("failed login %d: %d", i+1, rec.Code)
		}
	}
	close(releaseGood)
	<-done
	if rec := serve(h, mwReq("192.0.2.1:1", "Password", "bad")); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("6th failed login since the reset: %d, want 429 (the refund of the successful login gave back a failed login's charge)", rec.Code)
	}
}

// TestRefundAfterSetRulesMakesShapingKeepsCharge: A is charged under a
// meter LeakyBucket (no MaxDelay); while its handler runs, SetRules makes
// the layer shaping (MaxDelay). B and C are booked behind A (delays 1s,
// 2s). A's refund would be made under the rule in force, a shaping one,
// and give back the bucket's latest units, releasing D together with C:
// A keeps its charge, and D is booked after C.
func TestRefundAfterSetRulesMakesShapingKeepsCharge(t *testing.T) {
	delays := shapedRefundDelays(t, core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second}, func(l *ratelimit.Limiter) {
		if err := l.SetRules(map[string]core.Rule{"shape": {Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}}); err != nil {
			t.Fatal(err)
		}
	})
	if len(delays) != 3 || delays[2] <= delays[1] {
		t.Fatalf("delays B, C, D = %v: D is released together with C (or before it)", delays)
	}
}

// hookStore is a MemoryStore whose Reset runs afterReset once the state is
// reset and before Reset returns: what another goroutine may do meanwhile.
type hookStore struct {
	*core.MemoryStore
	afterReset func()
	failReset  error
}

func (s *hookStore) Reset(ctx context.Context, p *core.Policy, key string) error {
	if s.failReset != nil {
		return s.failReset
	}
	if err := s.MemoryStore.Reset(ctx, p, key); err != nil {
		return err
	}
	if f := s.afterReset; f != nil {
		s.afterReset = nil
		f()
	}
	return nil
}

// TestRefundDuringResetKeepsLaterCharges: a request charged before a
// reset, refunded while the store's Reset call is still returning (a
// Redis round trip), keeps its charge: its refund would give back a unit
// of a failed login charged after the reset, and a 6th failed login would
// pass a limit of 5.
func TestRefundDuringResetKeepsLaterCharges(t *testing.T) {
	clk := core.NewFakeClock(mwT0)
	ms, err := core.NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &hookStore{MemoryStore: ms}
	inGood := make(chan struct{})
	releaseGood := make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Password") == "good" {
			close(inGood)
			<-releaseGood
			_, _ = w.Write([]byte("welcome"))
			return
		}
		http.Error(w, "wrong password", http.StatusUnauthorized)
	})
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "login", Limit: 5, Window: 15 * time.Minute}}},
		ratelimit.WithStore(st), ratelimit.WithClock(clk), ratelimit.WithLogger(nil), ratelimit.WithRefund(ratelimit.RefundSuccessful))
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(next)
	done := make(chan struct{})
	go func() { // a successful login, charged before the reset
		serve(h, mwReq("192.0.2.1:1", "Password", "good"))
		close(done)
	}()
	<-inGood
	st.afterReset = func() {
		// The key is reset in the store; Limiter.Reset has not returned.
		for i := 0; i < 5; i++ {
			if rec := serve(h, mwReq("192.0.2.1:1", "Password", "bad")); rec.Code != 401 {
				t.Errorf("failed login %d: %d", i+1, rec.Code)
			}
		}
		close(releaseGood) // the successful login returns and is refunded
		<-done
	}
	if err := l.Reset(context.Background(), "login", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if rec := serve(h, mwReq("192.0.2.1:1", "Password", "bad")); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("6th failed login since the reset: %d, want 429", rec.Code)
	}
}

// TestRefundOfChargeAfterResetAtSameInstant: charges made after a Reset,
// at the same clock reading (a FakeClock's), are refunded: the reset log
// orders resets and charges by counting, not by the clock, and
// RefundSuccessful's successful logins never count.
func TestRefundOfChargeAfterResetAtSameInstant(t *testing.T) {
	l, h, _ := refundEnv(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "login", Limit: 5, Window: 15 * time.Minute}}}, loginHandler, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	serve(h, mwReq("192.0.2.1:1", "Password", "bad"))
	if err := l.Reset(context.Background(), "login", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // charged after the reset, then refunded
		if rec := serve(h, mwReq("192.0.2.1:1", "Password", "good")); rec.Code != http.StatusOK {
			t.Fatalf("login %d: %d", i, rec.Code)
		}
	}
	if rem := l.Peek(mwReq("192.0.2.1:1")).Layers[0].Decision.Remaining; rem != 4 {
		t.Fatalf("Remaining after one more request: %d, want 4 (the 3 successful logins since the reset kept their charge)", rem)
	}
}

// TestRefundSees101 checks that WithRefund sees 101 Switching Protocols,
// which net/http sends as the final status (a later WriteHeader is
// ignored), not a status the handler writes after it.
func TestRefundSees101(t *testing.T) {
	got := make(chan int, 1)
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Global("g"), Rule: core.PerMinute(10)}},
		ratelimit.WithRefund(func(r *http.Request, status int) bool { got <- status; return false }))
	srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "x")
		w.WriteHeader(http.StatusSwitchingProtocols)
		w.WriteHeader(http.StatusInternalServerError) // superfluous: the client got 101
	})))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, " 101 ") {
		t.Fatalf("the client got %q, want 101", strings.TrimSpace(line))
	}
	select {
	case s := <-got:
		if s != http.StatusSwitchingProtocols {
			t.Fatalf("WithRefund saw %d, want 101", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WithRefund's function was not called")
	}
}

// reloadLimiter returns a Limiter of one per-IP layer under rule, on a fake
// clock at a multiple of 120 s (so that windows of 1 and 2 minutes start
// there), the clock, and a function deciding a request of one client.
func reloadLimiter(t *testing.T, rule core.Rule) (*ratelimit.Limiter, *core.FakeClock, func() ratelimit.Result) {
	t.Helper()
	return reloadLayer(t, ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: rule})
}

// reloadLayer is reloadLimiter for a Limiter of the one layer ly.
func reloadLayer(t *testing.T, ly ratelimit.Layer) (*ratelimit.Limiter, *core.FakeClock, func() ratelimit.Result) {
	t.Helper()
	clk := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l, err := ratelimit.New([]ratelimit.Layer{ly},
		ratelimit.WithClock(clk), ratelimit.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	return l, clk, func() ratelimit.Result { return l.Decide(mwReq("192.0.2.1:1")) }
}

// TestRefundAfterSetRulesNeverCredits: a request charged under the old rule
// whose unit came back before the first request under the new rule met
// the key (so it was not carried over) is refunded after the change. The
// new rule, a window finding the charge's time in its current window,
// would give back the unit of a request charged under it; the charge is
// kept, and the new rule admits no more than its limit.
func TestRefundAfterSetRulesNeverCredits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new core.Rule
		wait     time.Duration // between the reload and the first request under the new rule
	}{
		{"fixed 5/1m -> fixed 10/2m", core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute},
			core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 10, Window: 2 * time.Minute}, 61 * time.Second},
		{"token 5/1m -> fixed 5/1m", core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute},
			core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute}, 30 * time.Second},
		{"token 5/1m -> sliding counter 5/1m", core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute},
			core.Rule{Name: "per-ip", Algorithm: core.SlidingWindowCounter, Limit: 5, Window: time.Minute}, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, clk, decide := reloadLimiter(t, tc.old)
			a := decide() // a slow request, charged under the old rule
			if !a.Proceed {
				t.Fatal("first request refused")
			}
			if err := l.SetRules(map[string]core.Rule{"per-ip": tc.new}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(tc.wait) // a's unit has recovered under the old rule
			admitted := 0
			if decide().Proceed { // b, the first request under the new rule
				admitted++
			}
			if err := l.Refund(context.Background(), &a); err != nil { // a ends: refunded (WithRefund would do the same)
				t.Fatal(err)
			}
			for i := 0; i < 100; i++ {
				if decide().Proceed {
					admitted++
				}
			}
			if admitted > int(tc.new.Limit) {
				t.Errorf("the new rule %d/%v admitted %d requests in one window at one instant (the refund of a charge never carried over gave back another request's unit)",
					tc.new.Limit, tc.new.Window, admitted)
			}
		})
	}
}

// TestRefundAfterSetRulesAndBack: A -> B -> A. The key's record was
// converted to B and back to A, so it holds only the units in use at the
// last conversion; a's charge, made under A before the first change, is
// kept, and rule A admits no more than its limit.
func TestRefundAfterSetRulesAndBack(t *testing.T) {
	ruleA := core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute}
	ruleB := core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute} // token bucket
	l, clk, decide := reloadLimiter(t, ruleA)
	a := decide() // a slow request charged under A at t0
	if !a.Proceed {
		t.Fatal("a refused")
	}
	if err := l.SetRules(map[string]core.Rule{"per-ip": ruleB}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if !decide().Proceed { // b: converts A's record (a's unit) to B
		t.Fatal("b refused")
	}
	clk.Advance(30 * time.Second) // B's bucket gives a's and b's units back
	if err := l.SetRules(map[string]core.Rule{"per-ip": ruleA}); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	if decide().Proceed { // c: converts B's record (nothing in use) to A, window [t0, t0+60s)
		admitted++
	}
	if err := l.Refund(context.Background(), &a); err != nil { // a ends: refunded
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if decide().Proceed {
			admitted++
		}
	}
	if admitted > int(ruleA.Limit) {
		t.Errorf("after A->B->A, rule A %d/%v admitted %d requests at one instant: the refund of a's charge gave back c's unit",
			ruleA.Limit, ruleA.Window, admitted)
	}
}

// TestRefundHandBuiltAfterSetRules: a Result built by hand from a
// decision's layers (no rule set recorded, also after WriteHeaders) and
// refunded after SetRules changed the layer's rule keeps the charge, as
// Decide's Result does; without a change (the same rule set again), the
// refund is made.
func TestRefundHandBuiltAfterSetRules(t *testing.T) {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("per-ip")}},
		ratelimit.WithClock(core.NewFakeClock(time.Unix(1_800_000_000, 0))), ratelimit.WithLogger(nil)))
	a := l.Decide(mwReq("192.0.2.1:1"))
	hb := ratelimit.Result{Proceed: true, Layers: a.Layers}
	// The same rule set again changes nothing a refund needs.
	if err := l.SetRules(map[string]core.Rule{"per-ip": core.PerHour(1).Named("per-ip")}); err != nil {
		t.Fatal(err)
	}
	l.WriteHeaders(http.Header{}, &hb)
	if err := l.Refund(context.Background(), &hb); err != nil {
		t.Fatal(err)
	}
	if !l.Decide(mwReq("192.0.2.1:1")).Proceed {
		t.Fatal("a hand-built Result under the rules in force (set again) was not refunded")
	}

	// With or without a Resolver (one that returns nil: the layer's own
	// rule decides), the layer keeps its charge once its rule changed.
	none := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return nil, nil })
	for _, c := range []struct {
		writeHeaders bool
		resolver     core.Resolver
	}{{false, nil}, {true, nil}, {false, none}} {
		writeHeaders := c.writeHeaders
		old := core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute}
		nw := core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 10, Window: 2 * time.Minute}
		l, clk, decide := reloadLayer(t, ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: old, Resolver: c.resolver})
		a := decide()
		if !a.Proceed {
			t.Fatal("a refused")
		}
		hb := ratelimit.Result{Proceed: true, Layers: a.Layers} // built by hand
		if err := l.SetRules(map[string]core.Rule{"per-ip": nw}); err != nil {
			t.Fatal(err)
		}
		if writeHeaders {
			l.WriteHeaders(httptest.NewRecorder().Header(), &hb)
		}
		clk.Advance(61 * time.Second)
		admitted := 0
		if decide().Proceed {
			admitted++
		}
		if err := l.Refund(context.Background(), &hb); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 100; i++ {
			if decide().Proceed {
				admitted++
			}
		}
		if admitted > int(nw.Limit) {
			t.Errorf("writeHeaders=%v, Resolver %v: new rule %d/%v admitted %d at one instant after refunding a hand-built Result",
				writeHeaders, c.resolver != nil, nw.Limit, nw.Window, admitted)
		}
	}
}
