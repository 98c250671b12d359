package ratelimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// mwT0 is the fake clock's starting time in these tests.
var mwT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// mwOK answers 200 "ok".
var mwOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// mwEnv is a Limiter on a fake clock, wrapping a handler that counts the
// requests it serves.
type mwEnv struct {
	clk    *core.FakeClock
	l      *ratelimit.Limiter
	h      http.Handler
	served atomic.Int64
}

// mwLimiter builds a Limiter on a fake clock at mwT0.
func mwLimiter(t testing.TB, layers []ratelimit.Layer, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	return mwNew(t, layers, opts...).l
}

func mwNew(t testing.TB, layers []ratelimit.Layer, opts ...ratelimit.Option) *mwEnv {
	t.Helper()
	e := &mwEnv{clk: core.NewFakeClock(mwT0)}
	// The one-time warnings are silenced unless a test sets a logger.
	l, err := ratelimit.New(layers, append([]ratelimit.Option{ratelimit.WithClock(e.clk), ratelimit.WithLogger(nil)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.l = l
	e.h = l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.served.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	return e
}

func (e *mwEnv) do(t testing.TB, r *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, r)
	return rec
}

// mwReq is a GET / from remoteAddr with header name/value pairs.
func mwReq(remoteAddr string, kv ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

// mwUserReq is mwReq with an authenticated user in the context.
func mwUserReq(remoteAddr, user string, kv ...string) *http.Request {
	r := mwReq(remoteAddr, kv...)
	return r.WithContext(ratelimit.WithUser(r.Context(), user))
}

// mwObserver records decisions and errors.
type mwObserver struct {
	core.NopObserver
	mu        sync.Mutex
	decisions []core.DecisionEvent
	errs      []core.ErrorEvent
}

func (o *mwObserver) ObserveDecision(e core.DecisionEvent) {
	o.mu.Lock()
	o.decisions = append(o.decisions, e)
	o.mu.Unlock()
}

func (o *mwObserver) ObserveError(e core.ErrorEvent) {
	o.mu.Lock()
	o.errs = append(o.errs, e)
	o.mu.Unlock()
}

// errCount returns the number of errors observed so far.
func (o *mwObserver) errCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.errs)
}

// mwFailStore is a Store that always fails.
type mwFailStore struct{ calls atomic.Int64 }

var errBackendDown = errors.New("backend down")

func (s *mwFailStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	s.calls.Add(1)
	return errBackendDown
}

func TestNewErrors(t *testing.T) {
	ip := ratelimit.MustClientIP()
	ok := ratelimit.Layer{Key: ip, Rule: core.PerMinute(10).Named("per-ip")}
	many := make([]ratelimit.Layer, core.MaxBatch+1)
	for i := range many {
		many[i] = ratelimit.Layer{Key: ip, Rule: core.PerMinute(10).Named("l" + strconv.Itoa(i))}
	}
	cases := []struct {
		name   string
		layers []ratelimit.Layer
		opts   []ratelimit.Option
		is     error
		msg    string
	}{
		{"no-layers", nil, nil, nil, "no layers"},
		{"too-many-layers", many, nil, nil, "at most 16"},
		{"nil-key", []ratelimit.Layer{{Rule: core.PerMinute(1)}}, nil, nil, "has no Key"},
		{"invalid-rule", []ratelimit.Layer{{Key: ip, Rule: core.Rule{Limit: 0, Window: time.Second}}}, nil, core.ErrInvalidRule, "Limit"},
		{"duplicate-names", []ratelimit.Layer{{Key: ip, Rule: core.PerMinute(1)}, {Key: ratelimit.User(), Rule: core.PerMinute(2)}}, nil, nil, `both named "default"`},
		{"bad-cidr", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRs("10.0.0.0/8", "10.0.0/33")}, nil, "invalid CIDR"},
		{"no-cidrs", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRs()}, nil, "no CIDRs"},
		{"skip-every-ipv4", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRs("10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1")}, nil, "WithSkipCIDRs: the entries cover every IPv4 address"},
		{"skip-every-ipv4-mapped", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRs("::ffff:0:0/96")}, nil, "cover every IPv4 address"},
		{"skip-every-ipv6", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRsFrom(ip, "::/1", "8000::/1")}, nil, "WithSkipCIDRsFrom: the entries cover every IPv6 address"},
		{"nil-skip-ip", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkipCIDRsFrom(nil, "10.0.0.0/8")}, nil, "nil key function"},
		{"max-waiting", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithMaxWaiting(0)}, nil, "at least 1"},
		{"header-set", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithHeaders(0x80)}, nil, "unknown header set"},
		{"nil-store", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithStore(nil)}, nil, "nil store"},
		{"nil-clock", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithClock(nil)}, nil, "nil clock"},
		{"nil-observer", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithObserver(nil)}, nil, "nil observer"},
		{"nil-error-handler", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithErrorHandler(nil)}, nil, "nil handler"},
		{"nil-denied-handler", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithDeniedHandler(nil)}, nil, "nil handler"},
		{"nil-cost", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithCost(nil)}, nil, "nil function"},
		{"nil-skip", []ratelimit.Layer{ok}, []ratelimit.Option{ratelimit.WithSkip(nil)}, nil, "nil function"},
		{"nil-option", []ratelimit.Layer{ok}, []ratelimit.Option{nil}, nil, "nil Option"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ratelimit.New(tc.layers, tc.opts...)
			if err == nil || l != nil {
				t.Fatalf("New = %v, %v; want an error", l, err)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q: want prefix %q and %q", err, "ratelimit: ", tc.msg)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v does not wrap %v", err, tc.is)
			}
			if _, err := ratelimit.Middleware(tc.layers, tc.opts...); err == nil {
				t.Error("Middleware: no error")
			}
		})
	}
	t.Run("must-panics", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("Must did not panic")
			}
		}()
		ratelimit.Must(ratelimit.New(nil))
	})
	t.Run("handler-nil-panics", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("Handler(nil) did not panic")
			}
		}()
		ratelimit.Must(ratelimit.New([]ratelimit.Layer{ok})).Handler(nil)
	})
}

