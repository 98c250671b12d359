package chilimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
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

// do sends method path from remoteAddr, with extra request headers given as
// name, value pairs.
// methodCodes serves one request from peer for each method, in turn, at
// path, and returns their status codes.
func methodCodes(h http.Handler, path string, methods ...string) []int {
	var codes []int
	for _, m := range methods {
		codes = append(codes, do(h, m, path, peer).Code)
	}
	return codes
}

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

func ok(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }

const peer = "192.0.2.1:1234"

func TestHeadersAnd429(t *testing.T) {
	clk := core.NewFakeClock(t0)
	l := limiter(t, clk, &keys{}, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithHeaders(ratelimit.AllHeaders))
	r := chi.NewRouter()
	r.With(chilimit.Middleware(l)).Get("/hello", ok)

	for i := range 5 {
		w := do(r, "GET", "/hello", peer)
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
		if h.Get(ratelimit.HeaderRetryAfter) != "" {
			t.Errorf("request %d: Retry-After on an admitted request", i+1)
		}
	}
	w := do(r, "GET", "/hello", peer)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: status %d, want 429", w.Code)
	}
	if got := w.Header().Get(ratelimit.HeaderRetryAfter); got != "2" {
		t.Errorf("Retry-After %q, want \"2\"", got)
	}
	if got := w.Header().Get(ratelimit.HeaderRateLimit); got != `"per-ip";r=0;t=2` {
		t.Errorf("RateLimit %q", got)
	}
	clk.Advance(2 * time.Second)
	if w := do(r, "GET", "/hello", peer); w.Code != http.StatusOK {
		t.Errorf("after Retry-After: status %d, want 200", w.Code)
	}
}

// routeLimiter returns a Limiter with one layer keyed by route, limit
// requests per minute.
func routeLimiter(t *testing.T, obs *keys, limit int64) *ratelimit.Limiter {
	return limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "per-route", Limit: limit, Window: time.Minute},
	}})
}

func TestRouteKeyWith(t *testing.T) {
	obs := &keys{}
	mw := chilimit.Middleware(routeLimiter(t, obs, 2))
	r := chi.NewRouter()
	r.With(mw).Get("/users/{id}", ok)
	r.With(mw).Get("/posts/{id}", ok)

	steps := []struct {
		path string
		want int
	}{
		{"/users/1", 200},
		{"/users/2", 200},
		{"/users/3", 429}, // same route, other id: same quota
		{"/posts/1", 200}, // other route: own quota
	}
	for _, s := range steps {
		if w := do(r, "GET", s.path, peer); w.Code != s.want {
			t.Errorf("GET %s: status %d, want %d", s.path, w.Code, s.want)
		}
	}
	want := []string{
		"per-route=GET /users/{id}", "per-route=GET /users/{id}", "per-route=GET /users/{id}",
		"per-route=GET /posts/{id}",
	}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestRouteKeyGroup(t *testing.T) {
	obs := &keys{}
	mw := chilimit.Middleware(routeLimiter(t, obs, 10))
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(mw)
		r.Get("/users/{id}", ok)
	})
	r.Route("/api", func(r chi.Router) {
		r.With(mw).Get("/items/{id}", ok)
	})
	do(r, "GET", "/users/7", peer)
	do(r, "GET", "/api/items/9", peer)
	want := []string{"per-route=GET /users/{id}", "per-route=GET /api/items/{id}"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// At a top-level r.Use chi has not routed the request yet: the middleware
// finds the route itself, so one Limiter holds per-IP and per-route layers
// in one atomic batch, and a login refused by the route layer charges the
// per-IP layer nothing.
func TestTopLevelOneBatch(t *testing.T) {
	obs := &keys{}
	ip := ratelimit.MustClientIP()
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ip, Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.Rule{Name: "login", Limit: 2, Window: time.Minute}, Routes: []string{"POST /login"}},
	})
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Post("/login", ok)
	r.Get("/hello", ok)

	for i, want := range []int{200, 200, 429, 429, 429} {
		if w := do(r, "POST", "/login", peer); w.Code != want {
			t.Fatalf("login %d: status %d, want %d", i+1, w.Code, want)
		}
	}
	// Two logins charged per-ip; the refused ones did not: 3 left.
	for i, want := range []int{200, 200, 200, 429} {
		if w := do(r, "GET", "/hello", peer); w.Code != want {
			t.Fatalf("hello %d: status %d, want %d", i+1, w.Code, want)
		}
	}
	if got := obs.list(); len(got) < 2 || got[1] != "login=11:POST /login9:192.0.2.1" {
		t.Errorf("keys %q", got)
	}
}

