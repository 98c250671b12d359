package echolimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/echolimit"
	"github.com/limitry/ratelimit/core"
)

// exampleClock makes the examples' output independent of the time they run.
func exampleClock() *core.FakeClock {
	return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// send serves method path from remoteAddr and prints the status, selected
// headers and the body.
func send(h http.Handler, method, path, remoteAddr string) {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remoteAddr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%s %-9s %d remaining=%q retry-after=%q %q\n", method, path, w.Code,
		w.Header().Get(ratelimit.HeaderRateLimitRemaining), w.Header().Get(ratelimit.HeaderRetryAfter), w.Body.String())
}

func hello(c echo.Context) error { return c.String(http.StatusOK, "hello "+c.Param("id")) }

// A per-client-IP limit for the whole server with e.Use.
func ExampleNew() {
	perIP, err := echolimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(), // r.RemoteAddr, never c.RealIP()
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock()))
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(perIP)
	e.GET("/hello", hello)

	send(e, "GET", "/hello", "192.0.2.1:1234")
	send(e, "GET", "/hello", "192.0.2.1:1234")
	send(e, "GET", "/hello", "192.0.2.1:1234")
	// Output:
	// GET /hello    200 remaining="1" retry-after="" "hello "
	// GET /hello    200 remaining="0" retry-after="" "hello "
	// GET /hello    429 remaining="0" retry-after="30" "Too Many Requests\n"
}

// A per-route, per-client limit: echo has routed the request before its
// middleware runs, so every /users/:id request of one client shares a quota,
// whatever the id.
func ExampleMiddleware() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule: core.Rule{Name: "per-route", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock())))
	e := echo.New()
	e.Use(echolimit.Middleware(l))
	e.GET("/users/:id", hello)
	e.GET("/posts/:id", hello)

	send(e, "GET", "/users/1", "192.0.2.1:1234")
	send(e, "GET", "/users/2", "192.0.2.1:1234")
	send(e, "GET", "/users/3", "192.0.2.1:1234")
	send(e, "GET", "/posts/1", "192.0.2.1:1234")
	// Output:
	// GET /users/1  200 remaining="1" retry-after="" "hello 1"
	// GET /users/2  200 remaining="0" retry-after="" "hello 2"
	// GET /users/3  429 remaining="0" retry-after="30" "Too Many Requests\n"
	// GET /posts/1  200 remaining="1" retry-after="" "hello 1"
}

// Skipper exempts health checks; HTTPError hands refusals to echo's
// HTTPErrorHandler as *echo.HTTPError, with the rate-limit headers kept.
func ExampleMiddlewareWithConfig() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock())))
	e := echo.New()
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if he, ok := err.(*echo.HTTPError); ok && he.Code == http.StatusTooManyRequests {
			_ = c.JSON(he.Code, map[string]string{"error": "slow down"})
			return
		}
		e.DefaultHTTPErrorHandler(err, c)
	}
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{
		Skipper:   func(c echo.Context) bool { return c.Path() == "/healthz" },
		HTTPError: true,
	}))
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	e.GET("/hello", hello)

	send(e, "GET", "/healthz", "192.0.2.1:1234")
	send(e, "GET", "/hello", "192.0.2.1:1234")
	send(e, "GET", "/hello", "192.0.2.1:1234")
	send(e, "GET", "/healthz", "192.0.2.1:1234")
	// Output:
	// GET /healthz  200 remaining="" retry-after="" "ok"
	// GET /hello    200 remaining="0" retry-after="" "hello "
	// GET /hello    429 remaining="0" retry-after="60" "{\"error\":\"slow down\"}\n"
	// GET /healthz  200 remaining="" retry-after="" "ok"
}

