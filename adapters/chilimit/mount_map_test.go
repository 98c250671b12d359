package chilimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/limitry/ratelimit/adapters/chilimit"
)

// hostRoutes is a host router in the style of go-chi/hostrouter: a map type
// (not comparable) implementing chi.Routes, mounted at "/".
type hostRoutes map[string]*chi.Mux

func (h hostRoutes) ServeHTTP(w http.ResponseWriter, r *http.Request) { h[""].ServeHTTP(w, r) }
func (h hostRoutes) Routes() []chi.Route                              { return h[""].Routes() }
func (h hostRoutes) Middlewares() chi.Middlewares                     { return h[""].Middlewares() }
func (h hostRoutes) Match(rctx *chi.Context, m, p string) bool        { return h[""].Match(rctx, m, p) }
func (h hostRoutes) Find(rctx *chi.Context, m, p string) string       { return h[""].Find(rctx, m, p) }

// TestRouteKeyMountedBehindMapRoutes: a limiter in a router mounted behind
// a chi.Routes of a map type (a host router such as go-chi/hostrouter's),
// on a path only a rewrite after it serves (POST /login/ with
// StripSlashes), looks the mount up without hashing that chi.Routes (which
// would panic) and keys the request by its route.
func TestRouteKeyMountedBehindMapRoutes(t *testing.T) {
	obs := &keys{}
	sub := chi.NewRouter()
	sub.Use(chilimit.Middleware(routeLayerLimiter(t, obs, "POST /login")), middleware.StripSlashes)
	sub.Post("/login", ok)
	r := chi.NewRouter()
	r.Mount("/", hostRoutes{"": sub})
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("POST /login/: panic %v", p)
		}
	}()
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/login/", nil))
	if w.Code != http.StatusOK {
		t.Errorf("POST /login/: %d, want 200", w.Code)
	}
	if got := obs.list(); len(got) != 1 || got[0] != "route=POST /login" {
		t.Errorf("POST /login/ charged %q, want [route=POST /login]", got)
	}
}
