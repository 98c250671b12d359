package echolimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/echolimit"
	"github.com/limitry/ratelimit/core"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// keys records the key of every decision, per rule.
type keys struct {
	core.NopObserver
	mu   sync.Mutex
	seen []string // "rule=key"
}

func (k *keys) ObserveDecision(ev core.DecisionEvent) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seen = append(k.seen, ev.Decision.Policy.Name()+"="+ev.Key)
}

func (k *keys) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.seen)
}

// limiter builds a Limiter on a fake clock, reporting keys to obs.
func limiter(t *testing.T, clk *core.FakeClock, obs *keys, layers []ratelimit.Layer, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithObserver(obs)}, opts...)
	l, err := ratelimit.New(layers, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func perIP(limit int64) []ratelimit.Layer {
	return []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: limit, Window: time.Minute},
	}}
}

// do sends method path from remoteAddr, with extra request headers given as
// name, value pairs.
func do(h http.Handler, method, path, remoteAddr string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func ok(c echo.Context) error { return c.String(http.StatusOK, "ok\n") }

const peer = "192.0.2.1:1234"

func TestHeadersAnd429(t *testing.T) {
	clk := core.NewFakeClock(t0)
	l := limiter(t, clk, &keys{}, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithHeaders(ratelimit.AllHeaders))
	e := echo.New()
	e.Use(echolimit.Middleware(l))
	e.GET("/hello", ok)

	for i := range 5 {
		w := do(e, "GET", "/hello", peer)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i+1, w.Code)
		}
		h := w.Header()
		if got, want := h.Get(ratelimit.HeaderRateLimitLimit), "5"; got != want {
			t.Errorf("request %d: X-RateLimit-Limit %q, want %q", i+1, got, want)
		}
		if got, want := h.Get(ratelimit.HeaderRateLimitRemaining), strconv.Itoa(4-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want %q", i+1, got, want)
		}
		if got, want := h.Get(ratelimit.HeaderRateLimitPolicy), `"per-ip";q=5;w=10`; got != want {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, want)
		}
	}
	w := do(e, "GET", "/hello", peer)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: status %d, want 429", w.Code)
	}
	if got := w.Header().Get(ratelimit.HeaderRetryAfter); got != "2" {
		t.Errorf("Retry-After %q, want \"2\"", got)
	}
	if got := w.Body.String(); got != "Too Many Requests\n" {
		t.Errorf("body %q: want the limiter's standard response", got)
	}
	clk.Advance(2 * time.Second)
	if w := do(e, "GET", "/hello", peer); w.Code != http.StatusOK {
		t.Errorf("after Retry-After: status %d, want 200", w.Code)
	}
}

// By default the limiter writes the refusal and echo's HTTPErrorHandler is
// not called.
func TestDefaultModeBypassesErrorHandler(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1), ratelimit.WithProblemDetails())
	e := echo.New()
	var handled []error
	e.HTTPErrorHandler = func(err error, c echo.Context) { handled = append(handled, err) }
	e.Use(echolimit.Middleware(l))
	e.GET("/hello", ok)
	do(e, "GET", "/hello", peer)
	w := do(e, "GET", "/hello", peer)
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("status %d, Content-Type %q: want the limiter's problem details", w.Code, w.Header().Get("Content-Type"))
	}
	if len(handled) != 0 {
		t.Errorf("HTTPErrorHandler called with %v", handled)
	}
}

