package ginlimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/ginlimit"
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

func hello(c *gin.Context) { c.String(http.StatusOK, "hello "+c.Param("id")) }

// A per-client-IP limit for the whole router with router.Use.
func ExampleNew() {
	gin.SetMode(gin.ReleaseMode)
	perIP, err := ginlimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(), // r.RemoteAddr, never c.ClientIP()
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock()))
	if err != nil {
		panic(err)
	}
	r := gin.New()
	r.Use(perIP)
	r.GET("/hello", hello)

	send(r, "GET", "/hello", "192.0.2.1:1234")
	send(r, "GET", "/hello", "192.0.2.1:1234")
	send(r, "GET", "/hello", "192.0.2.1:1234")
	// Output:
	// GET /hello    200 remaining="1" retry-after="" "hello "
	// GET /hello    200 remaining="0" retry-after="" "hello "
	// GET /hello    429 remaining="0" retry-after="30" "Too Many Requests\n"
}

// A per-route, per-client limit on one route group: every /api/users/:id
// request of one client shares a quota, whatever the id.
func ExampleMiddleware() {
	gin.SetMode(gin.ReleaseMode)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()),
		Rule: core.Rule{Name: "per-route", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(exampleClock())))
	r := gin.New()
	api := r.Group("/api", ginlimit.Middleware(l))
	api.GET("/users/:id", hello)
	api.GET("/posts/:id", hello)

	send(r, "GET", "/api/users/1", "192.0.2.1:1234")
	send(r, "GET", "/api/users/2", "192.0.2.1:1234")
	send(r, "GET", "/api/users/3", "192.0.2.1:1234")
	send(r, "GET", "/api/posts/1", "192.0.2.1:1234")
	// Output:
	// GET /api/users/1 200 remaining="1" retry-after="" "hello 1"
	// GET /api/users/2 200 remaining="0" retry-after="" "hello 2"
	// GET /api/users/3 429 remaining="0" retry-after="30" "Too Many Requests\n"
	// GET /api/posts/1 200 remaining="1" retry-after="" "hello 1"
}

// One Limiter for the whole router: a per-IP limit everywhere and a login
// limit for the login route, registered with Any. MiddlewareFor knows the
// engine's routes, so the login limit is one quota whatever the method.
func ExampleMiddlewareFor() {
	gin.SetMode(gin.ReleaseMode)
	ip := ratelimit.MustClientIP()
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ip, Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.Rule{Name: "login", Limit: 1, Window: time.Minute},
			Routes: []string{"/login"}},
	}, ratelimit.WithClock(exampleClock())))
	r := gin.New()
	r.Use(ginlimit.MiddlewareFor(r, l))
	r.Any("/login", hello)

	send(r, "POST", "/login", "192.0.2.1:1234")
	send(r, "PUT", "/login", "192.0.2.1:1234")
	// Output:
	// POST /login    200 remaining="0" retry-after="" "hello "
	// PUT /login    429 remaining="0" retry-after="60" "Too Many Requests\n"
}

// sendAs is send for an authenticated user (empty for none), with the
// application's demo authentication reading the X-User header.
func sendAs(h http.Handler, path, user string) {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = "192.0.2.1:1234"
	if user != "" {
		r.Header.Set("X-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if user == "" {
		user = "-"
	}
	fmt.Printf("%-5s %d %q\n", user, w.Code, w.Body.String())
}

// Per-IP then per-user limits, with the user set by the application's own
// authentication handler with c.Set. Anonymous requests skip the per-user
// layer (its IfNoKey) and count only against the per-IP one.
func ExampleGet() {
	gin.SetMode(gin.ReleaseMode)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 4, Window: time.Minute}},
		{Key: ginlimit.Get("user"), Rule: core.Rule{Name: "per-user", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))

	auth := func(c *gin.Context) { // stands for real authentication
		if u := c.GetHeader("X-User"); u != "" {
			c.Set("user", u)
		}
	}
	r := gin.New()
	r.Use(auth, ginlimit.Middleware(l))
	r.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello "+c.GetString("user")) })

	sendAs(r, "/hello", "alice")
	sendAs(r, "/hello", "alice")
	sendAs(r, "/hello", "alice") // alice's quota is spent; nothing is charged
	sendAs(r, "/hello", "bob")
	sendAs(r, "/hello", "")
	sendAs(r, "/hello", "") // the address's quota is spent
	// Output:
	// alice 200 "hello alice"
	// alice 200 "hello alice"
	// alice 429 "Too Many Requests\n"
	// bob   200 "hello bob"
	// -     200 "hello "
	// -     429 "Too Many Requests\n"
}

// A key computed from the gin context: here the tenant an authentication
// handler stored, or no key (the layer is skipped) for anonymous requests.
func ExampleKey() {
	gin.SetMode(gin.ReleaseMode)
	type account struct{ tenant string }
	perTenant := ginlimit.Key(func(c *gin.Context) (string, error) {
		if a, ok := c.MustGet("account").(*account); ok && a != nil {
			return a.tenant, nil
		}
		return "", ratelimit.ErrNoKey
	})
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: perTenant, Rule: core.Rule{Name: "per-tenant", Limit: 1, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))

	r := gin.New()
	r.Use(func(c *gin.Context) {
		var a *account
		if u := c.GetHeader("X-User"); u != "" {
			a = &account{tenant: "acme"} // every user of this demo works for acme
		}
		c.Set("account", a)
	}, ginlimit.Middleware(l))
	r.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "ok") })

	sendAs(r, "/hello", "alice")
	sendAs(r, "/hello", "bob") // same tenant
	sendAs(r, "/hello", "")
	// Output:
	// alice 200 "ok"
	// bob   429 "Too Many Requests\n"
	// -     200 "ok"
}

// The handler shows the client its quota, read from the request context.
func ExampleWithResult() {
	gin.SetMode(gin.ReleaseMode)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute}},
	}, ratelimit.WithClock(exampleClock())))
	r := gin.New()
	r.Use(ginlimit.Middleware(l, ginlimit.WithResult()))
	r.GET("/quota", func(c *gin.Context) {
		res, _ := ratelimit.ResultFromContext(c.Request.Context())
		d := res.Layers[0].Decision
		c.String(http.StatusOK, "%d of %d left", d.Remaining, d.Limit)
	})

	send(r, "GET", "/quota", "192.0.2.1:1234")
	send(r, "GET", "/quota", "192.0.2.1:1234")
	// Output:
	// GET /quota    200 remaining="1" retry-after="" "1 of 2 left"
	// GET /quota    200 remaining="0" retry-after="" "0 of 2 left"
}
