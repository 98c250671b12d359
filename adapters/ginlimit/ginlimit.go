// Package ginlimit adapts a [ratelimit.Limiter] to the gin web framework
// (github.com/gin-gonic/gin) as a [gin.HandlerFunc].
//
// The middleware decides each request with the Limiter, which sets the
// rate-limit headers on c.Writer and, for a request it refuses, writes the
// response itself (429 with Retry-After, or the response chosen with
// [ratelimit.WithDeniedHandler] or [ratelimit.WithProblemDetails]); the
// middleware then calls c.Abort, so no later handler runs. An admitted
// request continues with c.Next.
//
// Before deciding, the middleware stores the route gin matched with
// [ratelimit.WithRoute], so that [ratelimit.Route] keys a request by its
// route ("GET /users/:id") rather than its URL, and [ratelimit.Layer] Routes
// can limit a layer to some routes. Gin routes a request before running any
// of its handlers, so the route is known in router.Use, group and per-route
// middleware alike, and one Limiter in router.Use can hold per-IP, per-user
// and per-route layers in one atomic batch. A request no route matches (the
// NoRoute handlers, 404 or 405) is not keyed by route: route layers do not
// apply to it, and gin only matches a method a route was registered for, so
// the number of route keys is bounded by the routes (with [MiddlewareFor]
// also behind a method override, which [Middleware] keys by the method it
// finds: see below).
//
// A route registered with router.Any serves nine methods; with [Middleware]
// each is keyed apart ("GET /login", "POST /login", ...). [MiddlewareFor]
// knows the engine's routes and keys such a route by its path alone
// ("/login"), so that changing the method never buys a fresh quota.
//
// A handler before the middleware that rewrites the method (a method
// override in router.Use) runs after gin has routed the request, so the
// route gin serves is that of the method the request came with.
// [MiddlewareFor] keys such a request by the method of the route whose
// handler gin is serving (the rewritten method when its route shares that
// handler; among several others that do, POST, or else the first that
// engine.Routes lists), never by one the client picked, so a layer whose
// Routes name "POST /login" still applies. A route registered after
// serving began is keyed by its own method within a second.
// [Middleware] does not know the routes and keys it by the rewritten
// method: with a method override before the limiter, use MiddlewareFor, or
// put the override after it.
//
// engine.HandleContext runs the whole chain again for the request it
// forwards, so the forwarded request is decided, and charged, again (under
// the route it is forwarded to): forwarding never skips a limit, and costs
// a client two units, and two in-flight slots of a concurrency layer keyed
// alike in both passes (per client, not per route: the forwarding pass
// holds its slot while the forwarded one is decided, so such an InFlight of
// 1 refuses every forwarded request). Gin answers its own redirects (RedirectTrailingSlash,
// RedirectFixedPath) without running any middleware: they are not charged;
// the request a client then sends to the new path is.
//
// # Client IP
//
// Keys come from the Limiter's layers, such as [ratelimit.ClientIP], which
// reads r.RemoteAddr and trusts forwarded headers only from the proxies it is
// configured with. This package never keys by c.ClientIP(): gin trusts
// X-Forwarded-For and X-Real-IP from every peer unless SetTrustedProxies is
// called, so a client could pick its own key. Gin's trusted-proxy settings
// have no effect on the limiter's keys; configure [ratelimit.TrustedProxies]
// instead.
//
// # Keys from the gin context
//
// An authentication handler in gin keeps the user in the context with
// c.Set. [Key] and [Get] turn what the *gin.Context holds into a
// [ratelimit.KeyFunc], so a per-user layer beside a per-IP one needs no
// change to the request's context:
//
//	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
//		{Key: ratelimit.MustClientIP(), Rule: perIP},
//		{Key: ginlimit.Get("user"), Rule: perUser}, // skipped for anonymous requests
//	}))
//	r.Use(auth, ginlimit.Middleware(l)) // auth calls c.Set("user", id)
//
// # The decision in the handler
//
// With [WithResult] the handlers read the decision of their request with
// [ratelimit.ResultFromContext](c.Request.Context()).
package ginlimit

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/internal/frameworkctx"
)