func TestHTTPErrorMode(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1), ratelimit.WithHeaders(ratelimit.AllHeaders))
	e := echo.New()
	var handled []error
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		handled = append(handled, err)
		e.DefaultHTTPErrorHandler(err, c)
	}
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{HTTPError: true}))
	e.GET("/hello", ok)

	if w := do(e, "GET", "/hello", peer); w.Code != 200 || w.Header().Get(ratelimit.HeaderRateLimitRemaining) != "0" {
		t.Fatalf("first request: %d %v", w.Code, w.Header())
	}
	w := do(e, "GET", "/hello", peer)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", w.Code)
	}
	if got := w.Header().Get(ratelimit.HeaderRetryAfter); got != "60" {
		t.Errorf("Retry-After %q, want \"60\"", got)
	}
	if got := w.Header().Get(ratelimit.HeaderRateLimit); got != `"per-ip";r=0;t=60` {
		t.Errorf("RateLimit %q", got)
	}
	if got := w.Header().Get("Content-Type"); !strings.HasPrefix(got, "application/json") {
		t.Errorf("Content-Type %q: want echo's JSON error", got)
	}
	if got := w.Body.String(); got != `{"message":"Too Many Requests"}`+"\n" {
		t.Errorf("body %q", got)
	}
	var he *echo.HTTPError
	if len(handled) != 1 || !errors.As(handled[0], &he) || he.Code != http.StatusTooManyRequests {
		t.Errorf("HTTPErrorHandler got %v, want one *echo.HTTPError 429", handled)
	}
}

// Errors reach echo's error handling too in HTTPError mode: an invalid cost
// is the limiter's 400.
func TestHTTPErrorModeRequestError(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1), ratelimit.WithCost(func(*http.Request) int64 { return 0 }))
	e := echo.New()
	var handled []error
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		handled = append(handled, err)
		e.DefaultHTTPErrorHandler(err, c)
	}
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{HTTPError: true}))
	e.GET("/hello", ok)
	w := do(e, "GET", "/hello", peer)
	var he *echo.HTTPError
	if w.Code != 400 || len(handled) != 1 || !errors.As(handled[0], &he) || he.Code != 400 {
		t.Errorf("status %d, handled %v: want a 400 *echo.HTTPError", w.Code, handled)
	}
}

// ctxStore fails with the context's error once the context ends, as a
// network store does when the client goes away.
type ctxStore struct{}

func (ctxStore) Take(ctx context.Context, _ time.Time, _ []core.Request, _ []core.Decision) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestHTTPErrorModeClientGone checks that a request whose client went away
// before the store answered reaches neither echo's error handler nor a
// response, in HTTPError mode too.
func TestHTTPErrorModeClientGone(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1), ratelimit.WithStore(ctxStore{}), ratelimit.WithFailClosed())
	e := echo.New()
	var handled []error
	e.HTTPErrorHandler = func(err error, c echo.Context) { handled = append(handled, err) }
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{HTTPError: true}))
	e.GET("/hello", ok)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest("GET", "/hello", nil).WithContext(ctx)
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	if len(handled) != 0 || w.Body.Len() != 0 {
		t.Fatalf("handled %v, body %q: want nothing", handled, w.Body)
	}
}

func TestRouteKey(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "per-route", Limit: 2, Window: time.Minute},
	}})
	e := echo.New()
	e.Use(echolimit.Middleware(l)) // echo routes before e.Use middleware runs
	e.GET("/users/:id", ok)
	g := e.Group("/api")
	g.GET("/items/:id", ok)

	steps := []struct {
		path string
		want int
	}{
		{"/users/1", 200},
		{"/users/2", 200},
		{"/users/3", 429}, // same route, other id: same quota
		{"/api/items/1", 200},
	}
	for _, s := range steps {
		if w := do(e, "GET", s.path, peer); w.Code != s.want {
			t.Errorf("GET %s: status %d, want %d", s.path, w.Code, s.want)
		}
	}
	want := []string{
		"per-route=GET /users/:id", "per-route=GET /users/:id", "per-route=GET /users/:id",
		"per-route=GET /api/items/:id",
	}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// e.Pre middleware runs before routing: the middleware looks the route up
// in echo's router itself.
func TestRouteKeyPre(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "per-route", Limit: 1, Window: time.Minute},
	}})
	e := echo.New()
	e.Pre(echolimit.Middleware(l))
	e.GET("/users/:id", ok)
	for i, want := range []int{200, 429, 429} {
		if w := do(e, "GET", "/users/"+strconv.Itoa(i), peer); w.Code != want {
			t.Errorf("request %d: status %d, want %d", i+1, w.Code, want)
		}
	}
	if got := obs.list(); len(got) != 3 || got[0] != "per-route=GET /users/:id" {
		t.Errorf("decisions %q", got)
	}
}