// TestRetryAfterNeverEarly exhausts a key under every algorithm, then checks
// that Retry-After seconds later the client is admitted, and one second
// earlier it is not.
func TestRetryAfterNeverEarly(t *testing.T) {
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Algorithm: alg, Limit: 3, Window: 10 * time.Second}}})
			e.clk.Advance(1234 * time.Millisecond) // off a window boundary
			var rec *httptest.ResponseRecorder
			admitted := 0
			for {
				rec = e.do(t, mwReq("192.0.2.1:1"))
				if rec.Code != http.StatusOK {
					break
				}
				if admitted++; admitted > 3 {
					t.Fatal("more than Limit admitted")
				}
			}
			if rec.Code != http.StatusTooManyRequests {
				t.Fatalf("status %d", rec.Code)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") || rec.Body.Len() == 0 || rec.Body.Len() > 64 {
				t.Errorf("429 body %q (%s): want short text", rec.Body, ct)
			}
			if got := rec.Header().Get(ratelimit.HeaderRateLimitRemaining); got != "0" {
				t.Errorf("Remaining = %q, want 0", got)
			}
			ra, err := strconv.Atoi(rec.Header().Get(ratelimit.HeaderRetryAfter))
			if err != nil || ra < 1 {
				t.Fatalf("Retry-After %q", rec.Header().Get(ratelimit.HeaderRetryAfter))
			}
			if ra > 1 {
				e.clk.Advance(time.Duration(ra-1) * time.Second)
				if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusTooManyRequests {
					t.Fatalf("admitted %v before Retry-After %ds", time.Duration(ra-1)*time.Second, ra)
				}
				e.clk.Advance(time.Second)
			} else {
				e.clk.Advance(time.Second)
			}
			if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusOK {
				t.Fatalf("refused (%d) after waiting Retry-After %ds", rec.Code, ra)
			}
		})
	}
}

// mwLayered returns the per-IP (5/min) and per-user (2/min) layers.
func mwLayered() []ratelimit.Layer {
	return []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(2).Named("per-user")},
	}
}

// TestLayeredNoDoubleCharge checks that a request refused by the per-user
// layer charges neither layer, and that anonymous requests meet only the
// per-IP layer.
func TestLayeredNoDoubleCharge(t *testing.T) {
	e := mwNew(t, mwLayered(), ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithResetDelta())
	const ip = "192.0.2.10:5555"
	steps := []struct {
		user      string
		code      int
		remaining string // X-RateLimit-Remaining
		state     string // RateLimit
		retry     string
	}{
		{"alice", 200, "1", `"per-ip";r=4;t=12, "per-user";r=1;t=30`, ""},
		{"alice", 200, "0", `"per-ip";r=3;t=24, "per-user";r=0;t=60`, ""},
		// Refused by per-user: per-ip still shows 3, nothing charged.
		{"alice", 429, "0", `"per-ip";r=3;t=24, "per-user";r=0;t=30`, "30"},
		{"alice", 429, "0", `"per-ip";r=3;t=24, "per-user";r=0;t=30`, "30"},
		// Anonymous: only per-ip applies; it speaks in the X- headers.
		{"", 200, "2", `"per-ip";r=2;t=36`, ""},
		// Another user behind the same IP shares the per-ip quota.
		{"bob", 200, "1", `"per-ip";r=1;t=48, "per-user";r=1;t=30`, ""},
		{"bob", 200, "0", `"per-ip";r=0;t=60, "per-user";r=0;t=60`, ""},
		// Now per-ip refuses bob; per-user is refused too (both speak in t).
		{"bob", 429, "0", `"per-ip";r=0;t=12, "per-user";r=0;t=30`, "30"},
		{"", 429, "0", `"per-ip";r=0;t=12`, "12"},
	}
	for i, s := range steps {
		r := mwReq(ip)
		if s.user != "" {
			r = mwUserReq(ip, s.user)
		}
		rec := e.do(t, r)
		h := rec.Header()
		if rec.Code != s.code || h.Get(ratelimit.HeaderRateLimitRemaining) != s.remaining ||
			h.Get(ratelimit.HeaderRateLimit) != s.state || h.Get(ratelimit.HeaderRetryAfter) != s.retry {
			t.Errorf("step %d (%q): got %d remaining=%q RateLimit=%q Retry-After=%q; want %d %q %q %q", i, s.user,
				rec.Code, h.Get(ratelimit.HeaderRateLimitRemaining), h.Get(ratelimit.HeaderRateLimit), h.Get(ratelimit.HeaderRetryAfter),
				s.code, s.remaining, s.state, s.retry)
		}
	}
	if got := e.served.Load(); got != 5 {
		t.Errorf("served %d, want 5", got)
	}
	// Decide reports which layer refused.
	res := e.l.Decide(mwUserReq(ip, "alice"))
	if res.Proceed || len(res.Layers) != 2 || !res.Layers[0].Refused || !res.Layers[1].Refused {
		t.Errorf("Decide: %+v", res)
	}
	res = e.l.Decide(mwUserReq("192.0.2.99:1", "alice"))
	if res.Proceed || res.Layers[0].Refused || !res.Layers[1].Refused || res.Layers[1].Decision.Policy.Name() != "per-user" {
		t.Errorf("Decide from a fresh IP: %+v", res)
	}
	if got := res.Layers[0].Decision.Remaining; got != 5 {
		t.Errorf("fresh IP charged by a refused request: remaining %d, want 5", got)
	}
	if got := res.RetryAfter(); got != 30*time.Second {
		t.Errorf("RetryAfter = %v, want 30s", got)
	}
}

// TestAllLayersSkipped checks that a request no layer applies to is served
// without headers and charges nothing.
func TestAllLayersSkipped(t *testing.T) {
	obs := &mwObserver{}
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(1).Named("per-user")}},
		ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithObserver(obs))
	for range 3 {
		rec := e.do(t, mwReq("192.0.2.1:1"))
		if rec.Code != 200 || len(rec.Header()) != 1 { // Content-Type only
			t.Errorf("status %d headers %v", rec.Code, rec.Header())
		}
	}
	if len(obs.decisions) != 0 {
		t.Errorf("observer saw %d decisions", len(obs.decisions))
	}
	res := e.l.Decide(mwReq("192.0.2.1:1"))
	if !res.Proceed || len(res.Layers) != 0 || res.Err != nil || res.Skipped {
		t.Errorf("Decide: %+v", res)
	}
}

