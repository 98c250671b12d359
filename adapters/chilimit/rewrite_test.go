package chilimit_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
	"github.com/limitry/ratelimit/core"
)

// routeLayerLimiter has one layer keyed by the route alone, limit 1 per
// minute, and reports its keys to obs.
func routeLayerLimiter(t *testing.T, obs *keys, routes ...string) *ratelimit.Limiter {
	return limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:    ratelimit.Route(),
		Rule:   core.Rule{Name: "route", Limit: 1, Window: time.Minute},
		Routes: routes,
	}}, ratelimit.WithLogger(nil))
}

// TestRouteKeyParamMountIndex checks that a mount point's own path, with
// and without its trailing slash (one endpoint: chi serves both by the
// sub-router's "/" route), has one key per method, for a mount with a
// parameter too (r.Route("/{tenant}/users", ...)).
func TestRouteKeyParamMountIndex(t *testing.T) {
	for _, base := range []string{"/users", "/{tenant}/users"} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
			Key:  ratelimit.Route(),
			Rule: core.Rule{Name: "route", Limit: 100, Window: time.Minute},
		}}, ratelimit.WithLogger(nil))
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l))
		r.Route(base, func(r chi.Router) {
			r.Get("/", ok)
			r.Post("/", ok)
		})
		p := "/users"
		if base != "/users" {
			p = "/acme/users"
		}
		do(r, "GET", p, peer)
		do(r, "GET", p+"/", peer)
		do(r, "POST", p, peer)
		got := obs.list()
		want := []string{"route=GET " + base + "/", "route=GET " + base + "/", "route=POST " + base + "/"}
		if !slices.Equal(got, want) {
			t.Errorf("r.Route(%q): GET %s, GET %s/, POST %s keyed %q, want %q", base, p, p, p, got, want)
		}
	}
}

// TestRouteKeyBesideTrailingSlashMount checks that a route "/users" of its
// own beside r.Mount("/users/", sub) (a trailing slash: chi registers no
// stubs, so GET /users is that route) is keyed by itself, whether the
// sub-router has a "/" route or not.
func TestRouteKeyBesideTrailingSlashMount(t *testing.T) {
	for _, subIndex := range []bool{false, true} {
		obs := &keys{}
		l := routeLayerLimiter(t, obs)
		served := 0
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l))
		r.Get("/users", func(w http.ResponseWriter, r *http.Request) { served++ })
		sub := chi.NewRouter()
		sub.Get("/{id}", ok)
		if subIndex {
			sub.Get("/", ok)
		}
		r.Mount("/users/", sub)
		codes := []int{do(r, "GET", "/users", peer).Code, do(r, "GET", "/users", peer).Code}
		if !slices.Equal(codes, []int{200, 429}) {
			t.Errorf("sub-router with \"/\" %v: GET /users twice (limit 1 per route): %v, want [200 429]; served %d; keys %q", subIndex, codes, served, obs.list())
		}
		if got := obs.list(); len(got) == 0 || got[0] != "route=GET /users" {
			t.Errorf("sub-router with \"/\" %v: GET /users keyed %q, want route=GET /users", subIndex, got)
		}
	}
}

// TestRouteKeyLaterRewritesEncodedPath checks that StripSlashes and
// URLFormat after the limiter are applied, as chi's are, to the decoded
// path: POST /log%69n/ and /log%69n.json, served by POST /login, are keyed
// by it.
func TestRouteKeyLaterRewritesEncodedPath(t *testing.T) {
	for _, tc := range []struct {
		mw   func(http.Handler) http.Handler
		name string
		path string
	}{
		{middleware.StripSlashes, "StripSlashes", "/log%69n/"},
		{middleware.URLFormat, "URLFormat", "/log%69n.json"},
	} {
		obs := &keys{}
		l := routeLayerLimiter(t, obs, "POST /login")
		served := 0
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l), tc.mw)
		r.Post("/login", func(w http.ResponseWriter, r *http.Request) { served++ })
		var codes []int
		for range 3 {
			codes = append(codes, do(r, "POST", tc.path, peer).Code)
		}
		if !slices.Equal(codes, []int{200, 429, 429}) || served != 1 {
			t.Errorf("%s after the limiter: POST %s x3 (limit 1 on POST /login): %v, login served %d times; keys %q", tc.name, tc.path, codes, served, obs.list())
		}
	}
}