// TestRouteKeyFewMethods checks that a path with routes of a few methods,
// the probe's among them (GET and REPORT, a CalDAV endpoint, with e.Match
// or e.Add), keys each method's route with its method, in e.Use and e.Pre,
// while an e.Any route is keyed by its path.
func TestRouteKeyFewMethods(t *testing.T) {
	for _, pre := range []bool{false, true} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
			Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
			Rule:   core.Rule{Name: "cal-get", Limit: 1, Window: time.Minute},
			Routes: []string{"GET /cal", "PROPFIND /dav", "/any"},
		}})
		e := echo.New()
		if pre {
			e.Pre(echolimit.Middleware(l))
		} else {
			e.Use(echolimit.Middleware(l))
		}
		e.GET("/cal", ok)
		e.Add(echo.REPORT, "/cal", ok)
		e.Match([]string{echo.PROPFIND, echo.REPORT}, "/dav", ok)
		e.Any("/any", ok)
		for _, req := range []struct{ method, path string }{{"GET", "/cal"}, {echo.REPORT, "/dav"}, {echo.PROPFIND, "/dav"}, {"GET", "/any"}, {"POST", "/any"}} {
			var codes []int
			for range 2 {
				codes = append(codes, do(e, req.method, req.path, peer).Code)
			}
			want := []int{200, 429}
			switch {
			case req.method == echo.REPORT:
				want = []int{200, 200} // "REPORT /dav" is not among the Routes
			case req.method == "POST":
				want = []int{429, 429} // "/any" was spent by GET
			}
			if !slices.Equal(codes, want) {
				t.Errorf("pre %v: %s %s twice, limit 1: %v, want %v; decisions %q", pre, req.method, req.path, codes, want, obs.list())
			}
		}
	}
}

// TestRouteKeyPreMethodOverride checks that a Limiter in e.Pre after echo's
// MethodOverride keys the method the route serves, as the package doc
// says to place it.
func TestRouteKeyPreMethodOverride(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "delete", Limit: 1, Window: time.Minute},
		Routes: []string{"DELETE /users/:id"},
	}})
	e := echo.New()
	e.Pre(middleware.MethodOverride(), echolimit.Middleware(l))
	e.DELETE("/users/:id", ok)
	var codes []int
	for range 3 {
		codes = append(codes, do(e, "POST", "/users/1", peer, "X-HTTP-Method-Override", "DELETE").Code)
	}
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("DELETE /users/1 through method override three times, limit 1: %v, want %v", codes, want)
	}
}

// TestTopLevelOneBatch checks that one Limiter in e.Use holds a per-IP layer
// and a login-only route layer, and that a login refused by the route layer
// charges the per-IP layer nothing; in e.Pre too.
func TestTopLevelOneBatch(t *testing.T) {
	for _, pre := range []bool{false, true} {
		ip := ratelimit.MustClientIP()
		l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{
			{Key: ip, Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
			{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.Rule{Name: "login", Limit: 2, Window: time.Minute}, Routes: []string{"POST /login"}},
		})
		e := echo.New()
		if pre {
			e.Pre(echolimit.Middleware(l))
		} else {
			e.Use(echolimit.Middleware(l))
		}
		e.POST("/login", ok)
		e.GET("/hello", ok)
		for i, want := range []int{200, 200, 429, 429, 429} {
			if w := do(e, "POST", "/login", peer); w.Code != want {
				t.Fatalf("pre %v login %d: status %d, want %d", pre, i+1, w.Code, want)
			}
		}
		for i, want := range []int{200, 200, 200, 429} {
			if w := do(e, "GET", "/hello", peer); w.Code != want {
				t.Fatalf("pre %v hello %d: status %d, want %d", pre, i+1, w.Code, want)
			}
		}
	}
}