// TestSpoofing checks that forged forwarding headers from an untrusted peer
// never change whose quota is charged.
func TestSpoofing(t *testing.T) {
	ip := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	e := mwNew(t, []ratelimit.Layer{{Key: ip, Rule: core.PerMinute(3).Named("per-ip")}})
	// An untrusted client rotates forged X-Forwarded-For values.
	for i := range 6 {
		rec := e.do(t, mwReq("203.0.113.7:4000", "X-Forwarded-For", "198.51.100."+strconv.Itoa(i), "X-Real-IP", "198.51.100.200"))
		want := http.StatusOK
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		if rec.Code != want {
			t.Errorf("forged request %d: status %d, want %d", i, rec.Code, want)
		}
	}
	res := e.l.Decide(mwReq("203.0.113.7:4000", "X-Forwarded-For", "198.51.100.1"))
	if len(res.Layers) != 1 || res.Layers[0].Key != "203.0.113.7" {
		t.Errorf("untrusted peer keyed as %+v", res.Layers)
	}
	// Through the trusted proxy, the forwarded client is keyed, and a
	// client-supplied leftmost entry is ignored.
	res = e.l.Decide(mwReq("10.1.2.3:80", "X-Forwarded-For", "1.1.1.1, 198.51.100.1"))
	if len(res.Layers) != 1 || res.Layers[0].Key != "198.51.100.1" || !res.Proceed {
		t.Errorf("trusted proxy: %+v", res)
	}
	// The forged-header client did not touch 198.51.100.1's quota: 3-1 = 2.
	if got := res.Layers[0].Decision.Remaining; got != 2 {
		t.Errorf("remaining %d, want 2", got)
	}
}

// TestKeyError checks that a key error answers 400 and charges no layer.
func TestKeyError(t *testing.T) {
	ip := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	obs := &mwObserver{}
	var handled []error
	layers := []ratelimit.Layer{
		{Key: ratelimit.Global("all"), Rule: core.PerMinute(1).Named("global")},
		{Key: ip, Rule: core.PerMinute(5).Named("per-ip")},
	}
	e := mwNew(t, layers, ratelimit.WithObserver(obs), ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		handled = append(handled, err) // logs only: the default answer follows
	}))
	rec := e.do(t, mwReq("10.0.0.1:80", "X-Forwarded-For", "not-an-ip"))
	if rec.Code != http.StatusBadRequest || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "" {
		t.Fatalf("status %d, headers %v", rec.Code, rec.Header())
	}
	if len(handled) != 1 || !errors.Is(handled[0], ratelimit.ErrInvalidClientIP) || !strings.Contains(handled[0].Error(), `"per-ip"`) {
		t.Errorf("error handler got %v", handled)
	}
	if len(obs.decisions) != 0 || e.served.Load() != 0 {
		t.Errorf("decisions %d, served %d: want none", len(obs.decisions), e.served.Load())
	}
	// The global layer's single token is still there.
	if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusOK || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "0" {
		t.Errorf("after key error: %d remaining %q", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitRemaining))
	}

	t.Run("empty-key", func(t *testing.T) {
		bad := ratelimit.KeyFunc(func(*http.Request) (string, error) { return "", nil })
		e := mwNew(t, []ratelimit.Layer{{Key: bad, Rule: core.PerMinute(1)}})
		for range 2 {
			if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusBadRequest {
				t.Errorf("status %d, want 400", rec.Code)
			}
		}
		if res := e.l.Decide(mwReq("192.0.2.1:1")); !errors.Is(res.Err, ratelimit.ErrEmptyKey) || res.Proceed {
			t.Errorf("Decide: %+v", res)
		}
	})
	t.Run("error-handler-writes", func(t *testing.T) {
		e := mwNew(t, []ratelimit.Layer{{Key: ip, Rule: core.PerMinute(1)}}, ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "custom", http.StatusTeapot)
		}))
		rec := e.do(t, mwReq("10.0.0.1:80", "X-Forwarded-For", "garbage"))
		if rec.Code != http.StatusTeapot || !strings.Contains(rec.Body.String(), "custom") {
			t.Errorf("got %d %q", rec.Code, rec.Body)
		}
	})
}

// TestSkip checks the skip predicate and the CIDR allowlists.
func TestSkip(t *testing.T) {
	rule := core.PerMinute(1).Named("per-ip")
	trusted := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	cases := []struct {
		name string
		opt  ratelimit.Option
		key  ratelimit.KeyFunc
		req  func() *http.Request
		skip bool
	}{
		{"predicate", ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }), nil,
			func() *http.Request { r := mwReq("192.0.2.1:1"); r.URL.Path = "/healthz"; return r }, true},
		{"predicate-other-path", ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }), nil,
			func() *http.Request { return mwReq("192.0.2.1:1") }, false},
		{"peer-in-cidr", ratelimit.WithSkipCIDRs("192.0.2.0/24"), nil,
			func() *http.Request { return mwReq("192.0.2.5:1") }, true},
		{"peer-bare-address", ratelimit.WithSkipCIDRs("192.0.2.5"), nil,
			func() *http.Request { return mwReq("192.0.2.5:1") }, true},
		{"peer-v4-mapped", ratelimit.WithSkipCIDRs("192.0.2.0/24"), nil,
			func() *http.Request { return mwReq("[::ffff:192.0.2.5]:1") }, true},
		{"peer-nat64", ratelimit.WithSkipCIDRs("192.0.2.0/24"), nil,
			func() *http.Request { return mwReq("[64:ff9b::192.0.2.5]:1") }, true},
		{"nat64-cidr", ratelimit.WithSkipCIDRs("64:ff9b::192.0.2.0/120"), nil,
			func() *http.Request { return mwReq("192.0.2.5:1") }, true},
		{"nat64-cidr-from", ratelimit.WithSkipCIDRsFrom(ratelimit.MustClientIP(), "64:ff9b::192.0.2.0/120"), nil,
			func() *http.Request { return mwReq("[64:ff9b::192.0.2.5]:1") }, true},
		{"peer-outside", ratelimit.WithSkipCIDRs("192.0.2.0/24"), nil,
			func() *http.Request { return mwReq("198.51.100.5:1") }, false},
		{"forged-xff-peer-mode", ratelimit.WithSkipCIDRs("192.0.2.0/24"), nil,
			func() *http.Request { return mwReq("198.51.100.5:1", "X-Forwarded-For", "192.0.2.5") }, false},
		{"from-trusted-proxy", ratelimit.WithSkipCIDRsFrom(trusted, "192.0.2.0/24"), trusted,
			func() *http.Request { return mwReq("10.0.0.1:1", "X-Forwarded-For", "192.0.2.5") }, true},
		{"from-untrusted-peer-forged", ratelimit.WithSkipCIDRsFrom(trusted, "192.0.2.0/24"), trusted,
			func() *http.Request { return mwReq("198.51.100.5:1", "X-Forwarded-For", "192.0.2.5") }, false},
		{"from-trusted-proxy-outside", ratelimit.WithSkipCIDRsFrom(trusted, "192.0.2.0/24"), trusted,
			func() *http.Request { return mwReq("10.0.0.1:1", "X-Forwarded-For", "198.51.100.5") }, false},
		{"from-garbage", ratelimit.WithSkipCIDRsFrom(trusted, "0.0.0.0/1", "128.0.0.0/2"), nil,
			func() *http.Request { return mwReq("10.0.0.1:1", "X-Forwarded-For", "garbage") }, false},
		{"v6-64-inside-48", ratelimit.WithSkipCIDRsFrom(ratelimit.MustClientIP(), "2001:db8:1::/48"), nil,
			func() *http.Request { return mwReq("[2001:db8:1:2::9]:1") }, true},
		{"v6-64-vs-host", ratelimit.WithSkipCIDRsFrom(ratelimit.MustClientIP(), "2001:db8:1:2::9"), nil,
			func() *http.Request { return mwReq("[2001:db8:1:2::9]:1") }, false},
		{"v6-128-vs-host", ratelimit.WithSkipCIDRsFrom(ratelimit.MustClientIP(ratelimit.IPv6Prefix(128)), "2001:db8:1:2::9"), nil,
			func() *http.Request { return mwReq("[2001:db8:1:2::9]:1") }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == nil {
				key = ratelimit.MustClientIP()
			}
			e := mwNew(t, []ratelimit.Layer{{Key: key, Rule: rule}}, tc.opt)
			for i := range 3 {
				rec := e.do(t, tc.req())
				skipped := rec.Header().Get(ratelimit.HeaderRateLimitLimit) == "" && rec.Code == http.StatusOK
				if tc.skip && !skipped {
					t.Fatalf("request %d: status %d headers %v: want skipped", i, rec.Code, rec.Header())
				}
				if !tc.skip && skipped && rec.Code != http.StatusBadRequest {
					t.Fatalf("request %d skipped", i)
				}
			}
			if res := e.l.Decide(tc.req()); res.Skipped != tc.skip || (tc.skip && (!res.Proceed || len(res.Layers) != 0)) {
				t.Errorf("Decide: %+v", res)
			}
		})
	}
}

