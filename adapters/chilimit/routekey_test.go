package chilimit_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/limitry/ratelimit/adapters/chilimit"
)

// seen records RouteOf for every request, from the root r.Use.
type seen struct{ routes []string }

func (s *seen) mw(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := chilimit.RouteOf(r)
		if !ok {
			rt = "(not ok)"
		}
		s.routes = append(s.routes, rt)
		next.ServeHTTP(w, r)
	})
}

// TestRouteKeyOwnMethodAtMountPoint checks a route of its own for one
// method at a mount point (r.Route("/users", ...), then r.Post("/users",
// create)): chi serves POST /users by that route and GET /users by the
// sub-router's "/" (Mount's stub still holds every other method), and a
// layer on "POST /users" limits POST /users.
func TestRouteKeyOwnMethodAtMountPoint(t *testing.T) {
	obs := &keys{}
	l := routeLayerLimiter(t, obs, "POST /users")
	served := 0
	var patterns []string
	r := chi.NewRouter()
	sn := &seen{}
	r.Use(sn.mw, chilimit.Middleware(l))
	r.Route("/users", func(r chi.Router) { r.Get("/", ok) })
	r.Post("/users", func(w http.ResponseWriter, r *http.Request) {
		served++
		patterns = append(patterns, chi.RouteContext(r.Context()).RoutePattern())
	})
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "POST", "/users", peer).Code)
	}
	if !slices.Equal(codes, []int{200, 429, 429}) {
		t.Errorf("POST /users x3 (limit 1 on POST /users): %v, served %d by %q; RouteOf %q", codes, served, patterns, sn.routes)
	}
}

// TestRouteKeyOwnGetAtMountPoint checks the same router: GET /users and GET
// /users/ are both served by the sub-router's "/" route, "GET /users/", and
// a layer on it limits both.
func TestRouteKeyOwnGetAtMountPoint(t *testing.T) {
	obs := &keys{}
	l := routeLayerLimiter(t, obs, "GET /users/")
	r := chi.NewRouter()
	sn := &seen{}
	r.Use(sn.mw, chilimit.Middleware(l))
	r.Route("/users", func(r chi.Router) { r.Get("/", ok) })
	r.Post("/users", ok)
	codes := []int{do(r, "GET", "/users", peer).Code, do(r, "GET", "/users", peer).Code}
	if !slices.Equal(codes, []int{200, 429}) {
		t.Errorf("GET /users x2 (limit 1 on GET /users/): %v; RouteOf %q", codes, sn.routes)
	}
}

// TestRouteKeyLaterGetHead checks GetHead after the limiter, which sets the
// route path (raw, as it came) for a HEAD it serves as GET, so that a
// StripSlashes after it strips the raw path: HEAD /log%69n/ is served by
// GET /{page}, and a layer on it applies.
func TestRouteKeyLaterGetHead(t *testing.T) {
	obs := &keys{}
	l := routeLayerLimiter(t, obs, "GET /{page}")
	var served []string
	r := chi.NewRouter()
	sn := &seen{}
	r.Use(sn.mw, chilimit.Middleware(l), middleware.GetHead, middleware.StripSlashes)
	r.Get("/login", func(w http.ResponseWriter, r *http.Request) { served = append(served, "/login") })
	r.Get("/{page}", func(w http.ResponseWriter, r *http.Request) { served = append(served, "/{page}") })
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "HEAD", "/log%69n/", peer).Code)
	}
	if !slices.Equal(codes, []int{200, 429, 429}) {
		t.Errorf("HEAD /log%%69n/ x3 (limit 1 on GET /{page}): %v, served by %q; RouteOf %q", codes, served, sn.routes)
	}
}

// TestRouteKeyWithInMountAfterTopCleanPath checks CleanPath at the top, the
// limiter in r.With inside a mounted sub-router, and a catch-all at the
// root (static files, an SPA): POST /x/../api/login, served by POST
// /api/login, is limited by it.
func TestRouteKeyWithInMountAfterTopCleanPath(t *testing.T) {
	obs := &keys{}
	l := routeLayerLimiter(t, obs, "POST /api/login")
	served := 0
	var routes []string
	r := chi.NewRouter()
	r.Use(middleware.CleanPath)
	r.Route("/api", func(r chi.Router) {
		r.With(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rt, _ := chilimit.RouteOf(r)
				routes = append(routes, rt)
				next.ServeHTTP(w, r)
			})
		}, chilimit.Middleware(l)).Post("/login", func(w http.ResponseWriter, r *http.Request) { served++ })
	})
	r.Handle("/*", http.HandlerFunc(ok))
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "POST", "/x/../api/login", peer).Code)
	}
	if !slices.Equal(codes, []int{200, 429, 429}) || served != 1 {
		t.Errorf("POST /x/../api/login x3 (limit 1 on POST /api/login): %v, login served %d; RouteOf %q", codes, served, routes)
	}
}

// TestRouteKeyWithInMountEncodedPath checks StripSlashes at the top and the
// limiter in r.With inside a mount: POST /api/log%69n/, served by POST
// /api/login (StripSlashes routes the decoded path), is keyed by it, not
// failed.
func TestRouteKeyWithInMountEncodedPath(t *testing.T) {
	obs := &keys{}
	l := routeLayerLimiter(t, obs, "POST /api/login")
	served := 0
	r := chi.NewRouter()
	r.Use(middleware.StripSlashes)
	r.Route("/api", func(r chi.Router) {
		r.With(chilimit.Middleware(l)).Post("/login", func(w http.ResponseWriter, r *http.Request) { served++ })
	})
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "POST", "/api/log%69n/", peer).Code)
	}
	if !slices.Equal(codes, []int{200, 429, 429}) || served != 1 {
		t.Errorf("POST /api/log%%69n/ x3 (limit 1 on POST /api/login): %v, login served %d; keys %q", codes, served, obs.list())
	}
}