// Middleware returns a gin handler that decides every request with l (see
// [ratelimit.Limiter.Admit]): it calls c.Next for the requests l admits and
// c.Abort, after l has written the response, for the others. Use it with
// router.Use, group.Use or in a route's handler list. It panics if l is nil
// or an option is nil.
func Middleware(l *ratelimit.Limiter, opts ...Option) gin.HandlerFunc {
	return middleware(nil, l, opts)
}

// Option configures the middleware.
type Option func(*options)

type options struct {
	result bool
}

// WithResult makes the middleware store the decision of every request it
// admits in c.Request's context, where the handlers read it with
// [ratelimit.ResultFromContext](c.Request.Context()), for instance to show
// the remaining quota in a response body; c.Request is then a shallow copy
// of the request gin received. It costs two allocations per request, three
// for more than two layers (see
// [ratelimit.Limiter.AdmitWithResult]); without it, no Result is stored.
func WithResult() Option { return func(o *options) { o.result = true } }

// MiddlewareFor is [Middleware] for the routes of engine: a route
// registered for every method gin's Any registers is keyed by its path
// alone, so a client cannot multiply a route's quota by changing the method.
// A path registered for some methods only (gin's Match, or GET and POST
// apart) keeps a route, and a quota, per method; to limit it as a whole,
// give it a layer whose Routes name each of those routes and whose key
// leaves the route out (ratelimit.ClientIP alone, say). A request whose
// method a handler before this one rewrote is keyed by the method of the
// route gin serves (see the package documentation). Register the routes
// before serving (as gin requires). It panics if engine
// or l is nil, an option is nil, or l refunds by response status
// (ratelimit.WithRefund: refund with Limiter.Refund on the Result instead).
func MiddlewareFor(engine *gin.Engine, l *ratelimit.Limiter, opts ...Option) gin.HandlerFunc {
	if engine == nil {
		panic("ginlimit: nil *gin.Engine")
	}
	return middleware(&anyRoutes{engine: engine}, l, opts)
}

func middleware(ar *anyRoutes, l *ratelimit.Limiter, opts []Option) gin.HandlerFunc {
	if l == nil {
		panic("ginlimit: nil *ratelimit.Limiter")
	}
	if l.RefundsByStatus() {
		panic(errRefundsByStatus)
	}
	var o options
	for _, opt := range opts {
		if opt == nil {
			panic("ginlimit: nil Option")
		}
		opt(&o)
	}
	return func(c *gin.Context) {
		r := c.Request
		route := c.FullPath()
		if route != "" {
			if ar == nil {
				route = r.Method + " " + route
			} else if m := ar.method(route, r.Method, c.Handler()); m != "" {
				route = m + " " + route
			}
		}
		kc := frameworkctx.New(ratelimit.WithRoute(r.Context(), route), c)
		r = r.WithContext(kc)
		var (
			admitted bool
			done     func()
		)
		if o.result {
			r, admitted, done = l.AdmitWithResultFunc(c.Writer, r)
		} else {
			admitted, done = l.AdmitFunc(c.Writer, r)
		}
		kc.Clear() // gin reuses c once the request is served
		// done gives back in-flight slots (Layer.InFlight) once the rest of
		// the chain has run, a panic included.
		defer done()
		if !admitted {
			c.Abort()
			return
		}
		if o.result {
			c.Request = r
		}
		c.Next()
	}
}

// anyMethods are the methods gin's Any registers.
var anyMethods = []string{
	http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodHead, http.MethodOptions, http.MethodDelete, http.MethodConnect,
	http.MethodTrace,
}

// anyRoutes remembers the routes of an engine, by path, as they were when
// engine.Routes was last read.
type anyRoutes struct {
	engine *gin.Engine
	snap   atomic.Pointer[routeSnap]
	mu     sync.Mutex // held while reading engine.Routes
}

// routeSnap is one reading of an engine's routes: the routes at each path,
// their number, and when they may be read again (next), after waiting wait
// since this reading.
type routeSnap struct {
	paths map[string]*pathRoutes
	count int
	next  time.Time
	wait  time.Duration
}

// pathRoutes are the routes registered at one path: each method's handler
// (the last of its chain, the one c.Handler returns), and whether every
// method gin's Any registers has one.
type pathRoutes struct {
	any      bool
	methods  []string
	handlers []gin.HandlerFunc
}

// Reading the routes again for a request that puts them in doubt waits
// from minReread, doubling while readings find no new route, up to
// maxReread: clients sending such requests, at any paths, make
// engine.Routes run about once a second, and a route registered after
// serving began is keyed by its own method within maxReread.
const (
	minReread = time.Millisecond
	maxReread = time.Second
)