// TestCost checks per-request costs, invalid costs and costs above capacity.
func TestCost(t *testing.T) {
	costHeader := func(r *http.Request) int64 {
		n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
		if err != nil {
			return 1
		}
		return n
	}
	var errs []error
	e := mwNew(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.Global("all"), Rule: core.PerMinute(100).Named("global"), Cost: func(*http.Request) int64 { return 2 }},
	}, ratelimit.WithCost(costHeader), ratelimit.WithHeaders(ratelimit.AllHeaders),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { errs = append(errs, err) }))

	rec := e.do(t, mwReq("192.0.2.1:1", "X-Cost", "4"))
	if rec.Code != 200 || rec.Header().Get(ratelimit.HeaderRateLimit) != `"per-ip";r=6;t=24, "global";r=98;t=2` {
		t.Fatalf("cost 4: %d %q", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	// Cost 0 is a request error: 400, nothing charged.
	rec = e.do(t, mwReq("192.0.2.1:1", "X-Cost", "0"))
	if rec.Code != http.StatusBadRequest || len(errs) != 1 || !errors.Is(errs[0], core.ErrInvalidCost) {
		t.Fatalf("cost 0: %d, errors %v", rec.Code, errs)
	}
	// Cost 11 > capacity 10: 413, no Retry-After, nothing charged, and the
	// error handler is not involved.
	rec = e.do(t, mwReq("192.0.2.1:1", "X-Cost", "11"))
	if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get(ratelimit.HeaderRetryAfter) != "" || len(errs) != 1 {
		t.Fatalf("cost 11: %d, Retry-After %q, errors %v", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter), errs)
	}
	res := e.l.Decide(mwReq("192.0.2.1:1", "X-Cost", "11"))
	if !errors.Is(res.Err, core.ErrCostExceedsCapacity) || res.Proceed || !res.Layers[0].Refused || res.Layers[1].Refused || res.RetryAfter() != 0 {
		t.Errorf("Decide cost 11: %+v", res)
	}
	rec = e.do(t, mwReq("192.0.2.1:1", "X-Cost", "6"))
	if rec.Code != 200 || rec.Header().Get(ratelimit.HeaderRateLimit) != `"per-ip";r=0;t=60, "global";r=96;t=3` {
		t.Fatalf("cost 6: %d %q", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	if got := e.served.Load(); got != 2 {
		t.Errorf("served %d, want 2", got)
	}

	// A cost above every layer's capacity (a hostile size): 413 from each
	// algorithm, every layer refused with no retry time, nothing charged.
	for _, alg := range core.Algorithms() {
		e := mwNew(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")},
			{Key: ratelimit.Global("all"), Rule: core.Rule{Name: "global", Algorithm: alg, Limit: 100, Window: time.Minute}},
		}, ratelimit.WithCost(costHeader))
		for _, c := range []string{"101", "4611686018427387904"} {
			if rec := e.do(t, mwReq("192.0.2.1:1", "X-Cost", c)); rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get(ratelimit.HeaderRetryAfter) != "" {
				t.Fatalf("%s, cost %s: %d, Retry-After %q", alg.Name(), c, rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
			}
			res := e.l.Decide(mwReq("192.0.2.1:1", "X-Cost", c))
			if !errors.Is(res.Err, core.ErrCostExceedsCapacity) || !res.Layers[0].Refused || !res.Layers[1].Refused || res.RetryAfter() != 0 {
				t.Fatalf("%s, Decide cost %s: %+v", alg.Name(), c, res)
			}
		}
		if res := e.l.Decide(mwReq("192.0.2.1:1", "X-Cost", "1")); !res.Proceed || res.Layers[0].Decision.Remaining != 9 {
			t.Fatalf("%s: cost 1 after the refusals: %+v, want admitted with 9 left: the refusals charged something", alg.Name(), res)
		}
	}
}

// TestDryRun checks that dry-run never blocks, writes headers and reports
// decisions to the observer.
func TestDryRun(t *testing.T) {
	obs := &mwObserver{}
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("per-ip")}},
		ratelimit.WithDryRun(), ratelimit.WithObserver(obs), ratelimit.WithHeaders(ratelimit.AllHeaders))
	for i := range 5 {
		rec := e.do(t, mwReq("192.0.2.1:1"))
		wantRemaining := strconv.Itoa(max(1-i, 0))
		if rec.Code != 200 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "" || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != wantRemaining {
			t.Errorf("request %d: %d Retry-After %q remaining %q", i, rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter), rec.Header().Get(ratelimit.HeaderRateLimitRemaining))
		}
	}
	if e.served.Load() != 5 || len(obs.decisions) != 5 {
		t.Fatalf("served %d, decisions %d", e.served.Load(), len(obs.decisions))
	}
	for i, d := range obs.decisions {
		if !d.DryRun || d.Admitted != (i < 2) || d.Key != "192.0.2.1" {
			t.Errorf("decision %d: %+v", i, d)
		}
	}
	res := e.l.Decide(mwReq("192.0.2.1:1"))
	if !res.Proceed || !res.DryRun || !res.Layers[0].Refused {
		t.Errorf("Decide: %+v", res)
	}
	// A key error is not blocked either (the error handler still sees it).
	var keyErr error
	e1 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2)}},
		ratelimit.WithDryRun(), ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { keyErr = err }))
	if rec := e1.do(t, mwReq("not-an-address")); rec.Code != 200 || !errors.Is(keyErr, ratelimit.ErrInvalidClientIP) {
		t.Errorf("key error in dry-run: %d %v", rec.Code, keyErr)
	}
	// A cost above capacity is not blocked either.
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.Global("g"), Rule: core.PerMinute(2)}},
		ratelimit.WithDryRun(), ratelimit.WithCost(func(*http.Request) int64 { return 3 }))
	if rec := e2.do(t, mwReq("192.0.2.1:1")); rec.Code != 200 {
		t.Errorf("cost above capacity in dry-run: %d", rec.Code)
	}
}

