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
