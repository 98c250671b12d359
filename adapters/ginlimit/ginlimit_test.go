package ginlimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/ginlimit"
	"github.com/limitry/ratelimit/core"
)

func init() { gin.SetMode(gin.TestMode) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// keys records the key of every decision, per rule.
type keys struct {
	core.NopObserver
	mu   sync.Mutex
	seen []string // "rule=key"
}

func (k *keys) ObserveDecision(ev core.DecisionEvent) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seen = append(k.seen, ev.Decision.Policy.Name()+"="+ev.Key)
}

func (k *keys) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.seen)
}

// limiter builds a Limiter on a fake clock, reporting keys to obs.
func limiter(t *testing.T, clk *core.FakeClock, obs *keys, layers []ratelimit.Layer, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithClock(clk), ratelimit.WithObserver(obs)}, opts...)
	l, err := ratelimit.New(layers, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func perIP(limit int64) []ratelimit.Layer {
	return []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: limit, Window: time.Minute},
	}}
}

// do sends method path from remoteAddr, with extra request headers given as
// name, value pairs.
func do(h http.Handler, method, path, remoteAddr string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func ok(c *gin.Context) { c.String(http.StatusOK, "ok\n") }

const peer = "192.0.2.1:1234"

func TestHeadersAnd429(t *testing.T) {
	clk := core.NewFakeClock(t0)
	l := limiter(t, clk, &keys{}, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithHeaders(ratelimit.AllHeaders))
	r := gin.New()
	r.Use(ginlimit.Middleware(l))
	r.GET("/hello", ok)

	for i := range 5 {
		w := do(r, "GET", "/hello", peer)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i+1, w.Code)
		}
		h := w.Header()
		if got, want := h.Get(ratelimit.HeaderRateLimitLimit), "5"; got != want {
			t.Errorf("request %d: X-RateLimit-Limit %q, want %q", i+1, got, want)
		}
		if got, want := h.Get(ratelimit.HeaderRateLimitRemaining), strconv.Itoa(4-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want %q", i+1, got, want)
		}
		if got, want := h.Get(ratelimit.HeaderRateLimitPolicy), `"per-ip";q=5;w=10`; got != want {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, want)
		}
	}
	w := do(r, "GET", "/hello", peer)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: status %d, want 429", w.Code)
	}
	if got := w.Header().Get(ratelimit.HeaderRetryAfter); got != "2" {
		t.Errorf("Retry-After %q, want \"2\"", got)
	}
	if got := w.Body.String(); got != "Too Many Requests\n" {
		t.Errorf("body %q", got)
	}
	clk.Advance(2 * time.Second)
	if w := do(r, "GET", "/hello", peer); w.Code != http.StatusOK {
		t.Errorf("after Retry-After: status %d, want 200", w.Code)
	}
}

// A refused request aborts the chain: no later handler runs, and handlers
// before the limiter see the limiter's status and the aborted context.
func TestAbort(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1))
	var served int
	var after []string
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		after = append(after, strconv.Itoa(c.Writer.Status())+" aborted="+strconv.FormatBool(c.IsAborted()))
	})
	r.GET("/hello", ginlimit.Middleware(l), func(c *gin.Context) { served++ }, ok)
	do(r, "GET", "/hello", peer)
	do(r, "GET", "/hello", peer)
	if served != 1 {
		t.Errorf("handler ran %d times, want 1", served)
	}
	if want := []string{"200 aborted=false", "429 aborted=true"}; !slices.Equal(after, want) {
		t.Errorf("outer middleware saw %q, want %q", after, want)
	}
}

func TestRouteKey(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{{
		Key:  ratelimit.Route(),
		Rule: core.Rule{Name: "per-route", Limit: 2, Window: time.Minute},
	}})
	r := gin.New()
	r.Use(ginlimit.Middleware(l)) // gin routes before running any handler
	r.GET("/users/:id", ok)
	g := r.Group("/api")
	g.GET("/items/:id", ok)

	steps := []struct {
		path string
		want int
	}{
		{"/users/1", 200},
		{"/users/2", 200},
		{"/users/3", 429}, // same route, other id: same quota
		{"/api/items/1", 200},
		{"/nowhere", 404}, // no route: the route layer does not apply
	}
	for _, s := range steps {
		if w := do(r, "GET", s.path, peer); w.Code != s.want {
			t.Errorf("GET %s: status %d, want %d", s.path, w.Code, s.want)
		}
	}
	want := []string{
		"per-route=GET /users/:id", "per-route=GET /users/:id", "per-route=GET /users/:id",
		"per-route=GET /api/items/:id",
	}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// TestTopLevelOneBatch checks that one Limiter in router.Use holds a per-IP