// TestRouteMethodCannotDodge checks that a route registered for every
// method (r.Handle) gives all methods one quota, that a method the route
// does not serve is not a route key (chi answers 405), and that unknown
// paths are not keyed by route.
func TestRouteMethodCannotDodge(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "route", Limit: 2, Window: time.Minute}},
	})
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.HandleFunc("/login", ok)
	r.Get("/x", ok)
	codes := methodCodes(r, "/login", "POST", "PUT", "DELETE", "PATCH", "GET")
	if want := []int{200, 200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("/login by method: %v, want %v", codes, want)
	}
	// HEAD counts with GET (chi's GetHead serves it with the GET handler),
	// even where chi answers it 405: a limit may count more, never less.
	codes = methodCodes(r, "/x", "GET", "X1", "post", "HEAD", "GET", "GET")
	if want := []int{200, 405, 405, 405, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("/x: %v, want %v", codes, want)
	}
	if w := do(r, "GET", "/nope", peer); w.Code != 404 {
		t.Errorf("unknown path: %d, want 404", w.Code)
	}
	seen := map[string]bool{}
	for _, k := range obs.list() {
		seen[k] = true
	}
	if len(seen) != 2 || !seen["route=6:/login9:192.0.2.1"] || !seen["route=6:GET /x9:192.0.2.1"] {
		t.Errorf("route keys %v", seen)
	}
}

// TestRouteAfterPathRewrite checks that a route layer applies to the
// route chi serves after a top-level middleware rewrote the path
// (CleanPath, StripSlashes): "//login" and "/login/" are "POST /login",
// not unrouted requests the layer skips.
func TestRouteAfterPathRewrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		mw   func(http.Handler) http.Handler
		path string
	}{
		{"StripSlashes", middleware.StripSlashes, "/login/"},
		{"CleanPath", middleware.CleanPath, "//login"},
		{"CleanPath dot-dot", middleware.CleanPath, "/x/../login"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
				Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
				Rule:   core.Rule{Name: "login", Limit: 2, Window: time.Minute},
				Routes: []string{"POST /login"},
			}})
			r := chi.NewRouter()
			r.Use(tc.mw, chilimit.Middleware(l))
			r.Post("/login", ok)
			var codes []int
			for range 4 {
				codes = append(codes, do(r, "POST", tc.path, peer).Code)
			}
			if want := []int{200, 200, 429, 429}; !slices.Equal(codes, want) {
				t.Fatalf("POST %s: %v, want %v", tc.path, codes, want)
			}
		})
	}
	// A top-level rewrite, a Limiter in a mounted sub-router: the route
	// is found from the URL cleaned as the rewrite left it.
	for _, path := range []string{"//api/login", "/x/../api/login", "/api//login", "/api/login/"} {
		l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
			Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
			Rule:   core.Rule{Name: "login", Limit: 2, Window: time.Minute},
			Routes: []string{"POST /api/login"},
		}})
		r := chi.NewRouter()
		r.Use(middleware.CleanPath, middleware.StripSlashes)
		r.Route("/api", func(r chi.Router) {
			r.Use(chilimit.Middleware(l))
			r.Post("/login", ok)
		})
		var codes []int
		for range 4 {
			codes = append(codes, do(r, "POST", path, peer).Code)
		}
		if want := []int{200, 200, 429, 429}; !slices.Equal(codes, want) {
			t.Fatalf("POST %s through a mounted sub-router: %v, want %v", path, codes, want)
		}
	}
	// In a mounted sub-router, rewrites of the rest of the path (URLFormat's
	// extension, StripSlashes) are undone as they rewrite; a true 404 stays
	// a 404.
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key: ratelimit.Route(), Rule: core.Rule{Name: "route", Limit: 1, Window: time.Minute},
	}}, ratelimit.WithLogger(nil))
	r := chi.NewRouter()
	r.Route("/api", func(r chi.Router) {
		r.Use(middleware.URLFormat, middleware.StripSlashes, chilimit.Middleware(l))
		r.Post("/login", ok)
	})
	for _, tc := range []struct {
		path string
		code int
	}{
		{"/api/login.json", http.StatusOK},
		{"/api/login/", http.StatusTooManyRequests},
		{"/api/login", http.StatusTooManyRequests},
		{"/api/nope", http.StatusNotFound},
	} {
		if w := do(r, "POST", tc.path, peer); w.Code != tc.code {
			t.Errorf("POST %s through a sub-router's URLFormat and StripSlashes: %d, want %d", tc.path, w.Code, tc.code)
		}
	}
}