// TestRouteMethodCannotDodge checks that a route registered with e.Any gives
// every method one quota, that a method no route serves is not a route key
// (echo answers 405), and that HEAD is not counted with GET (echo does not
// serve it with GET's handler).
func TestRouteMethodCannotDodge(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "route", Limit: 2, Window: time.Minute}},
	})
	e := echo.New()
	e.Use(echolimit.Middleware(l))
	e.Any("/login", ok)
	e.GET("/x", ok)
	var codes []int
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "GET"} {
		codes = append(codes, do(e, m, "/login", peer).Code)
	}
	if want := []int{200, 200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("/login by method: %v, want %v", codes, want)
	}
	codes = codes[:0]
	for _, m := range []string{"GET", "X1", "post", "GET", "GET"} {
		codes = append(codes, do(e, m, "/x", peer).Code)
	}
	if want := []int{200, 405, 405, 200, 429}; !slices.Equal(codes, want) {
		t.Errorf("/x: %v, want %v", codes, want)
	}
	if w := do(e, "GET", "/nope", peer); w.Code != 404 {
		t.Errorf("unknown path: %d", w.Code)
	}
	seen := map[string]bool{}
	for _, k := range obs.list() {
		seen[k] = true
	}
	if len(seen) != 2 || !seen["route=6:/login9:192.0.2.1"] || !seen["route=6:GET /x9:192.0.2.1"] {
		t.Errorf("route keys %v", seen)
	}
}

// TestRouteKeyHostRouter checks that routes registered on a host's own
// router (e.Host) are found for that host's requests, in e.Pre and e.Use:
// a login-only layer applies, and a route registered with Any is keyed
// without its method.
func TestRouteKeyHostRouter(t *testing.T) {
	for _, pre := range []bool{false, true} {
		for _, anyMethod := range []bool{false, true} {
			t.Run(fmt.Sprintf("pre=%v/any=%v", pre, anyMethod), func(t *testing.T) {
				route := "POST /login"
				if anyMethod {
					route = "/login"
				}
				l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
					Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
					Rule:   core.Rule{Name: "login", Limit: 2, Window: time.Minute},
					Routes: []string{route},
				}})
				e := echo.New()
				if pre {
					e.Pre(echolimit.Middleware(l))
				} else {
					e.Use(echolimit.Middleware(l))
				}
				api := e.Host("api.example.com")
				if anyMethod {
					api.Any("/login", ok)
				} else {
					api.POST("/login", ok)
				}
				var codes []int
				for _, m := range []string{"POST", "POST", "POST"} {
					r := httptest.NewRequest(m, "http://api.example.com/login", nil)
					r.RemoteAddr = peer
					w := httptest.NewRecorder()
					e.ServeHTTP(w, r)
					codes = append(codes, w.Code)
				}
				if want := []int{200, 200, 429}; !slices.Equal(codes, want) {
					t.Fatalf("POST api.example.com/login: %v, want %v", codes, want)
				}
			})
		}
	}
}

func TestSkipper(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1))
	e := echo.New()
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{
		Skipper: func(c echo.Context) bool { return c.Path() == "/healthz" },
	}))
	e.GET("/healthz", ok)
	e.GET("/hello", ok)
	for i := range 3 {
		w := do(e, "GET", "/healthz", peer)
		if w.Code != 200 || w.Header().Get(ratelimit.HeaderRateLimitLimit) != "" {
			t.Fatalf("healthz %d: status %d, headers %v", i+1, w.Code, w.Header())
		}
	}
	if got := []int{do(e, "GET", "/hello", peer).Code, do(e, "GET", "/hello", peer).Code}; !slices.Equal(got, []int{200, 429}) {
		t.Errorf("/hello statuses %v, want [200 429]", got)
	}
}

// Two layers in one limiter: a request the login layer refuses charges the
// per-IP layer nothing.
func TestLayering(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 3, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "login", Limit: 1, Window: time.Minute}},
	}, ratelimit.WithHeaders(ratelimit.IETFHeaders))
	e := echo.New()
	e.POST("/login", ok, echolimit.Middleware(l))

	steps := []struct {
		want      int
		rateLimit string
	}{
		{200, `"per-ip";r=2;t=20, "login";r=0;t=60`},
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`}, // per-ip not charged
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`},
	}
	for i, s := range steps {
		w := do(e, "POST", "/login", peer)
		if w.Code != s.want {
			t.Errorf("request %d: status %d, want %d", i+1, w.Code, s.want)
		}
		if got := w.Header().Get(ratelimit.HeaderRateLimit); got != s.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i+1, got, s.rateLimit)
		}
	}
	if got := obs.list(); got[1] != "login=11:POST /login9:192.0.2.1" {
		t.Errorf("login key %q", got[1])
	}
}

