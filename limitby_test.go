package ratelimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// lbReq describes one request sent through a one-liner.
type lbReq struct {
	peer string            // RemoteAddr
	hdr  map[string]string // request headers
	user string            // identity stored with WithUser, if any
}

// lbServe sends q through h and returns the recorded response.
func lbServe(h http.Handler, q lbReq) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = q.peer
	for k, v := range q.hdr {
		r.Header.Set(k, v)
	}
	if q.user != "" {
		r = r.WithContext(ratelimit.WithUser(r.Context(), q.user))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

var lbOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

func lbClock() *core.FakeClock {
	return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// lbStatuses sends qs in order and returns the status codes.
func lbStatuses(h http.Handler, qs ...lbReq) []int {
	var out []int
	for _, q := range qs {
		out = append(out, lbServe(h, q).Code)
	}
	return out
}

func lbRepeat(q lbReq, n int) []lbReq {
	qs := make([]lbReq, n)
	for i := range qs {
		qs[i] = q
	}
	return qs
}

func lbExpect(t *testing.T, what string, got []int, want ...int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: statuses %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: statuses %v, want %v", what, got, want)
		}
	}
}

func TestLimitByIP(t *testing.T) {
	clk := lbClock()
	h := ratelimit.LimitByIP(3, time.Minute, ratelimit.WithClock(clk))(lbOK)
	a := lbReq{peer: "192.0.2.1:1234"}

	for i := range 3 {
		rec := lbServe(h, a)
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i+1, rec.Code)
		}
		if got := rec.Header().Get(ratelimit.HeaderRateLimitLimit); got != "3" {
			t.Fatalf("X-RateLimit-Limit = %q, want 3", got)
		}
		if got, want := rec.Header().Get(ratelimit.HeaderRateLimitRemaining), []string{"2", "1", "0"}[i]; got != want {
			t.Fatalf("request %d: X-RateLimit-Remaining = %q, want %q", i+1, got, want)
		}
	}
	rec := lbServe(h, a)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get(ratelimit.HeaderRetryAfter) != "20" {
		t.Fatalf("4th request: status %d Retry-After %q, want 429 and 20", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter))
	}
	// Another port of the same address is the same client; another address is not.
	lbExpect(t, "same address, other port", lbStatuses(h, lbReq{peer: "192.0.2.1:999"}), 429)
	lbExpect(t, "other client", lbStatuses(h, lbReq{peer: "198.51.100.7:1"}), 200)
	// Without trusted proxies, a forged header changes nothing.
	forged := lbReq{peer: "192.0.2.1:1234", hdr: map[string]string{"X-Forwarded-For": "203.0.113.50", "X-Real-IP": "203.0.113.51"}}
	lbExpect(t, "forged X-Forwarded-For", lbStatuses(h, forged), 429)
	// Quota comes back at limit/window.
	clk.Advance(20 * time.Second)
	lbExpect(t, "after 20s", lbStatuses(h, a, a), 200, 429)
}

func TestLimitByIPIPv6GroupedBy64(t *testing.T) {
	h := ratelimit.LimitByIP(1, time.Minute, ratelimit.WithClock(lbClock()))(lbOK)
	lbExpect(t, "/64 by default", lbStatuses(h,
		lbReq{peer: "[2001:db8:1:2::1]:1"},
		lbReq{peer: "[2001:db8:1:2::ffff]:1"}, // same /64: rotating addresses does not help
		lbReq{peer: "[2001:db8:1:3::1]:1"},    // another /64
	), 200, 429, 200)

	h = ratelimit.LimitByIP(1, time.Minute, ratelimit.WithClock(lbClock()), ratelimit.IPv6Prefix(128))(lbOK)
	lbExpect(t, "IPv6Prefix(128)", lbStatuses(h,
		lbReq{peer: "[2001:db8:1:2::1]:1"},
		lbReq{peer: "[2001:db8:1:2::ffff]:1"},
	), 200, 200)
}