// loginLimiter limits GET /api/login to one request a minute per client.
func loginLimiter(t *testing.T) *ratelimit.Limiter {
	return limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "login", Limit: 1, Window: time.Minute},
		Routes: []string{"GET /api/login"},
	}}, ratelimit.WithLogger(nil))
}

// TestRouteAfterLaterRewrite checks that a rewrite chi runs after the
// limiter (a mounted sub-router's own r.Use, or later in the same r.Use)
// does not hide the route chi then serves: /api/login/, /api/login.json
// and HEAD /api/login count with GET /api/login.
func TestRouteAfterLaterRewrite(t *testing.T) {
	for _, tc := range []struct {
		name, method, path string
		mw                 func(http.Handler) http.Handler
		inMount            bool
	}{
		{"sub-router StripSlashes", "GET", "/api/login/", middleware.StripSlashes, true},
		{"sub-router URLFormat", "GET", "/api/login.json", middleware.URLFormat, true},
		{"sub-router GetHead", "HEAD", "/api/login", middleware.GetHead, true},
		{"StripSlashes after the limiter", "GET", "/api/login/", middleware.StripSlashes, false},
		{"URLFormat after the limiter", "GET", "/api/login.json", middleware.URLFormat, false},
		{"GetHead after the limiter", "HEAD", "/api/login", middleware.GetHead, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := chi.NewRouter()
			r.Use(chilimit.Middleware(loginLimiter(t)))
			if !tc.inMount {
				r.Use(tc.mw)
			}
			r.Route("/api", func(r chi.Router) {
				if tc.inMount {
					r.Use(tc.mw)
				}
				r.Get("/login", ok)
			})
			if c := do(r, "GET", "/api/login", peer).Code; c != 200 {
				t.Fatalf("first GET /api/login: %d", c)
			}
			if c := do(r, tc.method, tc.path, peer).Code; c != http.StatusTooManyRequests {
				t.Errorf("%s %s once GET /api/login's quota is spent: %d, want 429", tc.method, tc.path, c)
			}
		})
	}
	// A top-level URLFormat, the limiter in a mount: the route is found.
	l := loginLimiter(t)
	r := chi.NewRouter()
	r.Use(middleware.URLFormat)
	r.Route("/api", func(r chi.Router) {
		r.Use(chilimit.Middleware(l))
		r.Get("/login", ok)
	})
	var codes []int
	for range 2 {
		codes = append(codes, do(r, "GET", "/api/login.json", peer).Code)
	}
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET /api/login.json twice through a top-level URLFormat, limit 1: %v, want %v", codes, want)
	}
}

// TestRouteLayerOutsideChiIsLoud checks that the middleware used outside a
// chi router, where no route can be found, answers a route layer's request
// 500 (a configuration error), never skipping the layer: also behind an
// http.ServeMux, whose pattern ("/api/") is no chi route, for a plain
// route key and for a layer limited to some routes.
func TestRouteLayerOutsideChiIsLoud(t *testing.T) {
	for _, c := range []struct {
		name   string
		layer  ratelimit.Layer
		behind bool // behind an http.ServeMux
	}{
		{"alone", ratelimit.Layer{Key: ratelimit.Route()}, false},
		{"behind a ServeMux", ratelimit.Layer{Key: ratelimit.Route()}, true},
		{"behind a ServeMux, some routes", ratelimit.Layer{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Routes: []string{"POST /api/login"}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got error
			c.layer.Rule = core.Rule{Name: "route", Limit: 2, Window: time.Minute}
			l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{c.layer},
				ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = err }), ratelimit.WithLogger(nil))
			r := chi.NewRouter()
			r.Post("/api/login", ok)
			var h http.Handler = chilimit.Middleware(l)(r)
			if c.behind {
				mux := http.NewServeMux()
				mux.Handle("/api/", h)
				h = mux
			}
			if w := do(h, "POST", "/api/login", peer); w.Code != http.StatusInternalServerError || !errors.Is(got, ratelimit.ErrNoRoute) || !errors.Is(got, ratelimit.ErrConfig) {
				t.Fatalf("status %d, error %v; want 500 and ErrConfig wrapping ErrNoRoute", w.Code, got)
			}
		})
	}
}

