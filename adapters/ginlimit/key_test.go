package ginlimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/ginlimit"
	"github.com/limitry/ratelimit/core"
)

// auth is an application's authentication handler: it stores the user
// named by the X-User header with c.Set, as gin applications do.
func auth(c *gin.Context) {
	if u := c.GetHeader("X-User"); u != "" {
		c.Set("user", u)
	}
	c.Next()
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
	"Get": ginlimit.Get("user"),
	"Key": ginlimit.Key(func(c *gin.Context) (string, error) {
		if u := c.GetString("user"); u != "" {
			return u, nil
		}
		return "", ratelimit.ErrNoKey
	}),
}

func TestKeyChargesTheUser(t *testing.T) {
	for name, key := range userKeys {
		t.Run(name, func(t *testing.T) {
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, userLayers(key, ratelimit.NoKeySkip))
			r := gin.New()
			r.Use(auth, ginlimit.Middleware(l))
			r.GET("/hello", ok)

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

func TestKeyAbsentUser(t *testing.T) {
	for name, key := range userKeys {
		t.Run(name+"/skip", func(t *testing.T) {
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, userLayers(key, ratelimit.NoKeySkip))
			r := gin.New()
			r.Use(auth, ginlimit.Middleware(l))
			r.GET("/hello", ok)
			for i := range 3 {
				if w := do(r, "GET", "/hello", peer); w.Code != http.StatusOK {
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
			r := gin.New()
			r.Use(auth, ginlimit.Middleware(l))
			r.GET("/hello", ok)
			if w := do(r, "GET", "/hello", peer); w.Code != http.StatusUnauthorized {
				t.Fatalf("anonymous request: status %d, want 401", w.Code)
			}
			if w := do(r, "GET", "/hello", peer, "X-User", "alice"); w.Code != http.StatusOK {
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
		Key:  ratelimit.FirstOf(ginlimit.Get("user"), ratelimit.MustClientIP()),
		Rule: core.Rule{Name: "caller", Limit: 1, Window: time.Minute},
	}})
	r := gin.New()
	r.Use(auth, ginlimit.Middleware(l))
	r.GET("/hello", ok)
	codes := []int{
		do(r, "GET", "/hello", peer, "X-User", "alice").Code,
		do(r, "GET", "/hello", peer).Code,
		do(r, "GET", "/hello", peer).Code,
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
		{"empty", ginlimit.Key(func(*gin.Context) (string, error) { return "", nil }), ratelimit.ErrEmptyKey},
		{"error", ginlimit.Key(func(*gin.Context) (string, error) { return "", bad }), bad},
		{"not a string", ginlimit.Get("n"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			obs := &keys{}
			l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{Key: tc.key, Rule: core.Rule{Name: "k", Limit: 5, Window: time.Minute}}}, onErr)
			r := gin.New()
			r.Use(func(c *gin.Context) { c.Set("n", 42) }, ginlimit.Middleware(l))
			r.GET("/hello", ok)
			if w := do(r, "GET", "/hello", peer); w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", w.Code)
			}
			if len(got) != 1 || (tc.want != nil && !errors.Is(got[0], tc.want)) {
				t.Fatalf("errors %v, want one wrapping %v", got, tc.want)
			}
			if tc.want == nil && got[0].Error() != `ratelimit: layer "k": ginlimit: Get("n"): the value has type int, not string` {
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
	l := limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(ginlimit.Get("user"), ratelimit.NoKeySkip),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { got = err }))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") })).ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError || !errors.Is(got, ginlimit.ErrNoContext) || !errors.Is(got, ratelimit.ErrConfig) {
		t.Fatalf("status %d, error %v; want 500 with a configuration error", w.Code, got)
	}
}

func TestKeyPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"nil Key":    func() { ginlimit.Key(nil) },
		"empty Get":  func() { ginlimit.Get("") },
		"nil Option": func() { ginlimit.Middleware(limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1)), nil) },
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

func TestWithResult(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, userLayers(ginlimit.Get("user"), ratelimit.NoKeySkip))
	for _, withResult := range []bool{false, true} {
		var opts []ginlimit.Option
		if withResult {
			opts = append(opts, ginlimit.WithResult())
		}
		r := gin.New()
		r.Use(auth, ginlimit.Middleware(l, opts...))
		r.GET("/quota", func(c *gin.Context) {
			res, ok := ratelimit.ResultFromContext(c.Request.Context())
			if !ok {
				c.String(http.StatusOK, "none")
				return
			}
			for _, lr := range res.Layers {
				fmt.Fprintf(c.Writer, "%s=%s:%d ", lr.Decision.Policy.Name(), lr.Key, lr.Decision.Remaining)
			}
		})
		user := fmt.Sprint("u", withResult)
		got := do(r, "GET", "/quota", peer, "X-User", user).Body.String()
		want := "none"
		if withResult {
			want = "per-ip=192.0.2.1:8 per-user=" + user + ":1 "
		}
		if got != want {
			t.Errorf("WithResult %v: body %q, want %q", withResult, got, want)
		}
	}
}