// A forged X-Forwarded-For from a peer that is not a trusted proxy changes
// neither the key nor whose quota is charged, although echo's own c.RealIP()
// believes it.
func TestForgedForwardedForIgnored(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, perIP(2))
	e := echo.New()
	var realIPs []string
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			realIPs = append(realIPs, c.RealIP())
			return next(c)
		}
	})
	e.Use(echolimit.Middleware(l))
	e.GET("/hello", ok)

	forged := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"}
	for i, xff := range forged {
		w := do(e, "GET", "/hello", peer, "X-Forwarded-For", xff, "X-Real-IP", xff)
		if want := []int{200, 200, 429}[i]; w.Code != want {
			t.Errorf("request %d (XFF %s): status %d, want %d", i+1, xff, w.Code, want)
		}
	}
	if !slices.Equal(realIPs, forged) { // the premise of the package doc
		t.Errorf("c.RealIP() gave %q, want the forged %q (echo's default trusts the header)", realIPs, forged)
	}
	want := []string{"per-ip=192.0.2.1", "per-ip=192.0.2.1", "per-ip=192.0.2.1"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestNew(t *testing.T) {
	if _, err := echolimit.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	mw, err := echolimit.New(perIP(1), ratelimit.WithClock(core.NewFakeClock(t0)))
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Use(mw)
	e.GET("/", ok)
	if got := []int{do(e, "GET", "/", peer).Code, do(e, "GET", "/", peer).Code}; !slices.Equal(got, []int{200, 429}) {
		t.Errorf("statuses %v, want [200 429]", got)
	}
}

func TestMiddlewareNilLimiterPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	echolimit.Middleware(nil)
}

// TestRouteKeyGroupWithMiddleware: a group with middleware of its own gets
// echo's catch-all routes at its path and at its "/*"; a route registered
// for one method there (the group's root, a catch-all of its own) keeps
// its method, in e.Use, e.Pre and the group's middleware.
func TestRouteKeyGroupWithMiddleware(t *testing.T) {
	auth := func(next echo.HandlerFunc) echo.HandlerFunc { return func(c echo.Context) error { return next(c) } }
	for _, mode := range []string{"use", "pre", "group"} {
		t.Run(mode, func(t *testing.T) {
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
				Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
				Rule:   core.Rule{Name: "create", Limit: 1, Window: time.Minute},
				Routes: []string{"POST /users", "GET /files/*"},
			}})
			e := echo.New()
			mws := []echo.MiddlewareFunc{auth}
			switch mode {
			case "use":
				e.Use(echolimit.Middleware(l))
			case "pre":
				e.Pre(echolimit.Middleware(l))
			case "group":
				mws = append(mws, echolimit.Middleware(l))
			}
			users := e.Group("/users", mws...)
			users.GET("", ok)
			users.POST("", ok)
			files := e.Group("/files", mws...)
			files.GET("/*", ok)
			var codes []int
			for range 2 {
				codes = append(codes, do(e, "POST", "/users", peer).Code, do(e, "GET", "/files/a/b", peer).Code)
			}
			if want := []int{200, 200, 429, 429}; !slices.Equal(codes, want) {
				t.Fatalf("POST /users and GET /files/a/b twice: %v, want %v; decisions %q", codes, want, obs.list())
			}
		})
	}
}

// TestRouteKeyNotFoundHandler: a request a RouteNotFound handler answers is
// keyed by the handler's path, as the package documents (a group's
// catch-alls, from g.Use, and e.RouteNotFound's), and a 404 that no
// handler answers by "".
func TestRouteKeyNotFoundHandler(t *testing.T) {
	auth := func(next echo.HandlerFunc) echo.HandlerFunc { return func(c echo.Context) error { return next(c) } }
	e := echo.New()
	var route string
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { route = echolimit.RouteOf(c); return next(c) }
	})
	e.Group("/api", auth).GET("/users/:id", ok)
	e.RouteNotFound("/static/*", func(c echo.Context) error { return c.NoContent(http.StatusNotFound) })
	for _, c := range []struct{ path, want string }{
		{"/api/nope", "/api/*"},
		{"/api", "/api"},
		{"/static/x.css", "/static/*"},
		{"/nowhere", ""},
		{"/api/users/1", "GET /api/users/:id"},
	} {
		route = "unset"
		if w := do(e, "GET", c.path, peer); c.want != "GET /api/users/:id" && w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", c.path, w.Code)
		}
		if route != c.want {
			t.Errorf("GET %s: RouteOf %q, want %q", c.path, route, c.want)
		}
	}
}

