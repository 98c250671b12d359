package chilimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
	"github.com/limitry/ratelimit/core"
)

// exampleClock makes the examples' output independent of the time they run.
func exampleClock() *core.FakeClock {
	return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// send serves method path from remoteAddr and prints the status and
// selected headers.
func send(h http.Handler, method, path, remoteAddr string) {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remoteAddr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%s %-9s %d remaining=%q retry-after=%q\n", method, path, w.Code,
		w.Header().Get(ratelimit.HeaderRateLimitRemaining), w.Header().Get(ratelimit.HeaderRetryAfter))
}

// A per-client-IP limit for the whole router, added with r.Use.
func ExampleNew() {
	perIP, err := chilimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(), // r.RemoteAddr: no proxy trusted
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock()))
	if err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(perIP)
	r.Get("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	send(r, "GET", "/hello", "192.0.2.1:1234")
	send(r, "GET", "/hello", "192.0.2.1:1234")
	send(r, "GET", "/hello", "192.0.2.1:1234")
	send(r, "GET", "/hello", "198.51.100.7:999") // another client
	// Output:
	// GET /hello    200 remaining="1" retry-after=""
	// GET /hello    200 remaining="0" retry-after=""
	// GET /hello    429 remaining="0" retry-after="30"
	// GET /hello    200 remaining="1" retry-after=""
}

// A per-route, per-client limit mounted with r.With, where chi has routed
// the request: every /users/{id} request of one client shares a quota,
// whatever the id, and other routes have their own.
func ExampleMiddleware() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule: core.Rule{Name: "per-route", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock())))
	perRoute := chilimit.Middleware(l)

	r := chi.NewRouter()
	r.With(perRoute).Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "user", chi.URLParam(r, "id"))
	})
	r.Group(func(r chi.Router) {
		r.Use(perRoute) // a Group's Use runs after routing too
		r.Get("/posts/{id}", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "post", chi.URLParam(r, "id"))
		})
	})

	send(r, "GET", "/users/1", "192.0.2.1:1234")
	send(r, "GET", "/users/2", "192.0.2.1:1234")
	send(r, "GET", "/users/3", "192.0.2.1:1234")
	send(r, "GET", "/posts/1", "192.0.2.1:1234")
	// Output:
	// GET /users/1  200 remaining="1" retry-after=""
	// GET /users/2  200 remaining="0" retry-after=""
	// GET /users/3  429 remaining="0" retry-after="30"
	// GET /posts/1  200 remaining="1" retry-after=""
}

// One Limiter at the top level holds a per-IP limit for every route and a
// login limit for POST /login only, decided in one atomic batch: the
// refused login uses up none of the per-IP quota.
func ExampleMiddleware_topLevel() {
	ip := ratelimit.MustClientIP()
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ip, Rule: core.Rule{Name: "per-ip", Limit: 4, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.Rule{Name: "login", Limit: 1, Window: time.Minute},
			Routes: []string{"POST /login"}},
	}, ratelimit.WithClock(exampleClock())))

	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l))
	r.Post("/login", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "welcome") })
	r.Get("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	send(r, "POST", "/login", "192.0.2.1:1234")
	send(r, "POST", "/login", "192.0.2.1:1234")
	send(r, "GET", "/hello", "192.0.2.1:1234")
	// Output:
	// POST /login    200 remaining="0" retry-after=""
	// POST /login    429 remaining="0" retry-after="60"
	// GET /hello    200 remaining="2" retry-after=""
}

// RouteOf reports the route chi will match, as ratelimit.Route keys it,
// even in a top-level r.Use before chi has routed the request.
func ExampleRouteOf() {
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			route, _ := chilimit.RouteOf(req)
			fmt.Printf("%s %s -> %q\n", req.Method, req.URL.Path, route)
			next.ServeHTTP(w, req)
		})
	})
	r.Post("/login", func(http.ResponseWriter, *http.Request) {})
	r.HandleFunc("/any", func(http.ResponseWriter, *http.Request) {})
	for _, m := range [][2]string{{"POST", "/login"}, {"PUT", "/any"}, {"GET", "/nope"}} {
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(m[0], m[1], nil))
	}
	// Output:
	// POST /login -> "POST /login"
	// PUT /any -> "/any"
	// GET /nope -> ""
}

// Per-IP then per-user limits. chi keeps no values of its own, so the
// application's authentication middleware stores the user with
// ratelimit.WithUser, and a ratelimit.User layer keys by it; anonymous
// requests skip the per-user layer (its IfNoKey) and count only against
// the per-IP one.
func ExampleMiddleware_perUser() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 4, Window: time.Minute}},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))

	auth := func(next http.Handler) http.Handler { // stands for real authentication
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.Header.Get("X-User"); u != "" {
				r = r.WithContext(ratelimit.WithUser(r.Context(), u))
			}
			next.ServeHTTP(w, r)
		})
	}
	r := chi.NewRouter()
	r.Use(auth, chilimit.Middleware(l)) // authenticate first
	r.Get("/hello", func(w http.ResponseWriter, r *http.Request) {
		u, _ := ratelimit.UserFromContext(r.Context())
		fmt.Fprint(w, "hello ", u)
	})

	for _, user := range []string{"alice", "alice", "alice", "bob", "-", "-"} {
		req := httptest.NewRequest("GET", "/hello", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		if user != "-" {
			req.Header.Set("X-User", user)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%-5s %d %q\n", user, w.Code, w.Body.String())
	}
	// Output:
	// alice 200 "hello alice"
	// alice 200 "hello alice"
	// alice 429 "Too Many Requests\n"
	// bob   200 "hello bob"
	// -     200 "hello "
	// -     429 "Too Many Requests\n"
}

// The handler shows the client its quota, read from the request context.
func ExampleWithResult() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))
	r := chi.NewRouter()
	r.Use(chilimit.Middleware(l, chilimit.WithResult()))
	r.Get("/quota", func(w http.ResponseWriter, r *http.Request) {
		res, _ := ratelimit.ResultFromContext(r.Context())
		d := res.Layers[0].Decision
		fmt.Fprintf(w, "%d of %d left", d.Remaining, d.Limit)
	})

	for range 3 {
		req := httptest.NewRequest("GET", "/quota", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%d %q\n", w.Code, w.Body.String())
	}
	// Output:
	// 200 "1 of 2 left"
	// 200 "0 of 2 left"
	// 429 "Too Many Requests\n"
}