// In a sub-router's r.Use the middleware still finds the endpoint's full
// pattern, not only the mount point.
func TestRouteKeySubrouterUse(t *testing.T) {
	obs := &keys{}
	mw := chilimit.Middleware(routeLimiter(t, obs, 1))
	r := chi.NewRouter()
	r.Route("/api", func(r chi.Router) {
		r.Use(mw)
		r.Get("/a", ok)
		r.Get("/b/{id}", ok)
	})
	if w := do(r, "GET", "/api/a", peer); w.Code != 200 {
		t.Fatalf("GET /api/a: %d", w.Code)
	}
	if w := do(r, "GET", "/api/b/1", peer); w.Code != 200 {
		t.Errorf("GET /api/b/1: %d, want 200 (its own route)", w.Code)
	}
	if w := do(r, "GET", "/api/b/2", peer); w.Code != 429 {
		t.Errorf("GET /api/b/2: %d, want 429 (same route)", w.Code)
	}
	want := []string{"per-route=GET /api/a", "per-route=GET /api/b/{id}", "per-route=GET /api/b/{id}"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestSkip(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute},
	}}, ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Get("/healthz", ok)
	r.Get("/hello", ok)

	for i := range 3 {
		w := do(r, "GET", "/healthz", peer)
		if w.Code != 200 || w.Header().Get(ratelimit.HeaderRateLimitLimit) != "" {
			t.Fatalf("healthz %d: status %d, headers %v", i+1, w.Code, w.Header())
		}
	}
	if w := do(r, "GET", "/hello", peer); w.Code != 200 {
		t.Errorf("first /hello: %d", w.Code)
	}
	if w := do(r, "GET", "/hello", peer); w.Code != 429 {
		t.Errorf("second /hello: %d, want 429", w.Code)
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
	mw := chilimit.Middleware(l)
	r := chi.NewRouter()
	r.With(mw).Post("/login", ok)

	steps := []struct {
		want      int
		rateLimit string
	}{
		{200, `"per-ip";r=2;t=20, "login";r=0;t=60`},
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`}, // per-ip not charged
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`},
	}
	for i, s := range steps {
		w := do(r, "POST", "/login", peer)
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
// neither the key nor whose quota is charged.
func TestForgedForwardedForIgnored(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}})
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Get("/hello", ok)

	for i, xff := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3, 198.51.100.9"} {
		w := do(r, "GET", "/hello", peer, "X-Forwarded-For", xff, "X-Real-IP", xff)
		if want := []int{200, 200, 429}[i]; w.Code != want {
			t.Errorf("request %d (XFF %s): status %d, want %d", i+1, xff, w.Code, want)
		}
	}
	want := []string{"per-ip=192.0.2.1", "per-ip=192.0.2.1", "per-ip=192.0.2.1"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// With the load balancer's network trusted, the client named in its
// X-Forwarded-For is the key.
func TestTrustedProxy(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8")),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}})
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Get("/hello", ok)
	do(r, "GET", "/hello", "10.1.2.3:5555", "X-Forwarded-For", "203.0.113.50")
	want := []string{"per-ip=203.0.113.50"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestNew(t *testing.T) {
	if _, err := chilimit.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	mw, err := chilimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute},
	}}, ratelimit.WithClock(core.NewFakeClock(t0)))
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(mw)
	r.Get("/", ok)
	if got := []int{do(r, "GET", "/", peer).Code, do(r, "GET", "/", peer).Code}; !slices.Equal(got, []int{200, 429}) {
		t.Errorf("statuses %v, want [200 429]", got)
	}
}

func TestMiddlewareNilLimiterPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	chilimit.Middleware(nil)
}

// TestRouteKeyMountIndex checks that a sub-router's "/" route, which chi
// serves for the mount point with and without its trailing slash
// (r.Route("/users", ...) with r.Post("/", ...)), has one route key for
// both, at the top level and under a mount, and that its methods keep
// their own.
func TestRouteKeyMountIndex(t *testing.T) {
	for _, nested := range []bool{false, true} {
		obs, r := perRouteRouter(t)
		users := func(r chi.Router) {
			r.Get("/", ok)
			r.Post("/", ok)
		}
		base := "/users"
		if nested {
			base = "/api/users"
			r.Route("/api", func(r chi.Router) { r.Route("/users", users) })
		} else {
			r.Route("/users", users)
		}
		codes := []int{do(r, "POST", base, peer).Code, do(r, "POST", base+"/", peer).Code, do(r, "GET", base, peer).Code}
		if want := []int{200, 429, 200}; !slices.Equal(codes, want) {
			t.Errorf("nested %v: POST %s, POST %s/, GET %s (limit 1 per route): %v, want %v; keys %q", nested, base, base, base, codes, want, obs.list())
		}
	}
}