// TestRouteKeyGroupRouteAddedLater: a one-method route added to a group
// after the first request is keyed with its method at once.
func TestRouteKeyGroupRouteAddedLater(t *testing.T) {
	auth := func(next echo.HandlerFunc) echo.HandlerFunc { return func(c echo.Context) error { return next(c) } }
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "create", Limit: 1, Window: time.Minute},
		Routes: []string{"POST /users"},
	}})
	e := echo.New()
	e.Use(echolimit.Middleware(l))
	users := e.Group("/users", auth)
	users.GET("", ok)
	if c := do(e, "GET", "/users", peer).Code; c != 200 {
		t.Fatal(c)
	}
	users.POST("", ok) // after the first request
	var codes []int
	for range 2 {
		codes = append(codes, do(e, "POST", "/users", peer).Code)
	}
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Fatalf("POST /users twice, limit 1: %v, want %v", codes, want)
	}
}

// New returns an error, as its doc says, for a Limiter the middleware
// refuses (one refunding by response status), where Middleware panics.
func TestNewRefusesRefundByStatus(t *testing.T) {
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("echolimit.New panicked: %v; want an error", p)
		}
	}()
	mw, err := echolimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "login", Limit: 5, Window: time.Hour},
	}}, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	if !errors.Is(err, ratelimit.ErrConfig) || mw != nil {
		t.Fatalf("New with WithRefund: middleware %v, error %v; want an ErrConfig", mw != nil, err)
	}
}

// TestRouteKeyAnyBesideShadowingProbeRoute checks that an e.Any route is
// keyed by its path alone also for a path where a more specific route of
// the probe's method (REPORT, PROPFIND: a CalDAV app's queries) shadows it:
// /cal/home, served by e.Any's /cal/:id for GET, shares /cal/:id's quota
// instead of escaping a layer limited to it.
func TestRouteKeyAnyBesideShadowingProbeRoute(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.MustClientIP(),
		Rule:   core.Rule{Name: "cal", Limit: 1, Window: time.Minute},
		Routes: []string{"/cal/:id"},
	}})
	e := echo.New()
	e.Use(echolimit.Middleware(l))
	e.Any("/cal/:id", ok)
	e.Match([]string{"REPORT", "PROPFIND"}, "/cal/home", ok)
	var codes []int
	for _, p := range []string{"/cal/work", "/cal/work", "/cal/home", "/cal/home"} {
		codes = append(codes, do(e, http.MethodGet, p, peer).Code)
	}
	if want := []int{200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET codes %v, want %v; keys %v", codes, want, obs.list())
	}
}

// TestRouteKeyMethodRewrittenAfterRouting checks that a method rewritten
// after echo routed the request (MethodOverride in e.Use, where echo's
// docs put it in e.Pre) is not the route key's: POST /login, overridden to
// any method a client picks, is keyed as the route echo served, so the
// client neither escapes the login layer nor makes keys of its choosing.
func TestRouteKeyMethodRewrittenAfterRouting(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "login", Limit: 1, Window: time.Minute},
		Routes: []string{"POST /login"},
	}})
	for _, others := range []string{"none", "GET beside", "DELETE beside", "route middleware"} {
		e := echo.New()
		e.Use(middleware.MethodOverride(), echolimit.Middleware(l))
		served := 0
		post := func(c echo.Context) error { served++; return c.NoContent(http.StatusOK) }
		pass := func(next echo.HandlerFunc) echo.HandlerFunc { return func(c echo.Context) error { return next(c) } }
		switch others {
		case "none":
			e.POST("/login", post)
		case "GET beside": // the login form beside its submission
			e.GET("/login", ok)
			e.POST("/login", post)
		case "DELETE beside":
			e.DELETE("/login", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
			e.POST("/login", post)
		case "route middleware": // closures of one function for both routes
			e.GET("/login", ok, pass)
			e.POST("/login", post, pass)
		}
		l.Reset(context.Background(), "login", "11:POST /login9:192.0.2.1")
		codes := []int{do(e, http.MethodPost, "/login", peer).Code, do(e, http.MethodPost, "/login", peer).Code}
		for _, m := range []string{"X1", "GET", "DELETE"} {
			codes = append(codes, do(e, http.MethodPost, "/login", peer, "X-HTTP-Method-Override", m).Code)
		}
		if want := []int{200, 429, 429, 429, 429}; !slices.Equal(codes, want) || served != 1 {
			t.Errorf("%s: POST /login codes %v, want %v; the handler ran %d times; keys %v", others, codes, want, served, obs.list())
		}
	}
}

