package echolimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/echolimit"
	"github.com/limitry/ratelimit/core"
)

// auth is an application's authentication middleware: it stores the user
// named by the X-User header with c.Set, as echo applications do.
func auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if u := c.Request().Header.Get("X-User"); u != "" {
			c.Set("user", u)
		}
		return next(c)
	}
}

// userLayers is a per-IP layer, then a per-user layer keyed by key.
func userLayers(key ratelimit.KeyFunc, ifNoKey ratelimit.NoKey) []ratelimit.Layer {
	return []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute}},
		{Key: key, Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}, IfNoKey: ifNoKey},
	}
}

// userKeys are the Key forms under test, all reading c.Get("user").
var userKeys = map[string]ratelimit.KeyFunc{
	"Get": echolimit.Get("user"),
	"Key": echolimit.Key(func(c echo.Context) (string, error) {
		if u, _ := c.Get("user").(string); u != "" {
			return u, nil
		}
		return "", ratelimit.ErrNoKey
	}),
}

// modes are the middleware's two response modes.
var modes = map[string]echolimit.Config{"default": {}, "HTTPError": {HTTPError: true}}

func TestKeyChargesTheUser(t *testing.T) {
	for name, key := range userKeys {
		for mode, cfg := range modes {
			t.Run(name+"/"+mode, func(t *testing.T) {
				obs := &keys{}
				l := limiter(t, core.NewFakeClock(t0), obs, userLayers(key, ratelimit.NoKeySkip))
				e := echo.New()
				e.Use(auth, echolimit.MiddlewareWithConfig(l, cfg))
				e.GET("/hello", ok)

				var codes []int
				for _, u := range []string{"alice", "bob", "alice", "alice", "bob", "bob"} {
					codes = append(codes, do(e, "GET", "/hello", peer, "X-User", u).Code)
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
}

func TestKeyAbsentUser(t *testing.T) {
	for name, key := range userKeys {
		t.Run(name+"/skip", func(t *testing.T) {
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, userLayers(key, ratelimit.NoKeySkip))
			e := echo.New()
			e.Use(auth, echolimit.Middleware(l))
			e.GET("/hello", ok)
			for i := range 3 {
				if w := do(e, "GET", "/hello", peer); w.Code != http.StatusOK {
					t.Fatalf("anonymous request %d: status %d", i, w.Code)
				}
			}
			want := []string{"per-ip=192.0.2.1", "per-ip=192.0.2.1", "per-ip=192.0.2.1"}
			if got := obs.list(); !slices.Equal(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
		})
		t.Run(name+"/refuse", func(t *testing.T) {
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, userLayers(key, ratelimit.NoKeyRefuse))
			e := echo.New()
			e.Use(auth, echolimit.Middleware(l))
			e.GET("/hello", ok)
			if w := do(e, "GET", "/hello", peer); w.Code != http.StatusUnauthorized {
				t.Fatalf("anonymous request: status %d, want 401", w.Code)
			}
			if w := do(e, "GET", "/hello", peer, "X-User", "alice"); w.Code != http.StatusOK {
				t.Fatalf("alice: status %d", w.Code)
			}
			if got, want := obs.list(), []string{"per-ip=192.0.2.1", "per-user=alice"}; !slices.Equal(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
		})
	}
}

// A per-user layer falls back to the client IP for anonymous requests.
func TestKeyFirstOf(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.FirstOf(echolimit.Get("user"), ratelimit.MustClientIP()),
		Rule: core.Rule{Name: "caller", Limit: 1, Window: time.Minute},
	}})
	e := echo.New()
	e.Use(auth, echolimit.Middleware(l))
	e.GET("/hello", ok)
	codes := []int{
		do(e, "GET", "/hello", peer, "X-User", "alice").Code,
		do(e, "GET", "/hello", peer).Code,
		do(e, "GET", "/hello", peer).Code,
	}
	if want := []int{200, 200, 429}; !slices.Equal(codes, want) {
		t.Errorf("statuses %v, want %v", codes, want)
	}
	if got, want := obs.list(), []string{"caller=0:alice", "caller=1:192.0.2.1", "caller=1:192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
}

// Key errors are key errors: never a skip, never a shared bucket.
func TestKeyErrors(t *testing.T) {
	var got []error
	onErr := ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = append(got, err) })
	bad := errors.New("token expired")
	for _, tc := range []struct {
		name string
		key  ratelimit.KeyFunc
		want error
	}{
		{"empty", echolimit.Key(func(echo.Context) (string, error) { return "", nil }), ratelimit.ErrEmptyKey},
		{"error", echolimit.Key(func(echo.Context) (string, error) { return "", bad }), bad},
		{"not a string", echolimit.Get("n"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{Key: tc.key, Rule: core.Rule{Name: "k", Limit: 5, Window: time.Minute}}}, onErr)
			e := echo.New()
			e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) error { c.Set("n", 42); return next(c) }
			}, echolimit.Middleware(l))
			e.GET("/hello", ok)
			if w := do(e, "GET", "/hello", peer); w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", w.Code)
			}
			if len(got) != 1 || (tc.want != nil && !errors.Is(got[0], tc.want)) {
				t.Fatalf("errors %v, want one wrapping %v", got, tc.want)
			}
			if tc.want == nil && got[0].Error() != `ratelimit: layer "k": echolimit: Get("n"): the value has type int, not string` {
				t.Errorf("error %q", got[0])
			}
			if seen := obs.list(); len(seen) != 0 {
				t.Errorf("charged %v", seen)
			}
		})
	}
}

// A Key layer in a Limiter mounted without this package's middleware is a
// key error, never a skip.
func TestKeyWithoutMiddleware(t *testing.T) {
	var got error
	l := limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(echolimit.Get("user"), ratelimit.NoKeySkip),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = err }))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") })).ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError || !errors.Is(got, echolimit.ErrNoContext) || !errors.Is(got, ratelimit.ErrConfig) {
		t.Fatalf("status %d, error %v; want 500 with a configuration error", w.Code, got)
	}
}

func TestKeyPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"nil Key":   func() { echolimit.Key(nil) },
		"empty Get": func() { echolimit.Get("") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

func TestConfigResult(t *testing.T) {
	for _, cfg := range []echolimit.Config{{}, {Result: true}, {Result: true, HTTPError: true}} {
		l := limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(echolimit.Get("user"), ratelimit.NoKeySkip))
		e := echo.New()
		e.Use(auth, echolimit.MiddlewareWithConfig(l, cfg))
		e.GET("/quota", func(c echo.Context) error {
			res, ok := ratelimit.ResultFromContext(c.Request().Context())
			if !ok {
				return c.String(http.StatusOK, "none")
			}
			for _, lr := range res.Layers {
				fmt.Fprintf(c.Response(), "%s=%s:%d ", lr.Decision.Policy.Name(), lr.Key, lr.Decision.Remaining)
			}
			return nil
		})
		got := do(e, "GET", "/quota", peer, "X-User", "alice").Body.String()
		want := "none"
		if cfg.Result {
			want = "per-ip=192.0.2.1:9 per-user=alice:1 "
		}
		if got != want {
			t.Errorf("%+v: body %q, want %q", cfg, got, want)
		}
	}
}