func TestLimitByIPTrustedProxies(t *testing.T) {
	h := ratelimit.LimitByIP(2, time.Minute, ratelimit.WithClock(lbClock()),
		ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))(lbOK)
	viaLB := func(xff string) lbReq {
		return lbReq{peer: "10.0.0.7:4000", hdr: map[string]string{"X-Forwarded-For": xff}}
	}
	// Client A through the load balancer, with a forged leftmost entry.
	lbExpect(t, "client A via the load balancer", lbStatuses(h,
		viaLB("6.6.6.6, 203.0.113.9"), viaLB("203.0.113.9"), viaLB("1.1.1.1, 203.0.113.9, 10.0.0.3")),
		200, 200, 429)
	// Client B through the same load balancer has its own quota: the
	// balancer's address is not the key.
	lbExpect(t, "client B via the load balancer", lbStatuses(h, viaLB("203.0.113.10")), 200)
	// A client connecting directly cannot claim another's address...
	direct := lbReq{peer: "198.51.100.4:1", hdr: map[string]string{"X-Forwarded-For": "203.0.113.10"}}
	lbExpect(t, "direct peer forging B", lbStatuses(h, direct, direct, direct), 200, 200, 429)
	// ...and B's quota was not charged by it.
	lbExpect(t, "client B again", lbStatuses(h, viaLB("203.0.113.10"), viaLB("203.0.113.10")), 200, 429)
	// Garbage from the trusted proxy is a key error (400), never a bypass.
	lbExpect(t, "garbage entry", lbStatuses(h, viaLB("203.0.113.9, not-an-ip")), 400)
}

func TestLimitByHeader(t *testing.T) {
	obs := &lbKeyObserver{}
	h := ratelimit.LimitByHeader("X-API-Key", 2, time.Minute, ratelimit.WithClock(lbClock()),
		ratelimit.WithObserver(obs))(lbOK)
	key := func(peer, k string) lbReq { return lbReq{peer: peer, hdr: map[string]string{"X-API-Key": k}} }

	// One quota per key, whatever address it comes from.
	lbExpect(t, "key from two addresses", lbStatuses(h,
		key("192.0.2.1:1", "sk_live_alpha"), key("198.51.100.2:1", "sk_live_alpha"), key("203.0.113.3:1", "sk_live_alpha")),
		200, 200, 429)
	lbExpect(t, "another key", lbStatuses(h, key("192.0.2.1:1", "sk_live_beta")), 200)

	// The raw key never reaches the store.
	for _, k := range obs.keys() {
		if strings.Contains(k, "sk_live") {
			t.Fatalf("store key %q holds the raw header value", k)
		}
	}

	// Omitting the header does not escape: the request is limited by its
	// address.
	anon := lbReq{peer: "192.0.2.1:1"}
	lbExpect(t, "anonymous", lbStatuses(h, anon, anon, anon, lbReq{peer: "192.0.2.1:1", hdr: map[string]string{"X-API-Key": "  "}}),
		200, 200, 429, 429)
	// An address's quota and the key equal to that address are distinct.
	lbExpect(t, "key spelled like an address", lbStatuses(h, key("203.0.113.3:1", "192.0.2.1")), 200)
	lbExpect(t, "another anonymous client", lbStatuses(h, lbReq{peer: "198.51.100.9:1"}), 200)

	if got := obs.keys(); !lbKeysAre(got, `^[0-9a-f]{32}$|^[0-9.]+$`) {
		t.Fatalf("store keys %q: want 32-digit hashes and addresses only", got)
	}
}

func TestLimitByHeaderFallbackUsesTrustedProxies(t *testing.T) {
	h := ratelimit.LimitByHeader("X-API-Key", 1, time.Minute, ratelimit.WithClock(lbClock()),
		ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))(lbOK)
	viaLB := func(xff string) lbReq {
		return lbReq{peer: "10.0.0.7:4000", hdr: map[string]string{"X-Forwarded-For": xff}}
	}
	lbExpect(t, "anonymous clients via the load balancer", lbStatuses(h,
		viaLB("203.0.113.9"), viaLB("203.0.113.10"), viaLB("203.0.113.9")), 200, 200, 429)
}