// RouteOf reports the route echo matches, as ratelimit.Route keys it, even in
// e.Pre middleware before echo has routed the request.
func ExampleRouteOf() {
	e := echo.New()
	e.Pre(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			fmt.Printf("%s %s -> %q\n", c.Request().Method, c.Request().URL.Path, echolimit.RouteOf(c))
			return next(c)
		}
	})
	e.POST("/login", func(echo.Context) error { return nil })
	e.Any("/any", func(echo.Context) error { return nil })
	for _, m := range [][2]string{{"POST", "/login"}, {"PUT", "/any"}, {"GET", "/login"}} {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(m[0], m[1], nil))
	}
	// Output:
	// POST /login -> "POST /login"
	// PUT /any -> "/any"
	// GET /login -> ""
}

// sendAs serves GET path from one address for an authenticated user ("-"
// for none), with the application's demo authentication reading the X-User
// header, and prints the status and body.
func sendAs(h http.Handler, path, user string) {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = "192.0.2.1:1234"
	if user != "-" {
		r.Header.Set("X-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%-5s %d %q\n", user, w.Code, w.Body.String())
}

// demoAuth stands for an application's authentication middleware: it
// stores the user with c.Set.
func demoAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if u := c.Request().Header.Get("X-User"); u != "" {
			c.Set("user", u)
		}
		return next(c)
	}
}

// Per-IP then per-user limits, with the user set by the application's own
// authentication middleware with c.Set. Anonymous requests skip the
// per-user layer (its IfNoKey) and count only against the per-IP one.
func ExampleGet() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 4, Window: time.Minute}},
		{Key: echolimit.Get("user"), Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))

	e := echo.New()
	e.Use(demoAuth, echolimit.Middleware(l)) // authenticate first
	e.GET("/hello", func(c echo.Context) error {
		u, _ := c.Get("user").(string)
		return c.String(http.StatusOK, "hello "+u)
	})

	sendAs(e, "/hello", "alice")
	sendAs(e, "/hello", "alice")
	sendAs(e, "/hello", "alice") // alice's quota is spent; nothing is charged
	sendAs(e, "/hello", "bob")
	sendAs(e, "/hello", "-")
	sendAs(e, "/hello", "-") // the address's quota is spent
	// Output:
	// alice 200 "hello alice"
	// alice 200 "hello alice"
	// alice 429 "Too Many Requests\n"
	// bob   200 "hello bob"
	// -     200 "hello "
	// -     429 "Too Many Requests\n"
}

// A key computed from the echo context: here the tenant of the account an
// authentication middleware stored, or no key (the layer is skipped) for
// anonymous requests.
func ExampleKey() {
	type account struct{ tenant string }
	perTenant := echolimit.Key(func(c echo.Context) (string, error) {
		if a, ok := c.Get("account").(*account); ok {
			return a.tenant, nil
		}
		return "", ratelimit.ErrNoKey
	})
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: perTenant, Rule: core.Rule{Name: "per-tenant", Limit: 1, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))

	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if c.Request().Header.Get("X-User") != "" {
				c.Set("account", &account{tenant: "acme"}) // every user of this demo works for acme
			}
			return next(c)
		}
	}, echolimit.Middleware(l))
	e.GET("/hello", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })

	sendAs(e, "/hello", "alice")
	sendAs(e, "/hello", "bob") // same tenant
	sendAs(e, "/hello", "-")
	// Output:
	// alice 200 "ok"
	// bob   429 "Too Many Requests\n"
	// -     200 "ok"
}

// With Config.Result the handler shows the client its quota, read from the
// request context.
func ExampleConfig_result() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))
	e := echo.New()
	e.Use(echolimit.MiddlewareWithConfig(l, echolimit.Config{Result: true}))
	e.GET("/quota", func(c echo.Context) error {
		res, _ := ratelimit.ResultFromContext(c.Request().Context())
		d := res.Layers[0].Decision
		return c.String(http.StatusOK, fmt.Sprintf("%d of %d left", d.Remaining, d.Limit))
	})

	send(e, "GET", "/quota", "192.0.2.1:1234")
	send(e, "GET", "/quota", "192.0.2.1:1234")
	// Output:
	// GET /quota    200 remaining="1" retry-after="" "1 of 2 left"
	// GET /quota    200 remaining="0" retry-after="" "0 of 2 left"
}