// now is the clock of the readings (a variable for tests).
var now = time.Now

// method returns the method a request at path, of method and served by h,
// is keyed by, "" for the path alone (see pathRoutes.served). A request
// puts the remembered routes in doubt when no route at path holds h, or
// when h's route there is not of the request's method (a method override,
// or a route registered after the routes were read); they are then read
// again, at most as often as routeSnap allows.
func (a *anyRoutes) method(path, method string, h gin.HandlerFunc) string {
	snap := a.snap.Load()
	if snap == nil {
		snap = a.read(nil, now())
	}
	pr := snap.paths[path]
	m, ok := pr.served(method, h)
	if ok && (pr.any || m == method) {
		return m
	}
	if t := now(); !t.Before(snap.next) {
		pr = a.read(snap, t).paths[path]
		m, ok = pr.served(method, h)
	}
	if !ok {
		return method // served by no route at path: not met with gin's own routing
	}
	return m
}

// read reads the engine's routes, unless another caller is reading them or
// has read them since last (then it returns that reading), and returns the
// reading it stores.
func (a *anyRoutes) read(last *routeSnap, t time.Time) *routeSnap {
	if !a.mu.TryLock() {
		if cur := a.snap.Load(); cur != nil {
			return cur
		}
		a.mu.Lock()
	}
	defer a.mu.Unlock()
	if cur := a.snap.Load(); cur != last {
		return cur
	}
	routes := a.engine.Routes()
	snap := &routeSnap{paths: make(map[string]*pathRoutes), count: len(routes)}
	for _, ri := range routes {
		pr := snap.paths[ri.Path]
		if pr == nil {
			pr = &pathRoutes{}
			snap.paths[ri.Path] = pr
		}
		pr.methods = append(pr.methods, ri.Method)
		pr.handlers = append(pr.handlers, ri.HandlerFunc)
	}
	for _, pr := range snap.paths {
		pr.any = true
		for _, m := range anyMethods {
			pr.any = pr.any && slices.Contains(pr.methods, m)
		}
	}
	if last != nil && last.count == snap.count {
		snap.wait = min(max(2*last.wait, minReread), maxReread) // nothing new
		snap.next = t.Add(snap.wait)
	}
	a.snap.Store(snap)
	return snap
}

// served returns the method a request at this path is keyed by, "" for
// the path alone, and whether a route here holds h, the handler gin is
// serving: "" for a route of every method; else the request's method when
// its route here holds h; else the method whose route holds h, since gin
// routed by the method the request had then and a middleware before this
// one (a method override) changed it: POST, the method overrides rewrite,
// when several routes share h, or else the first of them engine.Routes
// lists. The key's method is then always one of the routes', never one the
// client picked.
func (pr *pathRoutes) served(method string, h gin.HandlerFunc) (string, bool) {
	if pr == nil {
		return "", false // a path registered after the routes were read
	}
	if pr.any {
		return "", true
	}
	served, found := "", false
	for i, m := range pr.methods {
		if !frameworkctx.SameFunc(pr.handlers[i], h) {
			continue
		}
		if m == method {
			return m, true
		}
		if !found || m == http.MethodPost {
			served, found = m, true
		}
	}
	return served, found
}

// New builds a Limiter from layers and opts with [ratelimit.New] and returns
// its [Middleware]. It returns ratelimit.New's error for an invalid
// configuration, and an error wrapping [ratelimit.ErrConfig] for a Limiter
// that refunds by response status ([ratelimit.WithRefund]), which
// [Middleware] refuses.
func New(layers []ratelimit.Layer, opts ...ratelimit.Option) (gin.HandlerFunc, error) {
	l, err := ratelimit.New(layers, opts...)
	if err != nil {
		return nil, err
	}
	if l.RefundsByStatus() {
		return nil, fmt.Errorf("%w: %s", ratelimit.ErrConfig, errRefundsByStatus)
	}
	return Middleware(l), nil
}

// errRefundsByStatus is why a Limiter that refunds by response status is
// refused.
const errRefundsByStatus = "ginlimit: the Limiter refunds by response status (ratelimit.WithRefund), which gin's middleware cannot see; use WithResult and call Limiter.Refund on the Result after c.Next()"