func TestLimitByUser(t *testing.T) {
	h := ratelimit.LimitByUser(2, time.Minute, ratelimit.WithClock(lbClock()))(lbOK)

	// One quota per user, whatever address it comes from.
	lbExpect(t, "alice from two addresses", lbStatuses(h,
		lbReq{peer: "192.0.2.1:1", user: "alice"}, lbReq{peer: "198.51.100.2:1", user: "alice"},
		lbReq{peer: "203.0.113.3:1", user: "alice"}), 200, 200, 429)
	lbExpect(t, "bob", lbStatuses(h, lbReq{peer: "192.0.2.1:1", user: "bob"}), 200)

	// Anonymous requests are limited per address, not served unlimited.
	anon := lbReq{peer: "192.0.2.1:1"}
	lbExpect(t, "anonymous", lbStatuses(h, anon, anon, anon), 200, 200, 429)
	lbExpect(t, "anonymous elsewhere", lbStatuses(h, lbReq{peer: "198.51.100.2:1"}), 200)

	// A user named like an address does not drain that address's quota.
	lbExpect(t, "user named 198.51.100.2", lbStatuses(h,
		lbReq{peer: "192.0.2.50:1", user: "198.51.100.2"}, lbReq{peer: "192.0.2.50:1", user: "198.51.100.2"}), 200, 200)
	lbExpect(t, "anonymous 198.51.100.2 again", lbStatuses(h, lbReq{peer: "198.51.100.2:1"}), 200)
}

func TestLimitByUserBehindAuthMiddleware(t *testing.T) {
	// The application's authentication sets the user, then the limiter runs.
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tok := r.Header.Get("Authorization"); tok != "" {
				r = r.WithContext(ratelimit.WithUser(r.Context(), strings.TrimPrefix(tok, "Bearer ")))
			}
			next.ServeHTTP(w, r)
		})
	}
	h := auth(ratelimit.LimitByUser(1, time.Minute, ratelimit.WithClock(lbClock()),
		ratelimit.WithHeaders(ratelimit.IETFHeaders))(lbOK))
	bearer := func(peer, tok string) lbReq {
		return lbReq{peer: peer, hdr: map[string]string{"Authorization": "Bearer " + tok}}
	}
	rec := lbServe(h, bearer("192.0.2.1:1", "u1"))
	if rec.Code != 200 || rec.Header().Get(ratelimit.HeaderRateLimitPolicy) != `"per-user";q=1;w=60` {
		t.Fatalf("first: %d %q", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitPolicy))
	}
	lbExpect(t, "u1 again, other address", lbStatuses(h, bearer("198.51.100.1:1", "u1")), 429)
	lbExpect(t, "u2", lbStatuses(h, bearer("198.51.100.1:1", "u2")), 200)
}

// The Options reach the whole Limiter: a shared store, header sets, handlers.
func TestLimitByOptionsPassThrough(t *testing.T) {
	store, err := core.NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := lbClock()
	mk := func(opts ...ratelimit.LimitOption) http.Handler {
		base := []ratelimit.LimitOption{ratelimit.WithStore(store), ratelimit.WithClock(clk)}
		return ratelimit.LimitByIP(1, time.Minute, append(base, opts...)...)(lbOK)
	}
	a := lbReq{peer: "192.0.2.1:1"}

	// Same store, same name: one quota, as for any two Limiters.
	lbExpect(t, "shared name", lbStatuses(mk(), a), 200)
	lbExpect(t, "shared name, second middleware", lbStatuses(mk(), a), 429)
	// A distinct LayerName gives a distinct quota in the same store.
	login := mk(ratelimit.LayerName("login"), ratelimit.WithHeaders(ratelimit.IETFHeaders),
		ratelimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res *ratelimit.Result) {
			w.WriteHeader(http.StatusTeapot)
		}))
	rec := lbServe(login, a)
	if rec.Code != 200 || rec.Header().Get(ratelimit.HeaderRateLimitPolicy) != `"login";q=1;w=60` {
		t.Fatalf("login: %d %q", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitPolicy))
	}
	if rec.Header().Get(ratelimit.HeaderRateLimitLimit) != "" {
		t.Fatalf("WithHeaders(IETFHeaders) still wrote X-RateLimit-Limit")
	}
	lbExpect(t, "login denied handler", lbStatuses(login, a), http.StatusTeapot)
}

