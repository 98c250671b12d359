package ratelimit_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// logBuf is a slog logger writing to a buffer, safe for concurrent use.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// count returns the number of log lines containing s.
func (b *logBuf) count(s string) int { return strings.Count(b.String(), s) }

func newLogBuf() (*logBuf, ratelimit.Option) {
	b := &logBuf{}
	return b, ratelimit.WithLogger(slog.New(slog.NewTextHandler(b, nil)))
}

// errRecorder records the errors the error handler sees.
type errRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (e *errRecorder) option() ratelimit.Option {
	return ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		e.mu.Lock()
		e.errs = append(e.errs, err)
		e.mu.Unlock()
	})
}

func (e *errRecorder) all() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

// muxReq is a request with method and target from remoteAddr.
func muxReq(method, target, remoteAddr string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remoteAddr
	return r
}

// TestRouteMethodCannotDodge checks that a route registered without a method
// gives every method one quota, so changing the method (PUT, X1, post, ...)
// buys nothing, and that HEAD is counted with the GET route serving it:
// through a Limiter around the mux (WithServeMux) and one inside it.
func TestRouteMethodCannotDodge(t *testing.T) {
	layer := ratelimit.Layer{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.PerMinute(2).Named("route")}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, mode := range []string{"around", "inside"} {
		t.Run(mode, func(t *testing.T) {
			clk := core.NewFakeClock(mwT0)
			l, err := ratelimit.New([]ratelimit.Layer{layer}, ratelimit.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			var h http.Handler = mux
			if mode == "inside" {
				mux.Handle("/login", l.Handler(ok))
				mux.Handle("GET /x", l.Handler(ok))
			} else {
				if l, err = ratelimit.New([]ratelimit.Layer{layer}, ratelimit.WithClock(clk), ratelimit.WithServeMux(mux)); err != nil {
					t.Fatal(err)
				}
				mux.Handle("/login", ok)
				mux.Handle("GET /x", ok)
				h = l.Handler(mux)
			}
			codes := []int{}
			for _, m := range []string{"POST", "PUT", "X1", "post", "DELETE"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, muxReq(m, "/login", "192.0.2.1:1"))
				codes = append(codes, rec.Code)
			}
			if want := []int{200, 200, 429, 429, 429}; !equalInts(codes, want) {
				t.Errorf("/login by method: %v, want %v", codes, want)
			}
			codes = codes[:0]
			for _, m := range []string{"GET", "HEAD", "HEAD"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, muxReq(m, "/x", "192.0.2.1:1"))
				codes = append(codes, rec.Code)
			}
			if want := []int{200, 200, 429}; !equalInts(codes, want) {
				t.Errorf("GET /x then HEAD: %v, want %v", codes, want)
			}
		})
	}
}

// TestServeMuxUnderOuterMux checks that a Limiter around a mux mounted
// under another mux keys its route layers by the inner mux's patterns, not
// by the outer one's (which the outer mux has already set on the request):
// a login-only layer applies, and two inner routes keep a quota each.
func TestServeMuxUnderOuterMux(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	inner := http.NewServeMux()
	inner.Handle("POST /api/login", ok)
	inner.Handle("GET /api/a", ok)
	inner.Handle("GET /api/b", ok)
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("login"), Routes: []string{"POST /api/login"}},
		{Key: ratelimit.Route(), Rule: core.PerMinute(1).Named("route"), Routes: []string{"GET /api/a", "GET /api/b"}},
	}, ratelimit.WithServeMux(inner))
	outer := http.NewServeMux()
	outer.Handle("/api/", l.Handler(inner))
	var codes []int
	for _, req := range []struct{ method, path string }{
		{"POST", "/api/login"}, {"POST", "/api/login"},
		{"GET", "/api/a"}, {"GET", "/api/b"}, {"GET", "/api/a"},
	} {
		rec := httptest.NewRecorder()
		outer.ServeHTTP(rec, muxReq(req.method, req.path, "192.0.2.1:1"))
		codes = append(codes, rec.Code)
	}
	if want := []int{200, 429, 200, 200, 429}; !equalInts(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
}

// TestServeMuxLimiterBehindStripPrefix checks that a Limiter mounted inside
// its own mux behind http.StripPrefix, whose stripped path the mux does not
// route, limits by the pattern the mux served it under rather than skip.
func TestServeMuxLimiterBehindStripPrefix(t *testing.T) {
	mux := http.NewServeMux()
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Route(), Rule: core.PerMinute(1).Named("route")}}, ratelimit.WithServeMux(mux))
	mux.Handle("/v1/", http.StripPrefix("/v1", l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	var codes []int
	for range 2 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, muxReq("GET", "/v1/users", "192.0.2.1:1"))
		codes = append(codes, rec.Code)
	}
	if want := []int{200, 429}; !equalInts(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	// The same with a catch-all "/" in the mux, which the stripped path
	// matches: the Limiter still limits by the pattern it was served under.
	mux = http.NewServeMux()
	l = mwLimiter(t, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.PerMinute(1).Named("api"),
		Routes: []string{"/api/"},
	}}, ratelimit.WithServeMux(mux))
	mux.Handle("/api/", http.StripPrefix("/api", l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) // a home page
	if codes, want := serveCodes(mux, 3, "/api/items"), []int{200, 429, 429}; !equalInts(codes, want) {
		t.Fatalf("behind StripPrefix beside a catch-all: codes %v, want %v", codes, want)
	}
}

// serveCodes serves n GET requests for target from one client through h
// and returns their status codes.
func serveCodes(h http.Handler, n int, target string) []int {
	var codes []int
	for range n {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, muxReq("GET", target, "192.0.2.1:1"))
		codes = append(codes, rec.Code)
	}
	return codes
}

// TestRouteKeysBounded checks that 1,000 distinct method tokens on two
// routes produce two route keys.
func TestRouteKeysBounded(t *testing.T) {
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux.Handle("/login", ok)
	mux.Handle("/a/{id}", ok)
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Route(), Rule: core.PerMinute(1 << 30).Named("route")}}, ratelimit.WithServeMux(mux))
	keys := map[string]bool{}
	for i := range 1000 {
		m := "M" + strings.Repeat("X", i%40) + string(rune('A'+i%26))
		for _, target := range []string{"/login", "/a/" + m} {
			res := l.Decide(muxReq(m, target, "192.0.2.1:1"))
			for _, ly := range res.Layers {
				keys[ly.Key] = true
			}
		}
	}
	if len(keys) != 2 || !keys["/login"] || !keys["/a/{id}"] {
		t.Fatalf("route keys %v, want /login and /a/{id}", keys)
	}
}

// TestRouteKeysBoundedRedirect checks that requests the mux answers with a
// trailing-slash redirect (CONNECT /users/x for a pattern "/users/{id}/",
// whose redirect ServeMux names by the client's path) are keyed by the
// pattern serving the redirect's target, so that fresh paths mint no
// route keys, and that a flood of them leaves an exhausted route quota
// exhausted, over a real server too.
func TestRouteKeysBoundedRedirect(t *testing.T) {
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux.Handle("/users/{id}/", ok)
	mux.Handle("POST /login", ok)
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Route(), Rule: core.PerMinute(1 << 30).Named("route")}}, ratelimit.WithServeMux(mux))
	keys := map[string]bool{}
	for i := range 300 {
		for _, target := range []string{fmt.Sprintf("/users/u%d", i), fmt.Sprintf("/users/./u%d", i), fmt.Sprintf("/a/../users/v%d", i)} {
			for _, method := range []string{"CONNECT", "GET"} {
				res := l.Decide(muxReq(method, target, "192.0.2.1:1"))
				for _, ly := range res.Layers {
					keys[ly.Key] = true
				}
			}
		}
	}
	if len(keys) != 1 || !keys["/users/{id}/"] {
		t.Fatalf("route keys %d (%v), want /users/{id}/ alone", len(keys), some(keys, 3))
	}

	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64})
	l = mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Route(), Rule: core.PerMinute(2).Named("route")}},
		ratelimit.WithServeMux(mux), ratelimit.WithStore(store))
	srv := httptest.NewServer(l.Handler(mux))
	defer srv.Close()
	raw := func(method, target string) int {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", method, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, want := range []int{200, 200, 429} {
		if got := raw("POST", "/login"); got != want {
			t.Fatalf("login %d: %d, want %d", i, got, want)
		}
	}
	for i := range 100 {
		raw("CONNECT", fmt.Sprintf("/users/x%d", i))
	}
	if got := raw("POST", "/login"); got != 429 || store.Len() > 2 {
		t.Fatalf("after 100 CONNECT requests to fresh paths: login %d, want 429; the store holds %d keys (%d evicted)", got, store.Len(), store.Evictions())
	}
}

