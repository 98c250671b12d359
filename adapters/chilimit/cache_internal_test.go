package chilimit

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
)

// TestMountsBounded checks that the route lookup's cache of mount points
// does not keep every router a process builds: routers built and dropped
// (one per tenant, say) leave at most maxMounts entries.
func TestMountsBounded(t *testing.T) {
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for range maxMounts + 500 {
		r := chi.NewRouter()
		r.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				RouteOf(req)
				next.ServeHTTP(w, req)
			})
		})
		r.Get("/users", ok)
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/users", nil))
	}
	n := 0
	mounts.Range(func(any, any) bool { n++; return true })
	if n > maxMounts || nmounts.Load() > maxMounts {
		t.Fatalf("%d entries (%d counted) after %d routers, want at most %d", n, nmounts.Load(), maxMounts+500, maxMounts)
	}
}