func TestLimitByPanicsOnInvalidArguments(t *testing.T) {
	ip := func(limit int64, window time.Duration, opts ...ratelimit.LimitOption) func() {
		return func() { ratelimit.LimitByIP(limit, window, opts...) }
	}
	tests := []struct {
		name string
		call func()
		is   error  // the panic value wraps it, when not nil
		msg  string // a fragment of the panic message
	}{
		{"zero limit", ip(0, time.Minute), core.ErrInvalidRule, "Limit must be positive"},
		{"negative limit", ip(-5, time.Minute), core.ErrInvalidRule, "Limit must be positive"},
		{"limit above MaxLimit", ip(core.MaxLimit+1, time.Minute), core.ErrInvalidRule, "exceeds MaxLimit"},
		{"zero window", ip(100, 0), core.ErrInvalidRule, "Window must be positive"},
		{"negative window", ip(100, -time.Minute), core.ErrInvalidRule, "Window must be positive"},
		{"window above MaxWindow", ip(100, core.MaxWindow+1), core.ErrInvalidRule, "exceeds MaxWindow"},
		{"bad CIDR", ip(100, time.Minute, ratelimit.TrustedProxyCIDRs("10.0.0.0/33")), ratelimit.ErrInvalidKeyConfig, "10.0.0.0/33"},
		{"header without trusted proxies", ip(100, time.Minute, ratelimit.FromHeader("X-Real-IP")), ratelimit.ErrInvalidKeyConfig, "requires TrustedProxies"},
		{"bad IPv6 prefix", ip(100, time.Minute, ratelimit.IPv6Prefix(0)), ratelimit.ErrInvalidKeyConfig, "IPv6Prefix"},
		{"nil LimitOption", ip(100, time.Minute, nil), nil, "LimitOption 0 is nil"},
		{"nil Option", ip(100, time.Minute, ratelimit.Option(nil)), nil, "nil Option"},
		{"nil IPOption", ip(100, time.Minute, ratelimit.IPOption(nil)), ratelimit.ErrInvalidKeyConfig, "IPOption 0 is nil"},
		{"invalid Option", ip(100, time.Minute, ratelimit.WithStore(nil)), nil, "WithStore: nil store"},
		{"empty LayerName", ip(100, time.Minute, ratelimit.LayerName("")), nil, "LayerName is empty"},
		{"bad LayerName", ip(100, time.Minute, ratelimit.LayerName(`a"b`)), core.ErrInvalidRule, "Name"},
		{"header: empty name", func() { ratelimit.LimitByHeader(" ", 100, time.Minute) }, ratelimit.ErrInvalidKeyConfig, "not a valid header name"},
		{"header: space in name", func() { ratelimit.LimitByHeader("X API Key", 100, time.Minute) }, ratelimit.ErrInvalidKeyConfig, "not a valid header name"},
		{"header: colon in name", func() { ratelimit.LimitByHeader("X-API-Key:", 100, time.Minute) }, ratelimit.ErrInvalidKeyConfig, "not a valid header name"},
		{"header: Host", func() { ratelimit.LimitByHeader("host", 100, time.Minute) }, ratelimit.ErrInvalidKeyConfig, `LimitByHeader: net/http's server takes "Host" out of r.Header`},
		{"header: zero limit", func() { ratelimit.LimitByHeader("X-API-Key", 0, time.Minute) }, core.ErrInvalidRule, "Limit must be positive"},
		{"header: bad CIDR", func() {
			ratelimit.LimitByHeader("X-API-Key", 1, time.Minute, ratelimit.TrustedProxyCIDRs("nope"))
		}, ratelimit.ErrInvalidKeyConfig, "nope"},
		{"user: zero window", func() { ratelimit.LimitByUser(100, 0) }, core.ErrInvalidRule, "Window must be positive"},
		{"user: bad hops", func() { ratelimit.LimitByUser(100, time.Minute, ratelimit.TrustedHops(0)) }, ratelimit.ErrInvalidKeyConfig, "TrustedHops"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := lbPanicValue(tt.call)
			if v == nil {
				t.Fatal("no panic")
			}
			var msg string
			switch v := v.(type) {
			case error:
				msg = v.Error()
				if tt.is != nil && !errors.Is(v, tt.is) {
					t.Errorf("panic %v does not wrap %v", v, tt.is)
				}
			case string:
				msg = v
				if tt.is != nil {
					t.Errorf("panic %q is a string, want an error wrapping %v", v, tt.is)
				}
			default:
				t.Fatalf("panic value %T %v", v, v)
			}
			if !strings.HasPrefix(msg, "ratelimit: ") || !strings.Contains(msg, tt.msg) {
				t.Errorf("panic %q: want the ratelimit: prefix and %q", msg, tt.msg)
			}
		})
	}
}