// TestRouteKeyLaterCleanPathNoOp checks that CleanPath after a rewrite
// that set the route path does nothing, as chi's does: GET /a//b/ is
// served by "/a/*" and keyed by it.
func TestRouteKeyLaterCleanPathNoOp(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "route", Limit: 100, Window: time.Minute},
	}}, ratelimit.WithLogger(nil))
	var served string
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l), middleware.StripSlashes, middleware.CleanPath)
	r.Get("/a/b", func(w http.ResponseWriter, r *http.Request) { served = "/a/b" })
	r.Get("/a/*", func(w http.ResponseWriter, r *http.Request) { served = "/a/*" })
	do(r, "GET", "/a//b/", peer)
	if got := obs.list(); len(got) != 1 || got[0] != "route=GET "+served {
		t.Errorf("GET /a//b/: served by %s, keyed %q", served, got)
	}
}

// TestRouteKeyTwoLimitersURLFormat checks that with two limiters in one
// r.Use and URLFormat between them, the second does not strip the
// extension again: GET /report.v2.json, served by /report.v2, is keyed by
// it.
func TestRouteKeyTwoLimitersURLFormat(t *testing.T) {
	obs1, obs2 := &keys{}, &keys{}
	mk := func(obs *keys) *ratelimit.Limiter {
		return limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
			Key:  ratelimit.Route(),
			Rule: core.Rule{Name: "route", Limit: 100, Window: time.Minute},
		}}, ratelimit.WithLogger(nil))
	}
	var served string
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(mk(obs1)), middleware.URLFormat, chilimit.Middleware(mk(obs2)))
	r.Get("/report", func(w http.ResponseWriter, r *http.Request) { served = "/report" })
	r.Get("/report.v2", func(w http.ResponseWriter, r *http.Request) { served = "/report.v2" })
	do(r, "GET", "/report.v2.json", peer)
	want := []string{"route=GET " + served}
	if got1, got2 := obs1.list(), obs2.list(); !slices.Equal(got1, want) || !slices.Equal(got2, want) {
		t.Errorf("GET /report.v2.json served by %s; first limiter keyed %q, second %q", served, got1, got2)
	}
}

// TestRouteKeyConcurrentFirstRequests sends the first requests through a
// fresh router at once (the route lookup's cache filled concurrently), for
// -race.
func TestRouteKeyConcurrentFirstRequests(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "route", Limit: 1000, Window: time.Minute},
	}}, ratelimit.WithLogger(nil))
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l), middleware.StripSlashes)
	r.Route("/users", func(r chi.Router) { r.Get("/", ok); r.Get("/{id}", ok) })
	r.Get("/health", ok)
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for _, p := range []string{"/users", "/users/", "/health", "/users/7/"} {
				do(r, "GET", p, peer)
			}
			_ = i
		}()
	}
	for range 8 {
		<-done
	}
}

// TestRouteKeySubRouterRewriteAfterLimiter checks that with the limiter in
// a mounted sub-router's own r.Use and a rewriting middleware after it,
// a path that matches no route as it is (/api/login/, /api/login.json) is
// keyed by the route the rewrite makes chi serve, GET /api/login, and so
// shares its quota instead of escaping it.
func TestRouteKeySubRouterRewriteAfterLimiter(t *testing.T) {
	for _, tc := range []struct {
		name, method, path string
		mw                 func(http.Handler) http.Handler
	}{
		{"StripSlashes", http.MethodGet, "/api/login/", middleware.StripSlashes},
		{"URLFormat", http.MethodGet, "/api/login.json", middleware.URLFormat},
		{"GetHead", http.MethodHead, "/api/login", middleware.GetHead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := chi.NewRouter()
			r.Route("/api", func(r chi.Router) {
				r.Use(chilimit.Middleware(loginLimiter(t)), tc.mw)
				r.Get("/login", ok)
			})
			if c := do(r, http.MethodGet, "/api/login", peer).Code; c != http.StatusOK {
				t.Fatalf("first GET /api/login: %d", c)
			}
			if c := do(r, tc.method, tc.path, peer).Code; c != http.StatusTooManyRequests {
				t.Errorf("%s %s once GET /api/login's quota is spent: %d, want 429", tc.method, tc.path, c)
			}
		})
	}
}