// layer and a login-only route layer, and that a login refused by the route
// layer charges the per-IP layer nothing.
func TestTopLevelOneBatch(t *testing.T) {
	ip := ratelimit.MustClientIP()
	l := limiter(t, core.NewFakeClock(t0), &keys{}, []ratelimit.Layer{
		{Key: ip, Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.Rule{Name: "login", Limit: 2, Window: time.Minute}, Routes: []string{"POST /login"}},
	})
	r := gin.New()
	r.Use(ginlimit.Middleware(l))
	r.POST("/login", ok)
	r.GET("/hello", ok)
	for i, want := range []int{200, 200, 429, 429, 429} {
		if w := do(r, "POST", "/login", peer); w.Code != want {
			t.Fatalf("login %d: status %d, want %d", i+1, w.Code, want)
		}
	}
	for i, want := range []int{200, 200, 200, 429} {
		if w := do(r, "GET", "/hello", peer); w.Code != want {
			t.Fatalf("hello %d: status %d, want %d", i+1, w.Code, want)
		}
	}
}

// TestRouteMethodCannotDodge checks that with MiddlewareFor a route
// registered with Any gives every method one quota, that with Middleware the
// keys stay bounded (one per registered method), and that methods and paths
// no route serves are not route keys.
func TestRouteMethodCannotDodge(t *testing.T) {
	for _, withEngine := range []bool{true, false} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
			{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "route", Limit: 2, Window: time.Minute}},
		})
		r := gin.New()
		if withEngine {
			r.Use(ginlimit.MiddlewareFor(r, l))
		} else {
			r.Use(ginlimit.Middleware(l))
		}
		r.Any("/login", ok)
		r.GET("/x", ok)
		var codes []int
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "GET"} {
			codes = append(codes, do(r, m, "/login", peer).Code)
		}
		want := []int{200, 200, 429, 429, 429}
		if !withEngine {
			want = []int{200, 200, 200, 200, 200} // one key per method
		}
		if !slices.Equal(codes, want) {
			t.Errorf("engine %v: /login by method: %v, want %v", withEngine, codes, want)
		}
		for _, m := range []string{"X1", "post", "HEAD"} {
			do(r, m, "/login", peer)
			do(r, m, "/x", peer)
		}
		do(r, "GET", "/nope", peer)
		seen := map[string]bool{}
		for _, k := range obs.list() {
			seen[k] = true
		}
		wantKeys := 1
		if !withEngine {
			wantKeys = 6 // POST PUT DELETE PATCH GET HEAD
		}
		if len(seen) != wantKeys {
			t.Errorf("engine %v: route keys %v, want %d", withEngine, seen, wantKeys)
		}
	}
}