// The one-liners are the Limiter: the same allocations per request as the
// equivalent Limiter built with New.
func TestLimitByIPCostsWhatTheLimiterCosts(t *testing.T) {
	clk := lbClock()
	one := ratelimit.LimitByIP(1<<40, time.Second, ratelimit.WithClock(clk))(lbOK)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: ratelimit.NamePerIP, Limit: 1 << 40, Window: time.Second},
	}}, ratelimit.WithClock(clk)))
	full := l.Handler(lbOK)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	w := &lbWriter{h: http.Header{}}
	allocs := func(h http.Handler) float64 {
		h.ServeHTTP(w, r) // create the key's state first
		return testing.AllocsPerRun(200, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		})
	}
	if a, b := allocs(one), allocs(full); a != b {
		t.Fatalf("LimitByIP: %v allocs per request, the Limiter built with New: %v", a, b)
	}
}

type lbWriter struct{ h http.Header }

func (w *lbWriter) Header() http.Header         { return w.h }
func (w *lbWriter) WriteHeader(int)             {}
func (w *lbWriter) Write(b []byte) (int, error) { return len(b), nil }

func lbPanicValue(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// lbKeyObserver records the keys decided.
type lbKeyObserver struct {
	core.NopObserver
	mu   sync.Mutex
	seen []string
}

func (o *lbKeyObserver) ObserveDecision(e core.DecisionEvent) {
	o.mu.Lock()
	o.seen = append(o.seen, e.Key)
	o.mu.Unlock()
}

func (o *lbKeyObserver) keys() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.seen...)
}

func lbKeysAre(keys []string, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, k := range keys {
		if !re.MatchString(k) {
			return false
		}
	}
	return len(keys) > 0
}

// Header names are matched as net/http matches them: in any case, and
// surrounding spaces in the configured name are ignored.
func TestLimitByHeaderNameCanonical(t *testing.T) {
	for _, name := range []string{"x-api-key", " X-Api-Key "} {
		h := ratelimit.LimitByHeader(name, 1, time.Minute, ratelimit.WithClock(lbClock()))(lbOK)
		k := lbReq{peer: "192.0.2.1:1", hdr: map[string]string{"X-API-KEY": "k1"}}
		k2 := lbReq{peer: "192.0.2.1:1", hdr: map[string]string{"X-API-KEY": "k2"}}
		// Keyed by the header: k2 from the same address has its own quota.
		lbExpect(t, name, lbStatuses(h, k, k, k2), 200, 429, 200)
	}
}

// Many goroutines on one client admit exactly the limit, never one more.
func TestLimitByIPConcurrentExact(t *testing.T) {
	const limit, workers, each = 100, 8, 40
	h := ratelimit.LimitByIP(limit, time.Hour, ratelimit.WithClock(lbClock()))(lbOK)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		byStatus = map[int]int{}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				code := lbServe(h, lbReq{peer: "192.0.2.1:1"}).Code
				mu.Lock()
				byStatus[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if byStatus[200] != limit || byStatus[429] != workers*each-limit || len(byStatus) != 2 {
		t.Fatalf("statuses %v, want exactly %d 200s and %d 429s", byStatus, limit, workers*each-limit)
	}
}