// TestRedirectPath checks which patterns a ServeMux returns for its
// trailing-slash redirects, and that telling them from the patterns of the
// requests it serves allocates nothing for those.
func TestRedirectPath(t *testing.T) {
	for _, tc := range []struct {
		target, pattern string
		want            bool
	}{
		{"/users/u1", "/users/u1/", true},
		{"/users/./u1", "/users/u1/", true},
		{"/a//users/u1", "/a/users/u1/", true},
		{"/x/../users/u1", "/users/u1/", true},
		{"/users/u1", "/users/{id}/", false},
		{"/users/u1/", "/users/u1/", false},
		{"/api/users/12345", "/api/", false},
		{"/index.html", "/", false},
		{"/.well-known/x", "/", false},
		{"/a//b", "/", false},
		{"/users/u1", "GET /users/u1/", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.Path = tc.target
		if got := ratelimit.RedirectPath(r, tc.pattern); got != tc.want {
			t.Errorf("RedirectPath(%s, %q) = %v, want %v", tc.target, tc.pattern, got, tc.want)
		}
		if tc.want || strings.Contains(tc.target, "//") || strings.Contains(tc.target, "/.") {
			continue
		}
		if n := testing.AllocsPerRun(100, func() { ratelimit.RedirectPath(r, tc.pattern) }); n != 0 {
			t.Errorf("RedirectPath(%s, %q): %v allocations, want 0", tc.target, tc.pattern, n)
		}
	}
}

// some returns up to n keys of m.
func some(m map[string]bool, n int) []string {
	var ks []string
	for k := range m {
		if len(ks) == n {
			break
		}
		ks = append(ks, k)
	}
	return ks
}

// TestTopLevelRouteLayerOneBatch checks that one Limiter around a whole
// ServeMux holds a per-IP layer and a login-only route layer, and that a
// login refused by the route layer charges the per-IP layer nothing.
func TestTopLevelRouteLayerOneBatch(t *testing.T) {
	mux := http.NewServeMux()
	served := 0
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ })
	mux.Handle("POST /login", ok)
	mux.Handle("GET /hello", ok)
	ip := ratelimit.MustClientIP()
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ip, Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.PerMinute(2).Named("login"), Routes: []string{"POST /login"}},
	}, ratelimit.WithServeMux(mux))
	h := l.Handler(mux)
	do := func(method, target string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, muxReq(method, target, "192.0.2.1:1"))
		return rec.Code
	}
	for i, want := range []int{200, 200, 429, 429, 429} {
		if got := do("POST", "/login"); got != want {
			t.Fatalf("login %d: %d, want %d", i, got, want)
		}
	}
	// Two logins charged per-ip; the three refused ones did not: 8 left.
	for i := range 8 {
		if got := do("GET", "/hello"); got != 200 {
			t.Fatalf("hello %d: %d, want 200", i, got)
		}
	}
	if got := do("GET", "/hello"); got != 429 {
		t.Fatalf("hello over per-ip: %d, want 429", got)
	}
	if served != 10 {
		t.Fatalf("served %d, want 10", served)
	}
	// A path the mux does not match is not keyed by route: the per-IP
	// layer (exhausted here) still decides it.
	if got := do("GET", "/nope"); got != 429 {
		t.Fatalf("unmatched path: %d, want 429 from per-ip", got)
	}
}

// TestUnmatchedRouteLayerDoesNotApply checks that a route layer does not
// apply to a request the mux matches no route for, which the mux answers.
func TestUnmatchedRouteLayerDoesNotApply(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /hello", mwOK)
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Route(), Rule: core.PerMinute(1).Named("route")}}, ratelimit.WithServeMux(mux))
	h := l.Handler(mux)
	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, muxReq("GET", "/nope", "192.0.2.1:1"))
		if rec.Code != http.StatusNotFound {
			t.Fatalf("unmatched: %d, want 404 from the mux", rec.Code)
		}
	}
}