func TestSkip(t *testing.T) {
	l := limiter(t, core.NewFakeClock(t0), &keys{}, perIP(1),
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	r := gin.New()
	r.Use(ginlimit.Middleware(l))
	r.GET("/healthz", ok)
	r.GET("/hello", ok)
	for i := range 3 {
		w := do(r, "GET", "/healthz", peer)
		if w.Code != 200 || w.Header().Get(ratelimit.HeaderRateLimitLimit) != "" {
			t.Fatalf("healthz %d: status %d, headers %v", i+1, w.Code, w.Header())
		}
	}
	if got := []int{do(r, "GET", "/hello", peer).Code, do(r, "GET", "/hello", peer).Code}; !slices.Equal(got, []int{200, 429}) {
		t.Errorf("/hello statuses %v, want [200 429]", got)
	}
}

// Two layers in one limiter: a request the login layer refuses charges the
// per-IP layer nothing.
func TestLayering(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 3, Window: time.Minute}},
		{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "login", Limit: 1, Window: time.Minute}},
	}, ratelimit.WithHeaders(ratelimit.IETFHeaders))
	r := gin.New()
	r.POST("/login", ginlimit.Middleware(l), ok)

	steps := []struct {
		want      int
		rateLimit string
	}{
		{200, `"per-ip";r=2;t=20, "login";r=0;t=60`},
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`}, // per-ip not charged
		{429, `"per-ip";r=2;t=20, "login";r=0;t=60`},
	}
	for i, s := range steps {
		w := do(r, "POST", "/login", peer)
		if w.Code != s.want {
			t.Errorf("request %d: status %d, want %d", i+1, w.Code, s.want)
		}
		if got := w.Header().Get(ratelimit.HeaderRateLimit); got != s.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i+1, got, s.rateLimit)
		}
	}
	if got := obs.list(); got[1] != "login=11:POST /login9:192.0.2.1" {
		t.Errorf("login key %q", got[1])
	}
}

// A forged X-Forwarded-For from a peer that is not a trusted proxy changes
// neither the key nor whose quota is charged, although gin's own
// c.ClientIP() believes it by default.
func TestForgedForwardedForIgnored(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, perIP(2))
	r := gin.New()
	var clientIPs []string
	r.Use(func(c *gin.Context) { clientIPs = append(clientIPs, c.ClientIP()) })
	r.Use(ginlimit.Middleware(l))
	r.GET("/hello", ok)

	forged := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"}
	for i, xff := range forged {
		w := do(r, "GET", "/hello", peer, "X-Forwarded-For", xff, "X-Real-IP", xff)
		if want := []int{200, 200, 429}[i]; w.Code != want {
			t.Errorf("request %d (XFF %s): status %d, want %d", i+1, xff, w.Code, want)
		}
	}
	if !slices.Equal(clientIPs, forged) { // the premise of the package doc
		t.Errorf("c.ClientIP() gave %q, want the forged %q (gin trusts every proxy by default)", clientIPs, forged)
	}
	want := []string{"per-ip=192.0.2.1", "per-ip=192.0.2.1", "per-ip=192.0.2.1"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestNew(t *testing.T) {
	if _, err := ginlimit.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	mw, err := ginlimit.New(perIP(1), ratelimit.WithClock(core.NewFakeClock(t0)))
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.Use(mw)
	r.GET("/", ok)
	if got := []int{do(r, "GET", "/", peer).Code, do(r, "GET", "/", peer).Code}; !slices.Equal(got, []int{200, 429}) {
		t.Errorf("statuses %v, want [200 429]", got)
	}
}

func TestMiddlewareNilLimiterPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	ginlimit.Middleware(nil)
}

// New returns an error, as its doc says, for a Limiter the middleware
// refuses (one refunding by response status), where Middleware panics.
func TestNewRefusesRefundByStatus(t *testing.T) {
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("ginlimit.New panicked: %v; want an error", p)
		}
	}()
	mw, err := ginlimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "login", Limit: 5, Window: time.Hour},
	}}, ratelimit.WithRefund(ratelimit.RefundSuccessful))
	if !errors.Is(err, ratelimit.ErrConfig) || mw != nil {
		t.Fatalf("New with WithRefund: middleware %v, error %v; want an ErrConfig", mw != nil, err)
	}
}

// TestRouteKeyMethodRewrittenBeforeLimiter: gin routes before any handler
// runs, so a method override in r.Use before the limiter changes the
// request's method but not the route gin serves. MiddlewareFor keys the
// request by the method of the route whose handler gin serves, never by one
// the client picked: a layer limited to "POST /login" still applies.
func TestRouteKeyMethodRewrittenBeforeLimiter(t *testing.T) {
	override := func(c *gin.Context) {
		if m := c.GetHeader("X-HTTP-Method-Override"); m != "" {
			c.Request.Method = m
		}
	}
	for _, tc := range []struct {
		name      string
		routes    func(r *gin.Engine)
		overrides []string
		wantKey   string
		want      []int
	}{
		{"unrouted methods", func(r *gin.Engine) { r.POST("/login", ok) },
			[]string{"M0", "M1", "M2"}, "POST /login", []int{200, 429, 429}},
		{"a method routed apart", func(r *gin.Engine) {
			r.GET("/login", func(c *gin.Context) { c.String(http.StatusOK, "form\n") })
			r.POST("/login", ok)
		}, []string{"GET", "DELETE", "GET"}, "POST /login", []int{200, 429, 429}},
	} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
			{Key: ratelimit.Route(), Rule: core.Rule{Name: "route", Limit: 10, Window: time.Minute}},
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "login", Limit: 1, Window: time.Minute}, Routes: []string{"POST /login"}},
		})
		r := gin.New()
		r.Use(override, ginlimit.MiddlewareFor(r, l))
		tc.routes(r)
		var codes []int
		for _, m := range tc.overrides {
			codes = append(codes, do(r, "POST", "/login", peer, "X-HTTP-Method-Override", m).Code)
		}
		if !slices.Equal(codes, tc.want) {
			t.Errorf("%s: statuses %v, want %v; keys %q", tc.name, codes, tc.want, obs.list())
		}
		for _, k := range obs.list() {
			if k != "route="+tc.wantKey && k != "login=192.0.2.1" {
				t.Errorf("%s: key %q, want route=%q or the client's address", tc.name, k, tc.wantKey)
			}
		}
	}

	// One handler for two methods: the handler sees the method the client
	// chose and serves it as that method's route would, so the request is
	// keyed so.
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.Route(), Rule: core.Rule{Name: "route", Limit: 10, Window: time.Minute}},
	})
	r := gin.New()
	r.Use(override, ginlimit.MiddlewareFor(r, l))
	r.Match([]string{"GET", "POST"}, "/both", ok)
	do(r, "POST", "/both", peer, "X-HTTP-Method-Override", "GET")
	do(r, "POST", "/both", peer, "X-HTTP-Method-Override", "X9")
	if got, want := obs.list(), []string{"route=GET /both", "route=POST /both"}; !slices.Equal(got, want) {
		t.Errorf("shared handler: keys %q, want %q", got, want)
	}
}

// TestRouteKeyOverrideSharedHandler: one handler for GET and HEAD, limited
// as a whole by a layer naming both routes. An override before the limiter
// to a method neither serves keys the request by the first of the two
// routes registered, never by the path alone, so the layer applies.
func TestRouteKeyOverrideSharedHandler(t *testing.T) {
	obs := &keys{}
	l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "report", Limit: 1, Window: time.Minute},
			Routes: []string{"GET /report", "HEAD /report"}},
	})
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if m := c.GetHeader("X-HTTP-Method-Override"); m != "" {
			c.Request.Method = m
		}
	}, ginlimit.MiddlewareFor(r, l))
	r.Match([]string{http.MethodGet, http.MethodHead}, "/report", ok)
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "GET", "/report", peer, "X-HTTP-Method-Override", "X9").Code)
	}
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("GET /report (override X9) x3: statuses %v, want %v; keys %q", codes, want, obs.list())
	}
}

// TestRouteKeyRouteAddedAfterFirstRequest: MiddlewareFor remembers the
// routes at a path from its first request there; a route registered at the
// path later is read when it is first served, with its own handler or
// with one a route there already has, and its layer applies.
func TestRouteKeyRouteAddedAfterFirstRequest(t *testing.T) {
	for _, shared := range []bool{false, true} {
		obs := &keys{}
		l := limiter(t, core.NewFakeClock(t0), obs, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "post", Limit: 1, Window: time.Minute},
				Routes: []string{"POST /x"}},
		})
		r := gin.New()
		r.Use(ginlimit.MiddlewareFor(r, l))
		r.GET("/x", ok)
		do(r, "GET", "/x", peer)
		if shared { // the GET route's handler
			r.POST("/x", ok)
		} else {
			r.POST("/x", func(c *gin.Context) { c.String(http.StatusOK, "posted\n") })
		}
		var codes []int
		for range 3 {
			codes = append(codes, do(r, "POST", "/x", peer).Code)
		}
		if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
			t.Errorf("handler shared %v: POST /x x3: statuses %v, want %v; keys %q", shared, codes, want, obs.list())
		}
	}
}

// TestRouteKeyRereadsBounded: requests that put a path's remembered routes
// in doubt (a method override to a method another route at the path has)
// make engine.Routes run again at most once per waiting period, which
// doubles while the rereads find nothing new: between two of them such a
// request costs what any other does.
func TestRouteKeyRereadsBounded(t *testing.T) {
	clk := core.NewFakeClock(t0)
	defer ginlimit.SetNow(clk.Now)()
	l := limiter(t, clk, &keys{}, []ratelimit.Layer{
		{Key: ratelimit.Composite(ratelimit.Route(), ratelimit.MustClientIP()), Rule: core.Rule{Name: "route", Limit: 1 << 40, Window: time.Minute}},
	})
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if m := c.GetHeader("X-HTTP-Method-Override"); m != "" {
			c.Request.Method = m
		}
	}, ginlimit.MiddlewareFor(r, l))
	r.GET("/login", func(c *gin.Context) { c.String(http.StatusOK, "form\n") })
	r.POST("/login", ok)
	for i := range 500 { // what a reread walks
		r.GET(fmt.Sprintf("/r%d", i), ok)
	}
	serve := func(override string) func() {
		return func() {
			req := httptest.NewRequest("POST", "/login", nil) // the override rewrites it
			req.RemoteAddr = peer
			if override != "" {
				req.Header.Set("X-HTTP-Method-Override", override)
			}
			r.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	serve("GET")() // the first read and a first reread, which finds nothing new
	serve("GET")()
	base := testing.AllocsPerRun(200, serve(""))
	if got := testing.AllocsPerRun(200, serve("GET")); got > base+5 {
		t.Fatalf("an overridden request allocates %v, a plain one %v: the routes are read on every request", got, base)
	}
}

// TestRouteKeyLateRouteAfterDoubt: a request that puts a path's routes in
// doubt before a route is registered there (an override to PUT while only
// GET exists) delays the reread, but the PUT route registered later, with
// the GET route's handler, is keyed by its own method within a second.
func TestRouteKeyLateRouteAfterDoubt(t *testing.T) {
	clk := core.NewFakeClock(t0)
	defer ginlimit.SetNow(clk.Now)()
	obs := &keys{}
	l := limiter(t, clk, obs, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "put", Limit: 1, Window: time.Hour}, Routes: []string{"PUT /x"}},
	})
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if m := c.GetHeader("X-HTTP-Method-Override"); m != "" {
			c.Request.Method = m
		}
	}, ginlimit.MiddlewareFor(r, l))
	r.GET("/x", ok)
	do(r, "GET", "/x", peer)
	do(r, "GET", "/x", peer, "X-HTTP-Method-Override", "PUT")
	r.PUT("/x", ok)
	clk.Advance(time.Second)
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "PUT", "/x", peer).Code)
	}
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("PUT /x x3 a second after it was registered: statuses %v, want %v; keys %q", codes, want, obs.list())
	}
}

// TestRouteKeyLateRouteOfOtherMethod: a route of a method gin's Any does
// not register (PROPFIND), registered after serving began with the handler
// of a route already served at its path, is keyed by its own method within
// a second.
func TestRouteKeyLateRouteOfOtherMethod(t *testing.T) {
	clk := core.NewFakeClock(t0)
	defer ginlimit.SetNow(clk.Now)()
	obs := &keys{}
	l := limiter(t, clk, obs, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "propfind", Limit: 1, Window: time.Hour}, Routes: []string{"PROPFIND /dav"}},
	})
	r := gin.New()
	r.Use(ginlimit.MiddlewareFor(r, l))
	r.GET("/dav", ok)
	do(r, "GET", "/dav", peer)
	r.Handle("PROPFIND", "/dav", ok)
	clk.Advance(time.Second)
	var codes []int
	for range 3 {
		codes = append(codes, do(r, "PROPFIND", "/dav", peer).Code)
	}
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("PROPFIND /dav x3 a second after it was registered: statuses %v, want %v; keys %q", codes, want, obs.list())
	}
}