// TestStoreFailure checks fail-open and fail-closed.
func TestStoreFailure(t *testing.T) {
	layers := []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("per-ip")}}
	cases := []struct {
		name    string
		opts    []ratelimit.Option
		handler bool // install an error handler that records
		writes  bool // and writes 502
		code    int
		served  int64
	}{
		{"fail-open", nil, false, false, 200, 1},
		{"fail-open-handler", nil, true, false, 200, 1},
		{"fail-closed", []ratelimit.Option{ratelimit.WithFailClosed()}, false, false, 503, 0},
		{"fail-closed-handler", []ratelimit.Option{ratelimit.WithFailClosed()}, true, false, 503, 0},
		{"handler-writes", nil, true, true, 502, 0},
		{"dry-run-fail-closed", []ratelimit.Option{ratelimit.WithFailClosed(), ratelimit.WithDryRun()}, true, false, 200, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := &mwFailStore{}
			var got []error
			opts := append([]ratelimit.Option{ratelimit.WithStore(store), ratelimit.WithHeaders(ratelimit.AllHeaders)}, tc.opts...)
			if tc.handler {
				opts = append(opts, ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
					got = append(got, err)
					if tc.writes {
						w.WriteHeader(http.StatusBadGateway)
					}
				}))
			}
			e := mwNew(t, layers, opts...)
			rec := e.do(t, mwReq("192.0.2.1:1"))
			if rec.Code != tc.code || e.served.Load() != tc.served {
				t.Fatalf("status %d served %d, want %d %d", rec.Code, e.served.Load(), tc.code, tc.served)
			}
			for _, h := range []string{ratelimit.HeaderRateLimitLimit, ratelimit.HeaderRateLimit, ratelimit.HeaderRetryAfter} {
				if v := rec.Header().Get(h); v != "" {
					t.Errorf("%s = %q on a store failure", h, v)
				}
			}
			if tc.handler && (len(got) != 1 || !errors.Is(got[0], ratelimit.ErrStoreFailure) || !errors.Is(got[0], errBackendDown)) {
				t.Errorf("error handler got %v", got)
			}
			if store.calls.Load() != 1 {
				t.Errorf("store called %d times", store.calls.Load())
			}
		})
	}
}

// TestDeniedHandler checks that a custom denied handler receives the
// decisions with the headers already set.
func TestDeniedHandler(t *testing.T) {
	var got *ratelimit.Result
	e := mwNew(t, mwLayered(), ratelimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res *ratelimit.Result) {
		got = res
		w.Header().Set("X-Custom", "yes")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	for range 2 {
		e.do(t, mwUserReq("192.0.2.1:1", "alice"))
	}
	rec := e.do(t, mwUserReq("192.0.2.1:1", "alice"))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("X-Custom") != "yes" || rec.Header().Get(ratelimit.HeaderRetryAfter) != "30" ||
		rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "0" {
		t.Fatalf("got %d %v", rec.Code, rec.Header())
	}
	if got == nil || got.Proceed || got.Err != nil || len(got.Layers) != 2 || got.Layers[0].Refused || !got.Layers[1].Refused ||
		got.Layers[1].Key != "alice" || got.Layers[1].Decision.Policy.Name() != "per-user" || got.RetryAfter() != 30*time.Second {
		t.Errorf("denied handler got %+v", got)
	}
	// The Result stays valid after the request (it was copied off the stack).
	before := got.Layers[1].Key
	e.do(t, mwUserReq("192.0.2.2:1", "bob"))
	if got.Layers[1].Key != before {
		t.Error("Result changed after the handler returned")
	}
	// A cost above capacity also goes to the denied handler.
	e2 := mwNew(t, mwLayered(), ratelimit.WithCost(func(*http.Request) int64 { return 3 }),
		ratelimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res *ratelimit.Result) {
			got = res
			w.WriteHeader(499)
		}))
	if rec := e2.do(t, mwUserReq("192.0.2.1:1", "alice")); rec.Code != 499 || !errors.Is(got.Err, core.ErrCostExceedsCapacity) {
		t.Errorf("cost above capacity: %d %v", rec.Code, got.Err)
	}
}