// TestRouteLayerWithoutPatternIsLoud checks that a Route layer mounted
// before routing without WithServeMux is a configuration error: 500, the
// error handler sees ErrConfig wrapping ErrNoRoute, one log line; never a
// silent skip.
func TestRouteLayerWithoutPatternIsLoud(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("POST /login", mwOK)
	logs, logOpt := newLogBuf()
	var er errRecorder
	for _, routes := range [][]string{nil, {"POST /login"}} {
		l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.PerMinute(2).Named("login"), Routes: routes}}, logOpt, er.option())
		h := l.Handler(mux)
		for range 3 {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, muxReq("POST", "/login", "192.0.2.1:1"))
			if rec.Code != http.StatusInternalServerError {
				t.Fatalf("routes %v: %d, want 500", routes, rec.Code)
			}
		}
	}
	errs := er.all()
	if len(errs) != 6 || !errors.Is(errs[0], ratelimit.ErrConfig) || !errors.Is(errs[0], ratelimit.ErrNoRoute) || errors.Is(errs[0], ratelimit.ErrStoreFailure) ||
		errs[0].Error() != `ratelimit: configuration error: layer "login": no route pattern: the limiter runs before routing` {
		t.Fatalf("error handler saw %v", errs)
	}
	if n := logs.count("a Route layer found no route pattern"); n != 2 {
		t.Fatalf("logged %d times (once per Limiter wanted):\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `layer="\"login\""`) {
		t.Errorf("log line does not name the layer:\n%s", logs)
	}
}

// TestMissingKeyRefuse checks that a layer with IfNoKey NoKeyRefuse refuses a
// request without its key (401 by default, error handler first) and charges
// nothing.
func TestMissingKeyRefuse(t *testing.T) {
	var er errRecorder
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.Header("X-API-Key"), Rule: core.PerMinute(1).Named("api-key"), IfNoKey: ratelimit.NoKeyRefuse}}, er.option())
	for range 3 {
		if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusUnauthorized {
			t.Fatalf("no key: %d, want 401", rec.Code)
		}
	}
	if e.served.Load() != 0 {
		t.Fatalf("served %d requests without a key", e.served.Load())
	}
	if errs := er.all(); len(errs) != 3 || !errors.Is(errs[0], ratelimit.ErrMissingKey) {
		t.Fatalf("error handler saw %v", errs)
	}
	if rec := e.do(t, mwReq("192.0.2.1:1", "X-API-Key", "k1")); rec.Code != 200 {
		t.Fatalf("with key: %d", rec.Code)
	}
	if rec := e.do(t, mwReq("192.0.2.1:1", "X-API-Key", "k1")); rec.Code != 429 {
		t.Fatalf("with key, second: %d", rec.Code)
	}
	// The error handler may answer 400 instead.
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.Header("X-API-Key"), Rule: core.PerMinute(1).Named("api-key"), IfNoKey: ratelimit.NoKeyRefuse}},
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, ratelimit.ErrMissingKey) {
				http.Error(w, "X-API-Key required", http.StatusBadRequest)
			}
		}))
	if rec := e2.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusBadRequest {
		t.Fatalf("custom answer: %d, want 400", rec.Code)
	}
}

// TestFirstOfFallbackLimits checks that leaving the API key out does not
// escape a single-layer limiter keyed by FirstOf(Header, ClientIP).
func TestFirstOfFallbackLimits(t *testing.T) {
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.FirstOf(ratelimit.Header("X-API-Key", ratelimit.HashKey()), ratelimit.MustClientIP()), Rule: core.PerMinute(2).Named("api")}})
	var codes []int
	for range 3 {
		codes = append(codes, e.do(t, mwReq("192.0.2.1:1")).Code)
	}
	codes = append(codes, e.do(t, mwReq("192.0.2.1:1", "X-API-Key", "k")).Code)
	if want := []int{200, 200, 429, 200}; !equalInts(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
}

// TestDuplicatePoliciesAtRequestTime checks that two layers whose Resolvers
// return equally named policies for one key are a configuration error,
// answered 500 under fail-open, never served unlimited, and logged once.
func TestDuplicatePoliciesAtRequestTime(t *testing.T) {
	pro := core.MustPolicy(core.PerMinute(100).Named("pro"))
	res := core.ResolverFunc(func(ctx context.Context, key string) (*core.Policy, error) { return pro, nil })
	ip := ratelimit.MustClientIP()
	logs, logOpt := newLogBuf()
	var er errRecorder
	e := mwNew(t, []ratelimit.Layer{
		{Key: ip, Rule: core.PerMinute(10).Named("a"), Resolver: res},
		{Key: ip, Rule: core.PerMinute(10).Named("b"), Resolver: res},
	}, logOpt, er.option())
	expectConfigErrors(t, e, &er, logs, core.ErrDuplicateRequest)
	if err := er.all()[0]; strings.Count(err.Error(), "ratelimit:") != 1 {
		t.Fatalf("error %q: want one \"ratelimit:\" prefix", err)
	}
}

// TestResolverPolicyNamedAsAnotherLayer checks that a policy a Resolver
// returns without listing it, named as another layer, is a configuration
// error even when the two layers' keys differ (one request's or not): it
// would keep the resolving layer's state in the other layer's namespace,
// so that a user whose id reads as an IP address spent that IP's quota. A
// Reset through that layer is refused too.
func TestResolverPolicyNamedAsAnotherLayer(t *testing.T) {
	clash := core.MustPolicy(core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour})
	res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return clash, nil })
	logs, logOpt := newLogBuf()
	var er errRecorder
	e := mwNew(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour}},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 100, Window: time.Hour}, Resolver: res},
	}, logOpt, er.option())
	for range 3 {
		if rec := e.do(t, mwUserReq("192.0.2.1:1", "192.0.2.9")); rec.Code != http.StatusInternalServerError {
			t.Fatalf("a request whose per-user policy is named per-ip: %d, want 500", rec.Code)
		}
	}
	if errs := er.all(); len(errs) != 3 || !errors.Is(errs[0], ratelimit.ErrConfig) {
		t.Fatalf("error handler saw %v, want ErrConfig", errs)
	}
	if logs.count("configuration error at request time") != 1 {
		t.Fatalf("logs:\n%s", logs)
	}
	// The per-ip state of 192.0.2.9 is untouched: its first request has
	// the whole quota.
	rec := e.do(t, mwReq("192.0.2.9:1"))
	if rec.Code != http.StatusOK || rec.Header().Get(ratelimit.HeaderRateLimitRemaining) != "2" {
		t.Fatalf("first request from 192.0.2.9: %d, remaining %q; want 200 and 2", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitRemaining))
	}
	if err := e.l.Reset(context.Background(), "per-user", "192.0.2.9"); !errors.Is(err, ratelimit.ErrConfig) {
		t.Fatalf("Reset through the per-user layer: %v, want ErrConfig", err)
	}
}

// expectConfigErrors serves 3 requests through e and checks that each is
// answered 500 with an error wrapping ErrConfig and cause (never a store
// failure), nothing served, and one line logged.
func expectConfigErrors(t *testing.T, e *mwEnv, er *errRecorder, logs *logBuf, cause error) {
	t.Helper()
	for range 3 {
		if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", rec.Code)
		}
	}
	if e.served.Load() != 0 {
		t.Fatalf("served %d", e.served.Load())
	}
	errs := er.all()
	if len(errs) != 3 || !errors.Is(errs[0], ratelimit.ErrConfig) || !errors.Is(errs[0], cause) || errors.Is(errs[0], ratelimit.ErrStoreFailure) {
		t.Fatalf("error handler saw %v", errs)
	}
	if logs.count("configuration error at request time") != 1 || logs.count("fail-open") != 0 {
		t.Fatalf("logs:\n%s", logs)
	}
}

// TestDuplicateNamesAtConstruction checks that New refuses names that clash
// across layers, including the policies a layer's Tiers resolver lists, and
// says so with one prefix and the user's own words.
func TestDuplicateNamesAtConstruction(t *testing.T) {
	ip := ratelimit.MustClientIP()
	tiers, err := core.Tiers(func(context.Context, string) string { return "pro" }, map[string]core.Rule{
		"pro": core.PerMinute(100).Named("per-user"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		layers []ratelimit.Layer
		want   string
	}{
		{"tier clashes with a layer", []ratelimit.Layer{
			{Key: ip, Rule: core.PerMinute(10).Named("per-user")},
			{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("users"), Resolver: tiers},
		}, `ratelimit: layer "per-user" and layer "users" (a policy its Resolver can return) are both named "per-user"`},
		{"a layer clashes with a tier listed before it", []ratelimit.Layer{
			{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("users"), Resolver: tiers},
			{Key: ip, Rule: core.PerMinute(10).Named("per-user")},
		}, `ratelimit: layer "users" (a policy its Resolver can return) and layer "per-user" are both named "per-user"`},
		{"two unnamed layers", []ratelimit.Layer{
			{Key: ip, Rule: core.PerMinute(10)},
			{Key: ratelimit.User(), Rule: core.PerMinute(10)},
		}, "ratelimit: layers 0 and 1 are both unnamed (both named \"default\" by default): name them with Rule.Named"},
		{"invalid rule", []ratelimit.Layer{
			{Key: ip, Rule: core.Rule{Name: "login", Limit: -1, Window: time.Minute}},
		}, `ratelimit: layer "login": invalid rule`},
		{"invalid unnamed rule", []ratelimit.Layer{
			{Key: ip, Rule: core.Rule{Limit: 1}},
		}, `ratelimit: layer 0 (unnamed): invalid rule`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ratelimit.New(tc.layers)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Count(err.Error(), "ratelimit:") != 1 {
				t.Fatalf("err = %v, want prefix %q and one \"ratelimit:\"", err, tc.want)
			}
		})
	}
	// A tier sharing its own layer's name is fine: one layer decides one
	// policy per request.
	if _, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("per-user"), Resolver: tiers}}); err != nil {
		t.Fatalf("tier named like its own layer: %v", err)
	}
}

// ctxStore is a Store that fails with the context's error once the context
// ends, as a network store does when the client goes away.
type ctxStore struct{}

func (ctxStore) Take(ctx context.Context, _ time.Time, _ []core.Request, _ []core.Decision) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestClientGoneIsNotStoreFailure checks that a store error caused by the
// request's own context ending is not a store failure: no error handler,
// no 503 under fail-closed, no fail-open log line; nothing is written.
func TestClientGoneIsNotStoreFailure(t *testing.T) {
	for _, opts := range [][]ratelimit.Option{nil, {ratelimit.WithFailClosed()}} {
		logs, logOpt := newLogBuf()
		var er errRecorder
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip")}},
			append([]ratelimit.Option{ratelimit.WithStore(ctxStore{}), logOpt, er.option()}, opts...)...)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rec := e.do(t, mwReq("192.0.2.1:1").WithContext(ctx))
		if rec.Body.Len() != 0 || len(rec.Header()) != 0 || e.served.Load() != 0 {
			t.Fatalf("wrote %d %q %v, served %d", rec.Code, rec.Body, rec.Header(), e.served.Load())
		}
		if errs := er.all(); len(errs) != 0 {
			t.Fatalf("error handler saw %v", errs)
		}
		if logs.String() != "" {
			t.Fatalf("logged:\n%s", logs)
		}
		res := e.l.Decide(mwReq("192.0.2.1:1").WithContext(ctx))
		if res.Proceed || !errors.Is(res.Err, context.Canceled) || errors.Is(res.Err, ratelimit.ErrStoreFailure) {
			t.Fatalf("Decide: %+v", res)
		}
	}
}

// canceledStore fails every Take with context.Canceled while the caller's
// context is live, as a store whose call was shared with another,
// cancelled request would.
type canceledStore struct{}

func (canceledStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return fmt.Errorf("shared call: %w", context.Canceled)
}

// TestForeignCancelIsStoreFailure checks that a context.Canceled from a
// store or a Resolver, for a request whose own context is live, is a store
// failure under the fail policy (reported, 503 fail-closed, served
// fail-open), not a request that ended and is answered with nothing.
func TestForeignCancelIsStoreFailure(t *testing.T) {
	canceled := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) {
		return nil, fmt.Errorf("shared lookup: %w", context.Canceled)
	})
	cases := []struct {
		name  string
		layer ratelimit.Layer
		opts  []ratelimit.Option
	}{
		{"store", ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip")}, []ratelimit.Option{ratelimit.WithStore(canceledStore{})}},
		{"resolver", ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip"), Resolver: canceled}, nil},
	}
	for _, tc := range cases {
		for _, closed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/failClosed=%v", tc.name, closed), func(t *testing.T) {
				var er errRecorder
				opts := append([]ratelimit.Option{er.option()}, tc.opts...)
				if closed {
					opts = append(opts, ratelimit.WithFailClosed())
				}
				e := mwNew(t, []ratelimit.Layer{tc.layer}, opts...)
				rec := e.do(t, mwReq("192.0.2.1:1"))
				want, served := http.StatusOK, int64(1)
				if closed {
					want, served = http.StatusServiceUnavailable, 0
				}
				if rec.Code != want || e.served.Load() != served {
					t.Fatalf("status %d, served %d; want %d, %d", rec.Code, e.served.Load(), want, served)
				}
				if errs := er.all(); len(errs) != 1 || !errors.Is(errs[0], ratelimit.ErrStoreFailure) {
					t.Fatalf("error handler saw %v, want one store failure", errs)
				}
			})
		}
	}
}

// TestFailOpenLoggedOnce checks the one-time fail-open log line.
func TestFailOpenLoggedOnce(t *testing.T) {
	logs, logOpt := newLogBuf()
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip")}}, ratelimit.WithStore(&mwFailStore{}), logOpt)
	for range 3 {
		if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != 200 {
			t.Fatalf("fail-open: %d", rec.Code)
		}
	}
	if n := logs.count("store errors are being served fail-open"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs)
	}
	// Fail-closed serves nothing and so logs nothing of the kind.
	logs2, logOpt2 := newLogBuf()
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip")}}, ratelimit.WithStore(&mwFailStore{}), logOpt2, ratelimit.WithFailClosed())
	e2.do(t, mwReq("192.0.2.1:1"))
	if logs2.count("fail-open") != 0 {
		t.Fatalf("fail-closed logged:\n%s", logs2)
	}
}

// TestDecideFailOpenLogged: a Result of Decide that proceeds past a failed
// store, which its caller serves, is logged once, as the handlers log it.
func TestDecideFailOpenLogged(t *testing.T) {
	logs, logOpt := newLogBuf()
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("ip")}},
		ratelimit.WithStore(&mwFailStore{}), logOpt)
	for range 3 {
		if res := l.Decide(mwReq("192.0.2.1:1")); !res.Proceed || res.Err == nil {
			t.Fatalf("fail-open: %+v", res)
		}
	}
	if n := logs.count("store errors are being served fail-open"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs)
	}
}

// flakySlots is a SlotTable whose calls fail while down is set.
type flakySlots struct {
	down *atomic.Bool
	t    *core.SlotTable
}

func (s flakySlots) Acquire(ctx context.Context, reqs []core.SlotRequest, out []core.SlotDecision) (func(), error) {
	if s.down.Load() {
		return nil, errors.New("slot backend down")
	}
	return s.t.Acquire(ctx, reqs, out)
}

// TestSlotOnlyFailOpenKeepsRateLine: a slot store failing for a request
// whose only applied layers are concurrency layers (an anonymous request,
// the per-user rate layer skipped) is logged on the slot store's line, so
// that the rate store failing later is logged on its own.
func TestSlotOnlyFailOpenKeepsRateLine(t *testing.T) {
	var slotsDown, storeDown, fellBack atomic.Bool
	logs, logOpt := newLogBuf()
	e := mwNew(t, []ratelimit.Layer{
		{Key: ratelimit.User(), Rule: core.PerMinute(1).Named("per-user")},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "conc"}, InFlight: 2},
	}, logOpt, ratelimit.WithSlotStore(flakySlots{&slotsDown, core.NewSlotTable(0)}),
		ratelimit.WithStore(switchStore{&storeDown, &fellBack, core.MustMemoryStore(nil)}))
	slotsDown.Store(true)
	if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 200 {
		t.Fatalf("slot store down: %d", c)
	}
	slotsDown.Store(false)
	storeDown.Store(true)
	for range 3 {
		if c := e.do(t, mwUserReq("192.0.2.1:1", "alice")).Code; c != 200 {
			t.Fatalf("rate store down: %d", c)
		}
	}
	if n := logs.count("in-flight slot store errors are being served fail-open"); n != 1 {
		t.Errorf("the slot store's line logged %d times:\n%s", n, logs)
	}
	if n := logs.count(`ratelimit: store errors are being served fail-open`); n != 1 {
		t.Errorf("the rate store's line logged %d times:\n%s", n, logs)
	}
}

// TestForwardedFromPrivatePeerLogged checks the one-time warning for
// forwarded headers from a loopback or private peer nothing trusts, whatever
// else the key holds, that it never carries the address, and that a trusted
// proxy whose client is keyed by a network holding the proxy too (whichever
// header and hop count name the client) is not warned of.
func TestForwardedFromPrivatePeerLogged(t *testing.T) {
	cases := []struct {
		name   string
		key    ratelimit.KeyFunc
		remote string
		kv     []string // header names and values; nil: X-Forwarded-For: 198.51.100.77
		want   int
	}{
		{"private peer, no proxy trusted", ratelimit.MustClientIP(), "10.1.2.3:5", nil, 1},
		{"FirstOf(User, Composite(IP, g))", ratelimit.FirstOf(ratelimit.User(), ratelimit.Composite(ratelimit.MustClientIP(), ratelimit.Global("g"))), "10.1.2.3:5", nil, 1},
		{"proxy trusted, its clients keyed by a /24 holding it", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.1.2.3"), ratelimit.IPv4Prefix(24)), "10.1.2.3:5", []string{"X-Forwarded-For", "10.1.2.77"}, 0},
		{"proxy trusted, Forwarded", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.1.2.3"), ratelimit.IPv4Prefix(24), ratelimit.FromHeader("Forwarded")), "10.1.2.3:5", []string{"Forwarded", `for="10.1.2.77:1234";proto=https`}, 0},
		{"loopback v6 peer in a composite", ratelimit.Composite(ratelimit.Global("g"), ratelimit.MustClientIP()), "[::1]:5", nil, 1},
		{"ipv4 /24 network", ratelimit.MustClientIP(ratelimit.IPv4Prefix(24)), "10.1.2.3:5", nil, 1},
		{"ip first in a composite", ratelimit.Composite(ratelimit.MustClientIP(), ratelimit.Global("g")), "10.1.2.3:5", nil, 1},
		{"ip in a nested composite", ratelimit.Composite(ratelimit.Global("g"), ratelimit.Composite(ratelimit.MustClientIP(), ratelimit.Global("h"))), "10.1.2.3:5", nil, 1},
		{"FirstOf(User, IP)", ratelimit.FirstOf(ratelimit.User(), ratelimit.MustClientIP()), "127.0.0.1:5", nil, 1},
		{"ipv6 /48 loopback", ratelimit.MustClientIP(ratelimit.IPv6Prefix(48)), "[::1]:5", nil, 1},
		{"ipv6 /128 loopback", ratelimit.MustClientIP(ratelimit.IPv6Prefix(128)), "[::1]:5", nil, 1},
		{"another key", ratelimit.Composite(ratelimit.Global("10.1.2.4"), ratelimit.Global("g")), "10.1.2.3:5", nil, 0},
		{"public peer", ratelimit.MustClientIP(), "203.0.113.9:5", nil, 0},
		{"proxy trusted", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8")), "10.1.2.3:5", nil, 0},
		{"Composite(tenant, ClientIP()) v6 /64", ratelimit.Composite(ratelimit.Header("X-Tenant"), ratelimit.MustClientIP()),
			"[fd00::1]:5", []string{"X-Tenant", "42", "X-Forwarded-For", "2001:db8::77"}, 1},
		{"Composite(ClientIP(/128), tenant) v6", ratelimit.Composite(ratelimit.MustClientIP(ratelimit.IPv6Prefix(128)), ratelimit.Header("X-Tenant")),
			"[fd00::1]:5", []string{"X-Tenant", "42", "X-Forwarded-For", "2001:db8::77"}, 1},
		{"trusted, X-Real-IP, client-sent XFF passed through", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.1.2.3"), ratelimit.IPv4Prefix(24), ratelimit.FromHeader("X-Real-IP")),
			"10.1.2.3:5", []string{"X-Real-IP", "10.1.2.77", "X-Forwarded-For", "198.51.100.7"}, 0},
		{"trusted, XFF with an empty last element", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.1.2.3"), ratelimit.IPv4Prefix(24)),
			"10.1.2.3:5", []string{"X-Forwarded-For", "10.1.2.77,"}, 0},
		{"trusted, two hops", ratelimit.MustClientIP(ratelimit.TrustedHops(2), ratelimit.IPv4Prefix(16)),
			"10.1.2.3:5", []string{"X-Forwarded-For", "10.1.9.9, 172.16.0.1"}, 0},
		{"trusted local proxy, a request from the host itself", ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("127.0.0.1/32")),
			"127.0.0.1:50000", []string{"X-Forwarded-For", "127.0.0.1"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logs, logOpt := newLogBuf()
			e := mwNew(t, []ratelimit.Layer{{Key: tc.key, Rule: core.PerMinute(100).Named("ip")}}, logOpt)
			kv := tc.kv
			if kv == nil {
				kv = []string{"X-Forwarded-For", "198.51.100.77"}
			}
			for range 3 {
				if rec := e.do(t, mwReq(tc.remote, kv...)); rec.Code != 200 {
					t.Fatalf("status %d", rec.Code)
				}
			}
			if n := logs.count("forwarded headers arrive from a loopback or private peer"); n != tc.want {
				t.Fatalf("logged %d times, want %d:\n%s", n, tc.want, logs)
			}
			if s := logs.String(); strings.Contains(s, "10.1.2.3") || strings.Contains(s, "198.51.100.77") || strings.Contains(s, "::1") {
				t.Fatalf("log carries an address:\n%s", s)
			}
		})
	}
}

// TestForwardedSampledAfterFirstRequests checks that a Limiter examines
// forwarded headers on each of its first ForwardedCheckFirst requests
// whatever the time, and after them only on requests whose decision time
// falls in the sampled slot of 64 (units of 1,024 ns), one such request
// being enough for the warning.
func TestForwardedSampledAfterFirstRequests(t *testing.T) {
	const warning = "forwarded headers arrive from a loopback or private peer"
	// base is a sampled time; base+k*1024 for k in 1..63 are not.
	base := (mwT0.UnixNano()>>16 + 1) << 16
	unsampled := time.Unix(0, base+1024)
	forwarded := func() *http.Request { return mwReq("10.1.2.3:5", "X-Forwarded-For", "198.51.100.77") }
	newEnv := func(t *testing.T, plain int) (*mwEnv, *logBuf) {
		logs, logOpt := newLogBuf()
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1 << 20).Named("ip")}}, logOpt)
		e.clk.Set(unsampled)
		for range plain {
			e.do(t, mwReq("203.0.113.9:5"))
		}
		return e, logs
	}

	t.Run("last of the first requests", func(t *testing.T) {
		e, logs := newEnv(t, ratelimit.ForwardedCheckFirst-1)
		e.do(t, forwarded())
		if n := logs.count(warning); n != 1 {
			t.Fatalf("request %d, outside the sampled slot: logged %d times, want 1:\n%s", ratelimit.ForwardedCheckFirst, n, logs)
		}
	})

	t.Run("after the first requests", func(t *testing.T) {
		e, logs := newEnv(t, ratelimit.ForwardedCheckFirst)
		for k := int64(1); k < 64; k++ {
			e.clk.Set(time.Unix(0, base+k*1024))
			e.do(t, forwarded())
		}
		if n := logs.count(warning); n != 0 {
			t.Fatalf("logged %d times on requests outside the sampled slot:\n%s", n, logs)
		}
		e.clk.Set(time.Unix(0, base+64*1024+1023))
		e.do(t, forwarded())
		if n := logs.count(warning); n != 1 {
			t.Fatalf("logged %d times after a request in the sampled slot, want 1:\n%s", n, logs)
		}
	})
}

// TestForwardedCheckedWhenWaitingRoomFull checks that a request refused for
// a full waiting room is still examined for forwarded headers: behind an
// untrusted proxy with a shaping rule, most requests may take that path.
func TestForwardedCheckedWhenWaitingRoomFull(t *testing.T) {
	logs, logOpt := newLogBuf()
	layers := []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}}}
	e := mwNew(t, layers, logOpt, ratelimit.WithMaxWaiting(1))
	entered, release := holdWait(e.l)
	e.do(t, mwReq("10.1.2.3:5")) // served at once
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.do(t, mwReq("10.1.2.3:5")) // waits, filling the room
	}()
	<-entered
	rec := e.do(t, mwReq("10.1.2.3:5", "X-Forwarded-For", "198.51.100.77"))
	close(release)
	<-done
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429 for a full waiting room", rec.Code)
	}
	if n := logs.count("forwarded headers arrive from a loopback or private peer"); n != 1 {
		t.Fatalf("logged %d times, want 1:\n%s", n, logs)
	}
}

// TestAbsentKeyLogged checks the one-time warning for a layer whose key was
// absent on every one of its first AbsentKeyLogAfter requests, and that
// WithLogger(nil) silences it.
func TestAbsentKeyLogged(t *testing.T) {
	logs, logOpt := newLogBuf()
	e := mwNew(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1 << 20).Named("ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("per-user")},
	}, logOpt)
	for range ratelimit.AbsentKeyLogAfter - 1 {
		e.do(t, mwReq("192.0.2.1:1"))
	}
	if logs.count("key was absent") != 0 {
		t.Fatalf("logged early:\n%s", logs)
	}
	for range 5 {
		e.do(t, mwReq("192.0.2.1:1"))
	}
	if logs.count("key was absent") != 1 || !strings.Contains(logs.String(), `layer="\"per-user\""`) {
		t.Fatalf("want one line naming the layer:\n%s", logs)
	}
	// A layer that met its key once is never reported.
	logs2, logOpt2 := newLogBuf()
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("per-user")}}, logOpt2)
	e2.do(t, mwUserReq("192.0.2.1:1", "alice"))
	for range 2 * ratelimit.AbsentKeyLogAfter {
		e2.do(t, mwReq("192.0.2.1:1"))
	}
	if logs2.String() != "" {
		t.Fatalf("logged:\n%s", logs2)
	}
	// A layer that refuses a request without its key (401) limits those
	// requests: it is never reported as limiting nothing.
	logs4, logOpt4 := newLogBuf()
	e4 := mwNew(t, []ratelimit.Layer{
		{Key: ratelimit.Header("X-API-Key"), Rule: core.PerMinute(10).Named("per-key"), IfNoKey: ratelimit.NoKeyRefuse},
	}, logOpt4)
	for range ratelimit.AbsentKeyLogAfter + 1 {
		if rec := e4.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", rec.Code)
		}
	}
	if logs4.String() != "" {
		t.Fatalf("a layer that refused every request without its key was logged:\n%s", logs4)
	}
	// WithLogger(nil) is silent (and does not panic).
	e3 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.User(), Rule: core.PerMinute(10).Named("per-user")}}, ratelimit.WithLogger(nil), ratelimit.WithStore(&mwFailStore{}))
	for range 2 * ratelimit.AbsentKeyLogAfter {
		e3.do(t, mwReq("10.0.0.1:1", "X-Forwarded-For", "1.2.3.4"))
	}
}

// TestUnmatchedRoutesLogged checks the one-time warning for a layer whose
// Routes matched none of its first UnmatchedRoutesLogAfter routed requests
// (an entry written in another form than the route keys), and that a
// layer whose Routes matched once is never reported.
func TestUnmatchedRoutesLogged(t *testing.T) {
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux.Handle("/login", ok) // every method: the route key is "/login"
	mux.Handle("GET /hello", ok)
	for _, tc := range []struct {
		routes []string
		want   int
	}{
		{[]string{"POST /login"}, 1}, // never matches
		{[]string{"/login"}, 0},
	} {
		logs, logOpt := newLogBuf()
		e := mwNew(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1 << 30).Named("ip")},
			{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1 << 30).Named("login"), Routes: tc.routes},
		}, logOpt, ratelimit.WithServeMux(mux))
		l := e.l
		if tc.want == 0 {
			l.Decide(muxReq("POST", "/login", "192.0.2.1:1"))
		}
		for range ratelimit.UnmatchedRoutesLogAfter - 1 {
			l.Decide(muxReq("GET", "/hello", "192.0.2.1:1"))
		}
		if n := logs.count("Routes matched none"); n != 0 {
			t.Fatalf("%v: logged early:\n%s", tc.routes, logs)
		}
		for range 3 {
			l.Decide(muxReq("GET", "/hello", "192.0.2.1:1"))
		}
		if n := logs.count("Routes matched none"); n != tc.want {
			t.Fatalf("%v: logged %d times, want %d:\n%s", tc.routes, n, tc.want, logs)
		}
		if tc.want == 1 && (!strings.Contains(logs.String(), `layer="\"login\""`) || !strings.Contains(logs.String(), `last_route="GET /hello"`)) {
			t.Fatalf("want the layer and the last route named:\n%s", logs)
		}
	}
}

// TestStoreTooSmallForLayersIsConfigError: a memory store whose capacity
// cannot hold one request's keys answers 500 as a configuration error, not
// a 429 promising a retry that can never succeed.
func TestStoreTooSmallForLayersIsConfigError(t *testing.T) {
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1, KeepActive: true})
	var got error
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("a")},
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("b")},
	}, ratelimit.WithStore(store), ratelimit.WithLogger(nil),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = err })))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") })).ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError || !errors.Is(got, ratelimit.ErrConfig) || !errors.Is(got, core.ErrStoreFull) {
		t.Fatalf("status %d, error %v; want 500 with a configuration error wrapping core.ErrStoreFull", w.Code, got)
	}
	if w.Header().Get("Retry-After") != "" {
		t.Errorf("Retry-After %q promises a retry that can never succeed", w.Header().Get("Retry-After"))
	}
}

// TestServeMuxOuterCatchAllBeforeStrip checks that an outer mux's catch-all
// "/" in front of http.StripPrefix("/app", ...) is not taken for the
// Limiter's own pattern because its mux has a catch-all "/" too: the route
// the inner mux serves, "/users", is limited.
func TestServeMuxOuterCatchAllBeforeStrip(t *testing.T) {
	inner := http.NewServeMux()
	l := mwLimiter(t, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.PerMinute(1).Named("users"),
		Routes: []string{"/users"},
	}}, ratelimit.WithServeMux(inner))
	inner.HandleFunc("/users", func(w http.ResponseWriter, r *http.Request) {})
	inner.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {}) // home page
	outer := http.NewServeMux()
	outer.Handle("/", http.StripPrefix("/app", l.Handler(inner))) // the app deployed under /app
	if codes, want := serveCodes(outer, 3, "/app/users"), []int{200, 429, 429}; !equalInts(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
}

// BenchmarkNestedMux: a Limiter that routes with its application mux,
// mounted under an outer mux's "/" (http.Handle("/", l.Handler(mux)) and
// ListenAndServe(addr, nil)): nothing is cut from the path, so finding the
// route costs no parsing of the request URI.
func BenchmarkNestedMux(b *testing.B) {
	inner := http.NewServeMux()
	l, err := ratelimit.New([]ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "users", Limit: 1 << 40, Window: time.Second},
		Routes: []string{"/users"},
	}}, ratelimit.WithServeMux(inner), ratelimit.WithClock(core.NewFakeClock(mwT0)), ratelimit.WithLogger(nil))
	if err != nil {
		b.Fatal(err)
	}
	inner.HandleFunc("/users", func(w http.ResponseWriter, r *http.Request) {})
	outer := http.NewServeMux()
	outer.Handle("/", l.Handler(inner))
	req := httptest.NewRequest("GET", "/users", nil)
	req.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		outer.ServeHTTP(w, req)
	}
}

// pickyStore is a MemoryStore that, as a Redis store does for custom
// algorithms, cannot decide some valid policies: those of Limit 13.
type pickyStore struct{ *core.MemoryStore }

func (s pickyStore) CheckPolicy(p *core.Policy) error {
	if p.Limit() == 13 {
		return fmt.Errorf("picky store: policy %q: %w", p.Name(), core.ErrUnsupportedPolicy)
	}
	return nil
}

func (s pickyStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	for _, r := range reqs {
		if err := s.CheckPolicy(r.Policy); err != nil {
			return err
		}
	}
	return s.MemoryStore.Take(ctx, now, reqs, out)
}

// TestPolicyTheStoreCannotDecide checks that a policy the store cannot
// decide (core.PolicyChecker) is refused by New, for a layer's rule and
// for a policy its Resolver lists, and by SetRules, which keeps the rules
// in force; and that one a Resolver returns without listing it is answered
// as a configuration error, never served fail-open.
func TestPolicyTheStoreCannotDecide(t *testing.T) {
	store := ratelimit.WithStore(pickyStore{core.MustMemoryStore(nil)})
	ip := ratelimit.MustClientIP()
	tiers, err := core.Tiers(func(context.Context, string) string { return "pro" }, map[string]core.Rule{"pro": core.PerMinute(13).Named("pro")})
	if err != nil {
		t.Fatal(err)
	}
	for want, layers := range map[string][]ratelimit.Layer{
		`ratelimit: layer "api": picky store: policy "api"`:               {{Key: ip, Rule: core.PerMinute(13).Named("api")}},
		`ratelimit: a policy a Resolver lists: picky store: policy "pro"`: {{Key: ip, Rule: core.PerMinute(5).Named("users"), Resolver: tiers}},
	} {
		if _, err := ratelimit.New(layers, store); err == nil || !errors.Is(err, core.ErrUnsupportedPolicy) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("New: %v, want %q... wrapping core.ErrUnsupportedPolicy", err, want)
		}
	}

	// SetRules: refused, and the rule in force still limits.
	e := mwNew(t, []ratelimit.Layer{{Key: ip, Rule: core.PerMinute(2).Named("api")}}, store)
	if err := e.l.SetRules(map[string]core.Rule{"api": core.PerMinute(13)}); !errors.Is(err, core.ErrUnsupportedPolicy) || !strings.HasPrefix(err.Error(), `ratelimit: SetRules: layer "api": picky store`) {
		t.Fatalf("SetRules to a rule the store cannot decide: %v", err)
	}
	if got := e.l.Rules()["api"]; got.Limit != 2 {
		t.Fatalf("rules after the refused SetRules: %+v", got)
	}
	codes := ""
	for range 3 {
		codes += fmt.Sprint(e.do(t, mwReq("192.0.2.1:1")).Code, " ")
	}
	if codes != "200 200 429 " {
		t.Fatalf("after the refused SetRules: %s", codes)
	}

	// A Resolver returning, unlisted, a policy the store cannot decide.
	logs, logOpt := newLogBuf()
	var er errRecorder
	pro := core.MustPolicy(core.PerMinute(13).Named("pro"))
	res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return pro, nil })
	e = mwNew(t, []ratelimit.Layer{{Key: ip, Rule: core.PerMinute(5).Named("users"), Resolver: res}}, store, logOpt, er.option())
	expectConfigErrors(t, e, &er, logs, core.ErrUnsupportedPolicy)
}

// switchSlots is a SlotTable whose calls fail while down is set.
type switchSlots struct {
	down *atomic.Bool
	t    *core.SlotTable
}

func (s switchSlots) Acquire(ctx context.Context, reqs []core.SlotRequest, out []core.SlotDecision) (func(), error) {
	if s.down.Load() {
		return nil, errBackendDown
	}
	return s.t.Acquire(ctx, reqs, out)
}

// switchStore is a MemoryStore whose calls fail while down is set, and
// whose decisions say its fallback made them while fellBack is set.
type switchStore struct {
	down, fellBack *atomic.Bool
	m              *core.MemoryStore
}

func (s switchStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return s.decide(ctx, s.m.Take, now, reqs, out)
}

func (s switchStore) Peek(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return s.decide(ctx, s.m.Peek, now, reqs, out)
}

// decide is Take or Peek by f, failing while down is set and marking the
// decisions while fellBack is set.
func (s switchStore) decide(ctx context.Context, f func(context.Context, time.Time, []core.Request, []core.Decision) error,
	now time.Time, reqs []core.Request, out []core.Decision) error {
	if s.down.Load() {
		return errBackendDown
	}
	err := f(ctx, now, reqs, out)
	for i := range reqs {
		out[i].Fallback = s.fellBack.Load()
	}
	return err
}

// TestDegradedModesLogged checks that each way of limiting less is logged
// on its own line, once: a slot store failing open (concurrency layers
// off, rate layers on) does not use up the line of a rate store failing
// open (nothing limited), and neither is logged for requests the error
// handler stopped; decisions made by a store's fallback are logged too.
func TestDegradedModesLogged(t *testing.T) {
	var slotsDown, storeDown, fellBack atomic.Bool
	logs, logOpt := newLogBuf()
	layers := []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("rate")},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "conc"}, InFlight: 2},
	}
	e := mwNew(t, layers, logOpt, ratelimit.WithSlotStore(switchSlots{&slotsDown, core.NewSlotTable(0)}),
		ratelimit.WithStore(switchStore{&storeDown, &fellBack, core.MustMemoryStore(nil)}))
	slotsDown.Store(true)
	if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 200 {
		t.Fatalf("slot store down: %d", c)
	}
	if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 429 {
		t.Fatalf("the rate layer still limits while the slot store is down: %d", c)
	}
	slotsDown.Store(false)
	storeDown.Store(true)
	for range 3 {
		if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 200 {
			t.Fatalf("rate store down: %d", c)
		}
	}
	storeDown.Store(false)
	fellBack.Store(true)
	for range 3 {
		e.do(t, mwReq("192.0.2.2:1"))
	}
	for _, line := range []string{
		"in-flight slot store errors are being served fail-open",
		"msg=\"ratelimit: store errors are being served fail-open: requests are not limited while the store fails\" error=\"ratelimit: store failure: backend down\"",
		"its Fallback decides",
	} {
		if n := logs.count(line); n != 1 {
			t.Errorf("%q logged %d times:\n%s", line, n, logs)
		}
	}

	// An error handler that answers every store error itself: nothing is
	// served fail-open, so neither line is logged.
	logs, logOpt = newLogBuf()
	stop := ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(http.StatusServiceUnavailable) })
	slotsDown.Store(true)
	e = mwNew(t, layers, logOpt, stop, ratelimit.WithSlotStore(switchSlots{&slotsDown, core.NewSlotTable(0)}))
	if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 503 || e.served.Load() != 0 {
		t.Fatalf("slot store down, stopped by the error handler: %d, served %d", c, e.served.Load())
	}
	if n := logs.count("fail-open"); n != 0 {
		t.Errorf("nothing served fail-open, yet logged:\n%s", logs)
	}
}

// TestFallbackPeekNotLogged checks that a Limiter.Peek its store's
// fallback answers reports it (Decision.Fallback) without logging the
// fallback line, which is logged once, for the first decision that
// charges: a peek limits nothing.
func TestFallbackPeekNotLogged(t *testing.T) {
	var down, fellBack atomic.Bool
	fellBack.Store(true)
	logs, logOpt := newLogBuf()
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("rate")}}, logOpt,
		ratelimit.WithStore(switchStore{&down, &fellBack, core.MustMemoryStore(nil)}))
	res := e.l.Peek(mwReq("192.0.2.1:1"))
	if len(res.Layers) != 1 || !res.Layers[0].Decision.Fallback || !res.Proceed {
		t.Fatalf("peek: %+v, want one admitted layer decided by the fallback", res)
	}
	if n := logs.count("its Fallback decides"); n != 0 {
		t.Fatalf("a peek logged the fallback line:\n%s", logs)
	}
	for range 2 {
		if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != 200 {
			t.Fatalf("decided by the fallback: %d", c)
		}
	}
	if n := logs.count("its Fallback decides"); n != 1 {
		t.Errorf("fallback line logged %d times, want once:\n%s", n, logs)
	}
}

// TestResolverClashReported checks that a request answered 500 for a
// Resolver's clashing policy reaches the Observer once (promlimit counts
// it in ratelimit_errors_total), whether the policy is named as another
// layer or as the one another layer decides the same request under.
func TestResolverClashReported(t *testing.T) {
	pro := core.MustPolicy(core.PerMinute(100).Named("pro"))
	asLayer := core.MustPolicy(core.PerMinute(100).Named("a"))
	ip := ratelimit.MustClientIP()
	for _, c := range []struct {
		name   string
		layers []ratelimit.Layer
	}{
		{"same policy for two layers", []ratelimit.Layer{
			{Key: ip, Rule: core.PerMinute(10).Named("a"), Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return pro, nil })},
			{Key: ip, Rule: core.PerMinute(10).Named("b"), Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return pro, nil })},
		}},
		{"named as another layer", []ratelimit.Layer{
			{Key: ip, Rule: core.PerMinute(10).Named("a")},
			{Key: ip, Rule: core.PerMinute(10).Named("b"), Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return asLayer, nil })},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			obs := &mwObserver{}
			e := mwNew(t, c.layers, ratelimit.WithObserver(obs), ratelimit.WithLogger(nil))
			if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusInternalServerError {
				t.Fatalf("status %d, want 500", rec.Code)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if len(obs.errs) != 1 || !errors.Is(obs.errs[0].Err, core.ErrDuplicateRequest) && !strings.Contains(obs.errs[0].Err.Error(), "as layer") || len(obs.errs[0].Policies) != 2 {
				t.Fatalf("the Observer saw %+v, want one error naming the clash and both policies", obs.errs)
			}
		})
	}
}

// TestStoreFullAfterClientGoneReported checks that a full KeepActive
// store's refusal, met after the request's client went away, is what the
// Observer reports and the middleware answers (a store-full refusal, not a
// client gone): the two agree.
func TestStoreFullAfterClientGoneReported(t *testing.T) {
	obs := &mwObserver{}
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1, Shards: 1, KeepActive: true})
	var er errRecorder
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}}},
		ratelimit.WithStore(store), ratelimit.WithObserver(obs), ratelimit.WithLogger(nil), er.option())
	e.do(t, mwReq("192.0.2.1:1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client went away
	rec := e.do(t, mwReq("192.0.2.2:1").WithContext(ctx))
	nerr := obs.errCount()
	if nerr != 1 || rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the Observer saw %d errors, the request was answered %d; want the store-full refusal, reported once and answered 429", nerr, rec.Code)
	}
}

// TestResolverFailureReachesObserver: a layer's Resolver that fails is
// handled like a store failure (served fail-open here, logged once) and,
// like one, reported to the Observer on every request, under the layer's
// policy, so that metrics show the outage during which nothing is limited.
func TestResolverFailureReachesObserver(t *testing.T) {
	down := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) {
		return nil, errors.New("tier database down")
	})
	obs := &mwObserver{}
	logs, logOpt := newLogBuf()
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip"), Resolver: down}},
		ratelimit.WithObserver(obs), logOpt)
	for range 5 {
		if c := e.do(t, mwReq("192.0.2.1:1")).Code; c != http.StatusOK {
			t.Fatalf("status %d, want 200 (fail-open)", c)
		}
	}
	if !strings.Contains(logs.String(), "served fail-open") {
		t.Errorf("fail-open not logged: %q", logs.String())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) != 5 {
		t.Fatalf("the Observer saw %d errors for 5 requests past a failing Resolver, want 5", len(obs.errs))
	}
	for _, ev := range obs.errs {
		if !errors.Is(ev.Err, ratelimit.ErrStoreFailure) || len(ev.Policies) != 1 || ev.Policies[0].Name() != "per-ip" {
			t.Fatalf("error event %+v: want ErrStoreFailure under per-ip", ev)
		}
	}
}

// TestSkipCIDRsForwardedHeaderLogged: WithSkipCIDRs listing the network of
// a proxy (every request's peer) exempts every client behind it; the first
// exempted request that carries a forwarded header is logged, once.
func TestSkipCIDRsForwardedHeaderLogged(t *testing.T) {
	for _, fwd := range []bool{false, true} {
		logs, logOpt := newLogBuf()
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")}},
			logOpt, ratelimit.WithSkipCIDRs("10.0.0.0/8"))
		for range 50 {
			r := mwReq("10.0.0.5:4321")
			if fwd {
				r.Header.Set("X-Forwarded-For", "203.0.113.7")
			}
			if c := e.do(t, r).Code; c != http.StatusOK {
				t.Fatalf("status %d, want 200 (exempt)", c)
			}
		}
		n := strings.Count(logs.String(), "WithSkipCIDRs exempted a peer that sends forwarded headers")
		if want := map[bool]int{false: 0, true: 1}[fwd]; n != want {
			t.Errorf("forwarded header %v: logged %d times, want %d: %q", fwd, n, want, logs.String())
		}
	}
}

// TestResolverFailureReportedAsStoreFailure: a Resolver failure is
// reported as a store failure is: not for a Peek (which reports no store
// failure either), and also when the client left while the lookup ran, for
// an error the context's end did not cause.
func TestResolverFailureReportedAsStoreFailure(t *testing.T) {
	down := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) {
		return nil, errors.New("tier database down")
	})
	obs := &mwObserver{}
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip"), Resolver: down}},
		ratelimit.WithObserver(obs))
	if res := e.l.Peek(mwReq("192.0.2.1:1")); res.Err == nil {
		t.Fatal("a Peek past a failing Resolver: no error")
	}
	if n := len(obs.errs); n != 0 {
		t.Fatalf("a Peek past a failing Resolver reported %d errors, want 0", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	hangup := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) {
		cancel() // the client hangs up while the lookup runs
		return nil, errors.New("tier database down")
	})
	obs2 := &mwObserver{}
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip"), Resolver: hangup}},
		ratelimit.WithObserver(obs2))
	res := e2.l.Decide(mwReq("192.0.2.1:1").WithContext(ctx))
	if len(obs2.errs) != 1 || !errors.Is(res.Err, ratelimit.ErrStoreFailure) {
		t.Fatalf("a Resolver failure met after the client left: %d errors observed, result %v; want 1 and a store failure", len(obs2.errs), res.Err)
	}
}

// TestSetRulesSameRuleExplicitBurst: a rule set again with Burst spelled
// out (the same Identity as the rule in force) is what Rules reports.
func TestSetRulesSameRuleExplicitBurst(t *testing.T) {
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")}})
	want := core.PerMinute(10).Named("per-ip").WithBurst(10)
	if err := e.l.SetRules(map[string]core.Rule{"per-ip": want}); err != nil {
		t.Fatal(err)
	}
	if got := e.l.Rules()["per-ip"]; got.Burst != want.Burst {
		t.Fatalf("after SetRules with Burst 10, Rules gives Burst %d", got.Burst)
	}
}

// optionedAlg is a custom algorithm whose type is comparable but whose
// value, holding a map, is not.
type optionedAlg struct {
	core.Algorithm
	opts any
}

func (optionedAlg) Name() string { return "optioned_bucket" }

// TestSetRulesSameCustomAlgorithm: setting again a rule whose custom
// algorithm holds a map (directly, or inside a decorator) does not panic,
// and the rule stays the same.
func TestSetRulesSameCustomAlgorithm(t *testing.T) {
	type decorator struct{ core.Algorithm }
	for _, alg := range []core.Algorithm{
		optionedAlg{Algorithm: core.TokenBucket, opts: map[string]int{"x": 1}},
		decorator{optionedAlg{Algorithm: core.TokenBucket, opts: map[string]int{"x": 1}}},
	} {
		rule := core.PerMinute(10).Named("per-ip").Using(alg)
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}})
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("SetRules with the same rule (%T) panicked: %v", alg, p)
				}
			}()
			if err := e.l.SetRules(map[string]core.Rule{"per-ip": rule}); err != nil {
				t.Fatal(err)
			}
		}()
		if got := e.l.Rules()["per-ip"]; got.Limit != 10 || got.Algorithm.Name() != "optioned_bucket" {
			t.Fatalf("after SetRules: %+v", got)
		}
	}
}

// TestPeekClashNotReported: a Resolver's policy that clashes with another
// layer's is reported to the Observer as a policy the store cannot decide
// is: once for the decided request, never for a Peek (a quota endpoint
// that peeks before the request is decided would count it twice).
func TestPeekClashNotReported(t *testing.T) {
	asLayer := core.MustPolicy(core.PerMinute(100).Named("a"))
	ip := ratelimit.MustClientIP()
	layers := []ratelimit.Layer{
		{Key: ip, Rule: core.PerMinute(10).Named("a")},
		{Key: ip, Rule: core.PerMinute(10).Named("b"), Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return asLayer, nil })},
	}
	obs := &mwObserver{}
	e := mwNew(t, layers, ratelimit.WithObserver(obs))
	res := e.l.Peek(mwReq("192.0.2.1:1"))
	if res.Err == nil {
		t.Fatal("Peek past a clashing Resolver: no error")
	}
	n := obs.errCount()
	if n != 0 {
		t.Errorf("a Peek reported %d errors to the Observer, want 0 (as for a failing Resolver or an unsupported policy)", n)
	}
	if rec := e.do(t, mwReq("192.0.2.1:1")); rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	n = obs.errCount()
	if n != 1 {
		t.Errorf("one request (peeked, then decided) counted %d times in the Observer's errors, want 1", n)
	}
}