// TestRouteKeyLaterRewrites checks that a rewrite chi's middleware makes
// after the limiter (later in the same r.Use) is keyed by the route chi
// then serves, also where the path as it came matches another route (a
// catch-all, a parameter), and that a rewrite made before the limiter is
// (CleanPath at the top, the limiter in r.With on a route).
func TestRouteKeyLaterRewrites(t *testing.T) {
	served := func(name string, got *[]string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { *got = append(*got, name) }
	}
	layer := func(route string) *ratelimit.Limiter {
		return limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{{
			Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
			Rule:   core.Rule{Name: "route", Limit: 1, Window: time.Minute},
			Routes: []string{route},
		}}, ratelimit.WithLogger(nil))
	}
	check := func(name string, r http.Handler, method string, paths []string, got *[]string, wantServed string) {
		t.Helper()
		var codes []int
		for _, p := range paths {
			codes = append(codes, do(r, method, p, peer).Code)
		}
		if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
			t.Errorf("%s: %s %q (limit 1): %v, want %v; served %q", name, method, paths, codes, want, *got)
		}
		if len(*got) != 1 || (*got)[0] != wantServed {
			t.Errorf("%s: served %q, want one %s", name, *got, wantServed)
		}
	}

	var got []string
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(layer("GET /users/me")), middleware.URLFormat)
	r.Get("/users/me", served("me", &got))
	r.Get("/users/{id}", served("id", &got))
	check("URLFormat after the limiter", r, "GET", []string{"/users/me.json", "/users/me.json", "/users/me.xml"}, &got, "me")

	got = nil
	r = chi.NewRouter()
	r.Use(chilimit.Middleware(layer("POST /login")), middleware.StripSlashes)
	r.Post("/login", served("login", &got))
	r.Handle("/*", served("spa", &got))
	check("StripSlashes after the limiter", r, "POST", []string{"/login/", "/login/", "/login"}, &got, "login")

	got = nil
	r = chi.NewRouter()
	r.Use(middleware.CleanPath)
	r.With(chilimit.Middleware(layer("POST /login"))).Post("/login", served("login", &got))
	r.Handle("/*", served("spa", &got))
	check("CleanPath before the limiter in r.With", r, "POST", []string{"//login", "/x/../login", "/login"}, &got, "login")
}

// A limiter in a sub-router's own r.Use (the README: "route layers work
// there, in sub-routers' Use") must key the mount point's own path, which
// chi serves with the sub-router's "/" route, as it keys "/users/".
func TestRouteKeyMountPointInSubrouterUse(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	r := chi.NewRouter()
	r.Route("/users", func(r chi.Router) {
		r.Use(chilimit.Middleware(l))
		r.Post("/", ok)
	})
	codes := []int{do(r, "POST", "/users/", peer).Code, do(r, "POST", "/users", peer).Code}
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("POST /users/, POST /users (limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// A route chi registers for GET that also has a TRACE handler is still a
// GET route: a layer with Routes "GET /x" must limit GET /x.
func TestRouteKeyMethodRouteWithTraceHandler(t *testing.T) {
	obs, r := perRouteRouter(t, "GET /x")
	r.Get("/x", ok)
	r.Method(http.MethodTrace, "/x", http.HandlerFunc(ok))
	codes := methodCodes(r, "/x", "GET", "GET")
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET /x twice (limit 1, Routes GET /x): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// The same in r.With inside the sub-router, and in a nested sub-router's
// r.Use.
func TestRouteKeyMountPointInSubrouterWith(t *testing.T) {
	for _, mode := range []string{"with", "nested-use"} {
		obs := &keys{}
		l := perRouteLimiter(t, obs)
		r := chi.NewRouter()
		base := "/users"
		switch mode {
		case "with":
			r.Route("/users", func(r chi.Router) { r.With(chilimit.Middleware(l)).Post("/", ok) })
		default:
			base = "/api/users"
			r.Route("/api", func(r chi.Router) {
				r.Use(chilimit.Middleware(l))
				r.Route("/users", func(r chi.Router) { r.Post("/", ok) })
			})
		}
		codes := []int{do(r, "POST", base+"/", peer).Code, do(r, "POST", base, peer).Code}
		if want := []int{200, 429}; !slices.Equal(codes, want) {
			t.Errorf("%s: POST %s/, POST %s (limit 1 per route): %v, want %v; keys %q", mode, base, base, codes, want, obs.list())
		}
	}
}

// A sub-router mounted at a parameter ("/{org}") whose own r.Use holds the
// limiter: GET /acme is served by its "/" route.
func TestRouteKeyParamMountPointInSubrouterUse(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	r := chi.NewRouter()
	sub := chi.NewRouter()
	sub.Use(chilimit.Middleware(l))
	sub.Get("/", ok)
	r.Mount("/{org}", sub)
	codes := []int{do(r, "GET", "/acme", peer).Code, do(r, "GET", "/acme/", peer).Code}
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET /acme, GET /acme/ (limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// A catch-all r.Handle("/*") next to a GET route: POST /api/x is served by
// "/*" (registered for every method), so it must be keyed "/*". And once it
// has been, every other path "/*" serves must still be keyed "/*".
func TestRouteKeyCatchAllNextToMethodRoute(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "spa", Limit: 1, Window: time.Minute},
		Routes: []string{"/*"},
	}}, ratelimit.WithLogger(nil))
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Get("/api/x", ok)
	r.HandleFunc("/*", ok)
	codes := []int{
		do(r, "POST", "/api/x", "192.0.2.7:1").Code, do(r, "POST", "/api/x", "192.0.2.7:1").Code,
		do(r, "POST", "/foo", peer).Code, do(r, "POST", "/foo", peer).Code,
	}
	if want := []int{200, 429, 200, 429}; !slices.Equal(codes, want) {
		t.Errorf("POST /api/x twice, POST /foo twice (Routes \"/*\", limit 1): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// The key of POST /foo does not depend on whether POST /api/x came first.
func TestRouteKeyEveryMethodNotOrderDependent(t *testing.T) {
	run := func(warm bool) []int {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
			Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
			Rule:   core.Rule{Name: "spa", Limit: 1, Window: time.Minute},
			Routes: []string{"/*"},
		}}, ratelimit.WithLogger(nil))
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l))
		r.Get("/api/x", ok)
		r.HandleFunc("/*", ok)
		if warm {
			do(r, "POST", "/api/x", "192.0.2.7:1")
		}
		return []int{do(r, "POST", "/foo", peer).Code, do(r, "POST", "/foo", peer).Code}
	}
	cold, warm := run(false), run(true)
	if !slices.Equal(cold, warm) {
		t.Errorf("POST /foo twice (Routes \"/*\", limit 1): %v on a fresh router, %v after one POST /api/x", cold, warm)
	}
}