// TestProblemDetails decodes the RFC 9457 bodies.
func TestProblemDetails(t *testing.T) {
	type problem struct {
		Type             string   `json:"type"`
		Title            string   `json:"title"`
		Status           int      `json:"status"`
		Detail           string   `json:"detail"`
		ViolatedPolicies []string `json:"violated-policies"`
	}
	decode := func(t *testing.T, rec *httptest.ResponseRecorder) problem {
		t.Helper()
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("Content-Type %q", ct)
		}
		var p problem
		dec := json.NewDecoder(rec.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("quota-exceeded", func(t *testing.T) {
		e := mwNew(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 1, Window: 10 * time.Second}},
			{Key: ratelimit.Global("all"), Rule: core.Rule{Name: "global", Limit: 1, Window: 3 * time.Second}},
			{Key: ratelimit.User(), Rule: core.PerMinute(5).Named("per-user")},
		}, ratelimit.WithProblemDetails())
		e.do(t, mwReq("192.0.2.1:1"))
		rec := e.do(t, mwReq("192.0.2.1:1"))
		if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "10" {
			t.Fatalf("status %d Retry-After %q", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
		}
		p := decode(t, rec)
		want := problem{ratelimit.ProblemTypeQuotaExceeded, "Too Many Requests", 429, "Quota exceeded; retry after 10 seconds.", []string{"per-ip", "global"}}
		if p.Type != want.Type || p.Title != want.Title || p.Status != want.Status || p.Detail != want.Detail ||
			strings.Join(p.ViolatedPolicies, ",") != strings.Join(want.ViolatedPolicies, ",") {
			t.Errorf("got %+v, want %+v", p, want)
		}
	})
	t.Run("too-costly", func(t *testing.T) {
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("per-ip")}},
			ratelimit.WithProblemDetails(), ratelimit.WithCost(func(*http.Request) int64 { return 9 }))
		rec := e.do(t, mwReq("192.0.2.1:1"))
		if rec.Code != 413 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "" {
			t.Fatalf("status %d", rec.Code)
		}
		p := decode(t, rec)
		if p.Type != "about:blank" || p.Status != 413 || p.Title != "Content Too Large" || !strings.Contains(p.Detail, `cost (9) exceeds the capacity (5) of policy "per-ip"`) {
			t.Errorf("got %+v", p)
		}
	})
	t.Run("store-full", func(t *testing.T) {
		store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 16, Shards: 1, KeepActive: true})
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("per-ip")}},
			ratelimit.WithProblemDetails(), ratelimit.WithStore(store))
		for i := range 16 {
			if rec := e.do(t, mwReq(fmt.Sprintf("192.0.2.%d:1", i))); rec.Code != 200 {
				t.Fatalf("client %d: %d", i, rec.Code)
			}
		}
		rec := e.do(t, mwReq("198.51.100.1:1"))
		if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) == "" {
			t.Fatalf("a new client in a full store: %d, Retry-After %q", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
		}
		p := decode(t, rec)
		if p.Type != "about:blank" || p.Status != 429 || p.Title != "Too Many Requests" || !strings.Contains(p.Detail, "too many active clients; retry after") {
			t.Errorf("got %+v", p)
		}
	})
}

// mwShaper is a LeakyBucket layer of 2 per second (requests spaced 500ms)
// that delays overflow up to maxDelay.
func mwShaper(maxDelay time.Duration) []ratelimit.Layer {
	return []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second, MaxDelay: maxDelay}}}
}

// TestShaping checks the delays asked of the wait function and the refusal
// beyond MaxDelay.
func TestShaping(t *testing.T) {
	e := mwNew(t, mwShaper(time.Second), ratelimit.WithHeaders(ratelimit.AllHeaders))
	var delays []time.Duration
	ratelimit.SetWaitFunc(e.l, func(ctx context.Context, d time.Duration) error {
		delays = append(delays, d)
		return nil
	})
	codes := []int{}
	for range 4 {
		codes = append(codes, e.do(t, mwReq("192.0.2.1:1")).Code)
	}
	if want := []int{200, 200, 200, 429}; !equalInts(codes, want) {
		t.Errorf("codes %v, want %v", codes, want)
	}
	if want := []time.Duration{500 * time.Millisecond, time.Second}; len(delays) != 2 || delays[0] != want[0] || delays[1] != want[1] {
		t.Errorf("delays %v, want %v", delays, want)
	}
	rec := e.do(t, mwReq("192.0.2.1:1"))
	if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "1" {
		t.Errorf("beyond MaxDelay: %d Retry-After %q", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
	}
	// Half a second later the bucket has room for one more delayed request.
	e.clk.Advance(500 * time.Millisecond)
	res := e.l.Decide(mwReq("192.0.2.1:1"))
	if !res.Proceed || res.Delay != time.Second {
		t.Errorf("Decide after 500ms: %+v", res)
	}
	if ratelimit.Waiting(e.l) != 0 {
		t.Errorf("waiting %d", ratelimit.Waiting(e.l))
	}
}

// holdWait makes l's one shaping delay wait until release is closed,
// closing entered when it starts.
func holdWait(l *ratelimit.Limiter) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	ratelimit.SetWaitFunc(l, func(context.Context, time.Duration) error {
		close(entered)
		<-release
		return nil
	})
	return entered, release
}

// TestShapingCancel checks that a request whose context ends while it waits
// is not served.
func TestShapingCancel(t *testing.T) {
	e := mwNew(t, mwShaper(time.Second))
	entered := make(chan struct{})
	ratelimit.SetWaitFunc(e.l, func(ctx context.Context, d time.Duration) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	})
	e.do(t, mwReq("192.0.2.1:1")) // no delay
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(t, mwReq("192.0.2.1:1").WithContext(ctx)) }()
	<-entered
	cancel()
	rec := <-done
	if rec.Code != http.StatusServiceUnavailable || e.served.Load() != 1 {
		t.Errorf("cancelled: status %d served %d", rec.Code, e.served.Load())
	}
	// A request whose context is already done does not wait at all.
	ratelimit.SetWaitFunc(e.l, func(context.Context, time.Duration) error {
		t.Error("waited with a dead context")
		return nil
	})
	rec = e.do(t, mwReq("192.0.2.1:1").WithContext(ctx))
	if rec.Code != http.StatusServiceUnavailable || e.served.Load() != 1 || ratelimit.Waiting(e.l) != 0 {
		t.Errorf("dead context: status %d served %d", rec.Code, e.served.Load())
	}
}

// TestShapingMaxWaiting checks that WithMaxWaiting bounds the waiters.
// panickyObserver panics on its panicAt-th decision event.
type panickyObserver struct {
	core.NopObserver
	n, panicAt int
}

func (o *panickyObserver) ObserveDecision(core.DecisionEvent) {
	if o.n++; o.n == o.panicAt {
		panic("observer bug")
	}
}