// TestRouteKeyGroupCatchAllAfterOverride checks that a request a group's
// catch-all serves is keyed "/api/*" also when MethodOverride in e.Use
// rewrites its method to one that has a route deeper in the group: echo's
// RouteNotFound entries are no method of a route.
func TestRouteKeyGroupCatchAllAfterOverride(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "api404", Limit: 1, Window: time.Minute},
		Routes: []string{"/api/*"},
	}})
	e := echo.New()
	e.Use(middleware.MethodOverride(), echolimit.Middleware(l))
	g := e.Group("/api")
	g.Use(middleware.Secure())
	g.GET("/items/:id", ok)
	codes := []int{
		do(e, http.MethodPost, "/api/nope", peer).Code,
		do(e, http.MethodPost, "/api/items/1", peer, "X-HTTP-Method-Override", "GET").Code,
	}
	if want := []int{404, 429}; !slices.Equal(codes, want) {
		t.Errorf("codes %v, want %v; keys %v", codes, want, obs.list())
	}
}

// TestRouteKeyAfterPathRewriteInUse checks that with the limiter in
// e.Use, the key is the route echo matched and serves also when a
// middleware before it in e.Use rewrote the URL's path (echo does not
// route again): GET /users/5, served by GET /users/:id, is keyed
// "GET /users/:id", beside a POST route at the same path or not.
func TestRouteKeyAfterPathRewriteInUse(t *testing.T) {
	for _, withPost := range []bool{false, true} {
		var key, served string
		e := echo.New()
		e.Use(middleware.Rewrite(map[string]string{"/users/*": "/v2/users/$1"}), func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				key = echolimit.RouteOf(c)
				return next(c)
			}
		})
		e.GET("/users/:id", func(c echo.Context) error { served = "GET " + c.Path(); return nil })
		if withPost {
			e.POST("/users/:id", func(c echo.Context) error { served = "POST " + c.Path(); return nil })
		}
		do(e, http.MethodGet, "/users/5", peer)
		if served != "GET /users/:id" || key != served {
			t.Errorf("POST route beside: %v: GET /users/5 keyed %q, served by %q", withPost, key, served)
		}
	}
}

// TestRouteKeyMethodRouteBesideAny: an e.POST route beside an e.Any route
// on the same path is keyed as the e.Any route, by the path alone, as the
// package documentation says: a layer written "/login" limits both.
func TestRouteKeyMethodRouteBesideAny(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "login", Limit: 1, Window: time.Minute},
		Routes: []string{"/login"},
	}})
	e := echo.New()
	var key string
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { key = echolimit.RouteOf(c); return next(c) }
	}, echolimit.Middleware(l))
	e.Any("/login", ok)
	e.POST("/login", func(c echo.Context) error { return c.NoContent(http.StatusCreated) })
	var codes []int
	for range 3 {
		codes = append(codes, do(e, http.MethodPost, "/login", peer).Code)
	}
	if want := []int{201, 429, 429}; !slices.Equal(codes, want) || key != "/login" {
		t.Errorf("POST /login (e.POST beside e.Any) three times, limit 1 on \"/login\": %v, want %v; RouteOf %q, want /login", codes, want, key)
	}
}