// An every-method route keeps one quota whatever the method, after another
// path of it was decided.
func TestRouteKeyEveryMethodOneQuotaForAllMethods(t *testing.T) {
	obs, r := perRouteRouter(t)
	r.Get("/api/x", ok)
	r.HandleFunc("/*", ok)
	do(r, "POST", "/api/x", "192.0.2.7:1") // another client, another path of "/*"
	codes := methodCodes(r, "/foo", "GET", "POST", "PUT", "DELETE")
	if want := []int{200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, POST, PUT, DELETE /foo (r.HandleFunc(\"/*\"), limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// perRouteLimiter is one Route()+IP layer, limit 1 a minute, on routes (all if none).
func perRouteLimiter(t *testing.T, obs *keys, routes ...string) *ratelimit.Limiter {
	return limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule:   core.Rule{Name: "route", Limit: 1, Window: time.Minute},
		Routes: routes,
	}}, ratelimit.WithLogger(nil))
}

// perRouteRouter returns a chi router whose middleware is a perRouteLimiter
// (observed by the returned keys), before any route is added.
func perRouteRouter(t *testing.T, routes ...string) (*keys, *chi.Mux) {
	obs := &keys{}
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(perRouteLimiter(t, obs, routes...)))
	return obs, r
}

// A plain http.Handler (a ServeMux) mounted at "/legacy": chi registers
// "/legacy" for every method (Mount is mALL), and every method reaches the
// mounted handler there. Changing the method must not buy a fresh quota.
func TestRouteKeyPlainMountOwnPathOneQuota(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	mux := http.NewServeMux()
	mux.HandleFunc("/", ok)
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Mount("/legacy", mux)
	codes := methodCodes(r, "/legacy", "GET", "POST", "PUT", "DELETE")
	if want := []int{200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, POST, PUT, DELETE /legacy (plain mux mounted, limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// The same with a chi sub-router behind a plain middleware (the documented
// opaque mount, whose requests the doc says are keyed "/admin/*").
func TestRouteKeyWrappedMountOwnPathOneQuota(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	admin := chi.NewRouter()
	admin.Post("/", ok)
	admin.Get("/", ok)
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) })
	}
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Mount("/admin", wrap(admin))
	codes := methodCodes(r, "/admin", "GET", "POST")
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, POST /admin (wrapped sub-router, limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// A root GET route and a mounted sub-router's every-method route with the
// same full pattern: chi serves GET /api/users with the root route and every
// other method with the sub-router's r.HandleFunc("/users"). The
// every-method route must keep one quota whatever the method.
func TestRouteKeyShadowedEveryMethodRouteOneQuota(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	var served []string
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Get("/api/users", func(w http.ResponseWriter, r *http.Request) { served = append(served, "root"); ok(w, r) })
	r.Route("/api", func(r chi.Router) {
		r.HandleFunc("/users", func(w http.ResponseWriter, r *http.Request) { served = append(served, "sub"); ok(w, r) })
	})
	codes := methodCodes(r, "/api/users", "POST", "PUT", "DELETE")
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("POST, PUT, DELETE /api/users (served by %q, every-method route, limit 1): %v, want %v; keys %q", served, codes, want, obs.list())
	}
}