// TestShapingSlotGivenBackOnPanic: a request that took a waiting-room slot
// and whose decision panics (here in an Observer) gives the slot back, so
// that panics, which net/http recovers, cannot fill the room for good;
// whether the layer's own rule shapes or only a policy its Resolver picks
// (listing nothing) does.
func TestShapingSlotGivenBackOnPanic(t *testing.T) {
	keyHeader := func(r *http.Request) (string, error) { return r.Header.Get("K"), nil }
	shaping := core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}
	for _, tc := range []struct {
		name  string
		layer ratelimit.Layer
	}{
		{"own rule", ratelimit.Layer{Key: keyHeader, Rule: shaping}},
		{"resolver's policy", ratelimit.Layer{
			Key:      keyHeader,
			Rule:     core.Rule{Name: "base", Limit: 100, Window: time.Minute},
			Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return core.MustPolicy(shaping), nil }),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mwNew(t, []ratelimit.Layer{tc.layer}, ratelimit.WithObserver(&panickyObserver{panicAt: 2}), ratelimit.WithMaxWaiting(1))
			ratelimit.SetWaitFunc(e.l, func(context.Context, time.Duration) error { return nil })
			e.do(t, mwReq("192.0.2.1:1", "K", "x")) // served at once
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the observer's panic did not reach the handler")
					}
				}()
				e.do(t, mwReq("192.0.2.1:1", "K", "x"))
			}()
			if w := ratelimit.Waiting(e.l); w != 0 {
				t.Fatalf("waiting %d after the panic, want 0", w)
			}
			if rec := e.do(t, mwReq("192.0.2.1:1", "K", "y")); rec.Code != 200 {
				t.Fatalf("another key after the panic: %d, want 200", rec.Code)
			}
		})
	}
}

// TestShapingMaxWaitingResolverDelay: a full waiting room's Retry-After
// covers the MaxDelay of a shaping policy a Resolver picked for the
// refused request, though the Resolver lists no policies.
func TestShapingMaxWaitingResolverDelay(t *testing.T) {
	shaping := core.MustPolicy(core.Rule{Name: "shaped", Algorithm: core.LeakyBucket, Limit: 1, Window: 10 * time.Second, MaxDelay: 30 * time.Second})
	e := mwNew(t, []ratelimit.Layer{{
		Key:      ratelimit.MustClientIP(),
		Rule:     core.Rule{Name: "base", Limit: 100, Window: time.Minute},
		Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return shaping, nil }),
	}}, ratelimit.WithMaxWaiting(1))
	entered, release := holdWait(e.l)
	e.do(t, mwReq("192.0.2.1:1")) // fills the bucket
	done := make(chan struct{})
	go func() { e.do(t, mwReq("192.0.2.1:1")); close(done) }() // delayed: the one waiting slot
	<-entered
	rec := e.do(t, mwReq("192.0.2.2:1"))
	close(release)
	<-done
	if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "30" {
		t.Fatalf("full room: %d Retry-After %q, want 429 after 30 (the picked policy's MaxDelay)", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
	}
}

func TestShapingMaxWaiting(t *testing.T) {
	layers := []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}}}
	var denied *ratelimit.Result
	e := mwNew(t, layers, ratelimit.WithMaxWaiting(2))
	e2 := mwNew(t, layers, ratelimit.WithMaxWaiting(2), ratelimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res *ratelimit.Result) {
		denied = res
		w.WriteHeader(429)
	}))
	for _, env := range []*mwEnv{e, e2} {
		entered := make(chan time.Duration)
		release := make(chan struct{})
		ratelimit.SetWaitFunc(env.l, func(ctx context.Context, d time.Duration) error {
			entered <- d
			<-release
			return nil
		})
		env.do(t, mwReq("192.0.2.1:1")) // served at once
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				env.do(t, mwReq("192.0.2.1:1"))
			}()
		}
		got := []time.Duration{<-entered, <-entered}
		if got[0]+got[1] != 3*time.Second { // 1s and 2s, in either order
			t.Errorf("delays %v", got)
		}
		if ratelimit.Waiting(env.l) != 2 {
			t.Errorf("waiting %d, want 2", ratelimit.Waiting(env.l))
		}
		// The room is full: refused before anything is charged, five times,
		// with Retry-After the layer's MaxDelay (by then every request
		// waiting now has been served).
		for range 5 {
			rec := env.do(t, mwReq("192.0.2.1:1"))
			if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "60" {
				t.Errorf("full: %d Retry-After %q", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
			}
		}
		close(release)
		wg.Wait()
		if env.served.Load() != 3 || ratelimit.Waiting(env.l) != 0 {
			t.Errorf("served %d waiting %d", env.served.Load(), ratelimit.Waiting(env.l))
		}
		// The refused requests were charged nothing: the next one waits
		// 3s, as it would have without them.
		if res := env.l.Decide(mwReq("192.0.2.1:1")); res.Delay != 3*time.Second {
			t.Errorf("next delay %v, want 3s", res.Delay)
		}
	}
	if denied == nil || !errors.Is(denied.Err, ratelimit.ErrTooManyWaiting) || len(denied.Layers) != 0 || denied.RetryAfter() != time.Minute {
		t.Errorf("denied handler got %+v", denied)
	}
}

// TestDryRunDoesNotWait checks that dry-run never delays a request.
func TestDryRunDoesNotWait(t *testing.T) {
	e := mwNew(t, mwShaper(time.Second), ratelimit.WithDryRun())
	ratelimit.SetWaitFunc(e.l, func(context.Context, time.Duration) error {
		t.Error("waited in dry-run")
		return nil
	})
	for range 5 {
		if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != 200 {
			t.Errorf("status %d", rec.Code)
		}
	}
}

// TestConcurrentOneKey checks that 64 goroutines on one key under a frozen
// clock get exactly Limit admissions.
func TestConcurrentOneKey(t *testing.T) {
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			const limit, goroutines, each = 100, 64, 20
			rule := core.Rule{Name: "per-ip", Algorithm: alg, Limit: limit, Window: time.Minute}
			if alg == core.LeakyBucket {
				rule.Burst = limit
			}
			e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}})
			var ok, refused atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						rec := httptest.NewRecorder()
						e.h.ServeHTTP(rec, mwReq("192.0.2.1:1"))
						switch rec.Code {
						case 200:
							ok.Add(1)
						case 429:
							refused.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if ok.Load() != limit || refused.Load() != goroutines*each-limit || e.served.Load() != limit {
				t.Errorf("ok %d refused %d served %d, want %d %d", ok.Load(), refused.Load(), e.served.Load(), limit, goroutines*each-limit)
			}
		})
	}
}