// TestRouteKeySubRouterRewriteBesideRootRoute checks that with a rewrite
// in a mounted sub-router (StripSlashes after or before the limiter in its
// own r.Use), a path is keyed by the sub-router's route chi serves, not by
// a root route in another branch at the rewritten path: GET /api/health/
// reaches the mount (the root's GET /api/health is not /api/health/), which
// strips the slash and serves GET /api/{resource}.
func TestRouteKeySubRouterRewriteBesideRootRoute(t *testing.T) {
	for _, order := range stripOrders {
		var key, served string
		r := chi.NewRouter()
		r.Get("/api/health", func(w http.ResponseWriter, r *http.Request) { served = "GET /api/health" })
		r.Route("/api", func(r chi.Router) {
			useWithStrip(r, order, keyProbe(&key))
			r.Get("/{resource}", func(w http.ResponseWriter, r *http.Request) {
				served = "GET " + chi.RouteContext(r.Context()).RoutePattern()
			})
		})
		do(r, http.MethodGet, "/api/health/", peer)
		if served != "GET /api/{resource}" || key != served {
			t.Errorf("%s: GET /api/health/ keyed %q, served by %q", order, key, served)
		}
	}
}

// TestRouteKeySubRouterRewriteEveryMethodRoute checks that in a mount with
// StripSlashes (before or after the limiter), a route of the sub-router
// registered for every method is keyed without its method for the path
// with and without its trailing slash, as chi serves both by it: the
// slash buys no quota of its own, per method.
func TestRouteKeySubRouterRewriteEveryMethodRoute(t *testing.T) {
	for _, order := range stripOrders {
		var key, served string
		r := chi.NewRouter()
		r.Route("/api", func(r chi.Router) {
			useWithStrip(r, order, keyProbe(&key))
			r.HandleFunc("/{resource}", func(w http.ResponseWriter, r *http.Request) {
				served = chi.RouteContext(r.Context()).RoutePattern()
			})
		})
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			for _, p := range []string{"/api/health", "/api/health/"} {
				key, served = "", ""
				do(r, m, p, peer)
				if served != "/api/{resource}" || key != served {
					t.Errorf("%s: %s %s keyed %q, served by %q", order, m, p, key, served)
				}
			}
		}
	}
}

// TestRouteKeySubRouterBesideMountPointRoute checks that a route at the
// mount point's own path (GET /api/ beside r.Route("/api", ...)), which
// hides the mount for that path alone, does not hide it for the paths
// below: GET /api/health/, stripped in the mount, is keyed by the mount's
// route chi serves, not by the root's GET /api/health.
func TestRouteKeySubRouterBesideMountPointRoute(t *testing.T) {
	var key, served string
	r := chi.NewRouter()
	r.Get("/api/health", func(w http.ResponseWriter, r *http.Request) { served = "GET /api/health" })
	r.Route("/api", func(r chi.Router) {
		r.Use(keyProbe(&key), middleware.StripSlashes)
		r.Get("/{resource}", func(w http.ResponseWriter, r *http.Request) {
			served = "GET " + chi.RouteContext(r.Context()).RoutePattern()
		})
	})
	r.Get("/api/", func(w http.ResponseWriter, r *http.Request) { served = "GET /api/" })
	do(r, http.MethodGet, "/api/health/", peer)
	if served != "GET /api/{resource}" || key != served {
		t.Errorf("GET /api/health/ keyed %q, served by %q", key, served)
	}
}

// stripOrders are the two places of StripSlashes beside the limiter in a
// sub-router's own r.Use.
var stripOrders = []string{"limiter, then StripSlashes", "StripSlashes, then limiter"}

// useWithStrip adds limiter and StripSlashes to r's stack, in order.
func useWithStrip(r chi.Router, order string, limiter func(http.Handler) http.Handler) {
	if order == stripOrders[0] {
		r.Use(limiter, middleware.StripSlashes)
	} else {
		r.Use(middleware.StripSlashes, limiter)
	}
}

// keyProbe returns a middleware that stores the route key RouteOf gives a
// request in *key, standing for the limiter.
func keyProbe(key *string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			*key, _ = chilimit.RouteOf(r)
			next.ServeHTTP(w, r)
		})
	}
}