// A layer on the every-method route, written as the doc says ("/api/users"
// for a route of every method), must limit it.
func TestRouteKeyShadowedEveryMethodRouteLayerApplies(t *testing.T) {
	obs, r := perRouteRouter(t, "/api/users")
	r.Get("/api/users", ok)
	r.Route("/api", func(r chi.Router) { r.HandleFunc("/users", ok) })
	codes := methodCodes(r, "/api/users", "POST", "POST")
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("POST /api/users twice (Routes \"/api/users\", limit 1): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// The mount-point case of the same: r.Get("/users/") beside r.Route("/users")
// whose "/" is r.HandleFunc: POST /users/ is served by the sub-router's
// every-method route.
func TestRouteKeyMountPointEveryMethodOneQuota(t *testing.T) {
	obs, r := perRouteRouter(t)
	r.Route("/users", func(r chi.Router) { r.HandleFunc("/", ok) })
	r.Get("/users/", ok)
	codes := methodCodes(r, "/users/", "POST", "PUT")
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("POST, PUT /users/ (sub-router's HandleFunc(\"/\"), limit 1): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// Mounts "/api" and "/api/v2": GET /api/v2/x is served by the v2 router's
// r.Get("/x"), a route of its method; a dead r.HandleFunc("/v2/x") in the
// "/api" router (shadowed by the "/api/v2" mount) must not make it an
// every-method route. With an every-method catch-all in v2, every probe
// reaches "/api/v2/*", so chi's registration decides, read in the mount chi
// routes to (v2, the longest prefix), not in v1.
func TestRouteKeyMountsSharingAPrefix(t *testing.T) {
	for _, catchAll := range []bool{false, true} {
		obs := &keys{}
		l := perRouteLimiter(t, obs, "GET /api/v2/x")
		var served []string
		v1 := chi.NewRouter()
		v1.HandleFunc("/v2/x", func(w http.ResponseWriter, r *http.Request) { served = append(served, "v1"); ok(w, r) })
		v2 := chi.NewRouter()
		v2.Get("/x", func(w http.ResponseWriter, r *http.Request) { served = append(served, "v2"); ok(w, r) })
		if catchAll {
			v2.Handle("/*", http.HandlerFunc(ok))
		}
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l))
		r.Mount("/api", v1)
		r.Mount("/api/v2", v2)
		codes := methodCodes(r, "/api/v2/x", "GET", "GET")
		if want := []int{200, 429}; !slices.Equal(codes, want) {
			t.Errorf("catch-all in v2 %v: GET /api/v2/x twice (served by %q, Routes \"GET /api/v2/x\", limit 1): %v, want %v; keys %q", catchAll, served, codes, want, obs.list())
		}
	}
}

// A route registered for GET, TRACE and CONNECT (r.Get, r.Trace, r.Connect)
// is a route of its methods: a layer for "GET /x" limits GET /x.
func TestRouteKeyGetTraceConnectRoute(t *testing.T) {
	obs, r := perRouteRouter(t, "GET /x")
	r.Get("/x", ok)
	r.Trace("/x", ok)
	r.Connect("/x", ok)
	var codes []int
	for range 2 {
		codes = append(codes, do(r, "GET", "/x", peer).Code)
	}
	if want := []int{200, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET /x twice, layer Routes [\"GET /x\"] limit 1: %v, want %v; keys %q", codes, want, obs.list())
	}
}

// An every-method catch-all (r.Handle) beside a TRACE route at a more
// specific pattern: GET, POST and PUT reaching the catch-all share one
// quota.
func TestRouteKeyEveryMethodShadowedForTrace(t *testing.T) {
	obs, r := perRouteRouter(t)
	r.Handle("/files/*", http.HandlerFunc(ok))
	r.Trace("/files/{name}", ok)
	codes := methodCodes(r, "/files/a", "GET", "POST", "PUT")
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, POST, PUT /files/a (every-method /files/*, limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// CORS preflights registered per route (r.Options("/api/{id}")) beside an
// every-method handler: GET, TRACE and CONNECT share the handler's quota.
func TestRouteKeyEveryMethodWithCORSPreflight(t *testing.T) {
	obs, r := perRouteRouter(t)
	r.Handle("/api/*", http.HandlerFunc(ok))
	r.Options("/api/{id}", ok) // CORS preflight
	codes := methodCodes(r, "/api/1", "GET", "TRACE", "CONNECT")
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, TRACE, CONNECT /api/1 (every-method /api/*, limit 1 per route): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// A GET route whose pattern also has OPTIONS, TRACE and CONNECT routes of
// its own (so that every probe finds the pattern) is still a GET route: a
// layer on "GET /x" limits it, and the other methods' routes have quotas of
// their own.
func TestRouteKeyMethodRouteBesideProbeMethodRoutes(t *testing.T) {
	obs, r := perRouteRouter(t, "GET /x")
	r.Get("/x", ok)
	r.Options("/x", ok)
	r.Trace("/x", ok)
	r.Connect("/x", ok)
	if codes, want := methodCodes(r, "/x", "GET", "GET", "OPTIONS"), []int{200, 429, 200}; !slices.Equal(codes, want) {
		t.Errorf("GET, GET, OPTIONS /x (limit 1 on GET /x): %v, want %v; keys %q", codes, want, obs.list())
	}
}

// A POST route at the top, "/users/{id}", whose whole pattern reads the same
// as an every-method route in the "/users" mount (r.Handle("/{id}")); the
// mount also answers TRACE, CONNECT and OPTIONS at "/a" (so no probe
// decides). GET and PUT /users/a reach the mount's every-method route: they
// must share its quota (RouteOf's doc: keyed as that every-method route).
func TestRouteKeyMountRouteBehindLeafOfAnotherMethod(t *testing.T) {
	obs := &keys{}
	l := perRouteLimiter(t, obs)
	var served []string
	sub := chi.NewRouter()
	sub.Handle("/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served = append(served, "sub "+r.Method); ok(w, r) }))
	sub.Options("/a", ok)
	sub.Trace("/a", ok)
	sub.Connect("/a", ok)
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Post("/users/{id}", func(w http.ResponseWriter, r *http.Request) { served = append(served, "top POST"); ok(w, r) })
	r.Mount("/users", sub)
	codes := methodCodes(r, "/users/a", "GET", "PUT", "DELETE")
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET, PUT, DELETE /users/a (served by %q: the mount's every-method /{id}, limit 1 per route): %v, want %v; keys %q", served, codes, want, obs.list())
	}
}

// usersBesideMount: a POST route at the top, "/users/{id}", and the "/users" mount's
// every-method "/{id}" (whose whole pattern reads the same). probes: the
// mount also answers TRACE, CONNECT and OPTIONS at "/a" (no probe decides).
func usersBesideMount(t *testing.T, obs *keys, probes bool, served *[]string) http.Handler {
	l := perRouteLimiter(t, obs)
	sub := chi.NewRouter()
	sub.Handle("/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { *served = append(*served, "sub "+r.Method); ok(w, r) }))
	if probes {
		sub.Options("/a", ok)
		sub.Trace("/a", ok)
		sub.Connect("/a", ok)
	}
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Post("/users/{id}", func(w http.ResponseWriter, r *http.Request) { *served = append(*served, "top POST"); ok(w, r) })
	r.Mount("/users", sub)
	return r
}

// RouteOf's doc: "A method's route ... one whose whole pattern reads the same
// as an every-method route's in a mount, is keyed as that every-method route:
// both share its quota". The top POST /users/{id} must then share the
// mount's "/users/{id}" quota, whatever other routes the mount has at /a.
func TestRouteKeyMethodRouteReadingAsMountRouteSharesQuota(t *testing.T) {
	for _, probes := range []bool{false, true} {
		obs := &keys{}
		var served []string
		r := usersBesideMount(t, obs, probes, &served)
		codes := methodCodes(r, "/users/a", "GET", "POST")
		if want := []int{200, 429}; !slices.Equal(codes, want) {
			t.Errorf("probes at /a in the mount %v: GET then POST /users/a (served by %q, limit 1 per route): %v, want %v (doc: shared quota); keys %q", probes, served, codes, want, obs.list())
		}
	}
}
