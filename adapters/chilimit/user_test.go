package chilimit_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
	"github.com/limitry/ratelimit/core"
)

// auth is an application's authentication middleware: it stores the user
// named by the X-User header with ratelimit.WithUser.
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-User"); u != "" {
			r = r.WithContext(ratelimit.WithUser(r.Context(), u))
		}
		next.ServeHTTP(w, r)
	})
}

func userLayers(ifNoKey ratelimit.NoKey) []ratelimit.Layer {
	return []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute}},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}, IfNoKey: ifNoKey},
	}
}

func TestUserLayerChargesTheUser(t *testing.T) {
	for _, withResult := range []bool{false, true} {
		t.Run(fmt.Sprint("WithResult=", withResult), func(t *testing.T) {
			var opts []chilimit.Option
			if withResult {
				opts = append(opts, chilimit.WithResult())
			}
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, userLayers(ratelimit.NoKeySkip))
			r := chi.NewRouter()
			r.Use(auth, chilimit.Middleware(l, opts...))
			r.Get("/hello", ok)

			var codes []int
			for _, u := range []string{"alice", "bob", "alice", "alice", "bob", "bob"} {
				codes = append(codes, do(r, "GET", "/hello", peer, "X-User", u).Code)
			}
			if want := []int{200, 200, 200, 429, 200, 429}; !slices.Equal(codes, want) {
				t.Errorf("statuses %v, want %v", codes, want)
			}
			want := []string{
				"per-ip=192.0.2.1", "per-user=alice", "per-ip=192.0.2.1", "per-user=bob",
				"per-ip=192.0.2.1", "per-user=alice", "per-ip=192.0.2.1", "per-user=alice",
				"per-ip=192.0.2.1", "per-user=bob", "per-ip=192.0.2.1", "per-user=bob",
			}
			if got := obs.list(); !slices.Equal(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
		})
	}
}

func TestUserLayerAbsentUser(t *testing.T) {
	for _, tc := range []struct {
		ifNoKey ratelimit.NoKey
		status  int
		keys    []string
	}{
		{ratelimit.NoKeySkip, http.StatusOK, []string{"per-ip=192.0.2.1"}},
		{ratelimit.NoKeyRefuse, http.StatusUnauthorized, nil},
	} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, userLayers(tc.ifNoKey))
		r := chi.NewRouter()
		r.Use(auth, chilimit.Middleware(l))
		r.Get("/hello", ok)
		if w := do(r, "GET", "/hello", peer); w.Code != tc.status {
			t.Errorf("IfNoKey %d: status %d, want %d", tc.ifNoKey, w.Code, tc.status)
		}
		if got := obs.list(); !slices.Equal(got, tc.keys) {
			t.Errorf("IfNoKey %d: keys %v, want %v", tc.ifNoKey, got, tc.keys)
		}
	}
}

func TestWithResult(t *testing.T) {
	for _, withResult := range []bool{false, true} {
		var opts []chilimit.Option
		if withResult {
			opts = append(opts, chilimit.WithResult())
		}
		l := limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(ratelimit.NoKeySkip))
		r := chi.NewRouter()
		r.Use(auth, chilimit.Middleware(l, opts...))
		r.Get("/quota", func(w http.ResponseWriter, r *http.Request) {
			res, ok := ratelimit.ResultFromContext(r.Context())
			if !ok {
				fmt.Fprint(w, "none")
				return
			}
			for _, lr := range res.Layers {
				fmt.Fprintf(w, "%s=%s:%d ", lr.Decision.Policy.Name(), lr.Key, lr.Decision.Remaining)
			}
		})
		got := do(r, "GET", "/quota", peer, "X-User", "alice").Body.String()
		want := "none"
		if withResult {
			want = "per-ip=192.0.2.1:9 per-user=alice:1 "
		}
		if got != want {
			t.Errorf("WithResult %v: body %q, want %q", withResult, got, want)
		}
	}
}

func TestNilOptionPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	chilimit.Middleware(limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(ratelimit.NoKeySkip)), nil)
}