// TestResolver checks per-key tiers and resolver failures.
func TestResolver(t *testing.T) {
	tiers, err := core.Tiers(func(ctx context.Context, key string) string {
		if strings.HasPrefix(key, "pro-") {
			return "pro"
		}
		return ""
	}, map[string]core.Rule{"pro": core.PerMinute(5).Named("per-user-pro")})
	if err != nil {
		t.Fatal(err)
	}
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(1).Named("per-user"), Resolver: tiers}},
		ratelimit.WithHeaders(ratelimit.AllHeaders))
	rec := e.do(t, mwUserReq("192.0.2.1:1", "pro-ann"))
	if rec.Header().Get(ratelimit.HeaderRateLimitPolicy) != `"per-user-pro";q=5;w=60` || rec.Header().Get(ratelimit.HeaderRateLimitLimit) != "5" {
		t.Errorf("pro: %v", rec.Header())
	}
	rec = e.do(t, mwUserReq("192.0.2.1:1", "free-fred"))
	if rec.Header().Get(ratelimit.HeaderRateLimitPolicy) != `"per-user";q=1;w=60` || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "0" {
		t.Errorf("free: %v", rec.Header())
	}

	failing := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return nil, errBackendDown })
	var got error
	e = mwNew(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(1), Resolver: failing}},
		ratelimit.WithFailClosed(), ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = err }))
	if rec := e.do(t, mwUserReq("192.0.2.1:1", "ann")); rec.Code != 503 || !errors.Is(got, ratelimit.ErrStoreFailure) || !errors.Is(got, errBackendDown) {
		t.Errorf("failing resolver: %d %v", rec.Code, got)
	}
}

// TestSteps drives the framework-agnostic steps by hand, as an adapter
// would.
func TestSteps(t *testing.T) {
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip")}})
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		res := e.l.Decide(r)
		e.l.WriteHeaders(rec.Header(), &res)
		if !res.Proceed {
			e.l.Refuse(rec, r, &res)
			return rec
		}
		if err := e.l.Wait(r.Context(), &res); err != nil {
			t.Fatal(err)
		}
		rec.WriteHeader(204)
		return rec
	}
	if rec := serve(mwReq("192.0.2.1:1")); rec.Code != 204 || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "0" {
		t.Errorf("first: %d %v", rec.Code, rec.Header())
	}
	if rec := serve(mwReq("192.0.2.1:1")); rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "60" {
		t.Errorf("second: %d %v", rec.Code, rec.Header())
	}
	rec := httptest.NewRecorder()
	if e.l.Admit(rec, mwReq("192.0.2.1:1")) || rec.Code != 429 {
		t.Errorf("Admit: %d", rec.Code)
	}
}

// TestHandlerAllocs checks the allocation budget of the hot path: at most 4
// per admitted request with both header sets (one is the client-IP key).
func TestHandlerAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerSecond(1000).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerSecond(1000).Named("per-user")},
	}, ratelimit.WithHeaders(ratelimit.AllHeaders)))
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	w := &mwWriter{h: make(http.Header)}
	anon, user := mwReq("192.0.2.1:1"), mwUserReq("192.0.2.2:1", "alice")
	for _, r := range []*http.Request{anon, user} {
		h.ServeHTTP(w, r)
		allocs := testing.AllocsPerRun(200, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		})
		if allocs > 4 || w.code != 204 {
			t.Errorf("%v allocations per request (status %d), want <= 4", allocs, w.code)
		}
	}
}

type mwWriter struct {
	h    http.Header
	code int
}

func (w *mwWriter) Header() http.Header         { return w.h }
func (w *mwWriter) WriteHeader(code int)        { w.code = code }
func (w *mwWriter) Write(b []byte) (int, error) { return len(b), nil }

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStepsWait checks that Wait turns a Result into a refusal that Refuse
// answers correctly, for adapters that drive the steps themselves.
func TestStepsWait(t *testing.T) {
	layers := []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}}}
	e := mwNew(t, layers, ratelimit.WithMaxWaiting(1))
	entered, release := holdWait(e.l)
	e.do(t, mwReq("192.0.2.1:1"))
	done := make(chan struct{})
	go func() { defer close(done); e.do(t, mwReq("192.0.2.1:1")) }()
	<-entered

	r := mwReq("192.0.2.1:1")
	res := e.l.Decide(r)
	if !res.Proceed || res.Delay != 2*time.Second {
		t.Fatalf("Decide: %+v", res)
	}
	if err := e.l.Wait(r.Context(), &res); !errors.Is(err, ratelimit.ErrTooManyWaiting) || res.Proceed || !res.Layers[0].Refused {
		t.Fatalf("Wait: %v %+v", err, res)
	}
	rec := httptest.NewRecorder()
	e.l.Refuse(rec, r, &res)
	// Not before the request holding the room is served: it came through
	// Admit, which counts the longest delay its rule could give (MaxDelay,
	// a minute), later than this request's own delay (2s).
	if rec.Code != 429 || rec.Header().Get(ratelimit.HeaderRetryAfter) != "60" {
		t.Errorf("Refuse: %d Retry-After %q, want 429 and 60", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
	}
	close(release)
	<-done

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = e.l.Decide(r)
	if err := e.l.Wait(ctx, &res); !errors.Is(err, context.Canceled) || res.Proceed {
		t.Fatalf("Wait with a cancelled context: %v %+v", err, res)
	}
	rec = httptest.NewRecorder()
	e.l.Refuse(rec, r, &res)
	if rec.Code != 503 {
		t.Errorf("Refuse after cancel: %d", rec.Code)
	}
}

// TestResolverZeroPolicy: a Resolver that returns a Policy not built by
// core.NewPolicy is a configuration error (500, logged once), never a
// panic; a core.Limiter with such a Resolver returns an error.
func TestResolverZeroPolicy(t *testing.T) {
	res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return new(core.Policy), nil })
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "ip", Limit: 2, Window: time.Minute}, Resolver: res}})
	if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 (configuration error)", rec.Code)
	}
	lim := core.Must(core.NewWithPolicy(nil, core.WithResolver(res)))
	if _, err := lim.Allow(context.Background(), "k"); err == nil {
		t.Fatal("core.Limiter with a Resolver returning a zero Policy: no error")
	}
	var out [1]core.Decision
	if err := core.MustMemoryStore(nil).Take(context.Background(), time.Now(), []core.Request{{Policy: new(core.Policy), Key: "k", Cost: 1}}, out[:]); err == nil {
		t.Fatal("MemoryStore.Take with a zero Policy: no error")
	}
}
