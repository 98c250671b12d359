// Package echolimit adapts a [ratelimit.Limiter] to the echo web framework
// (github.com/labstack/echo/v4) as an [echo.MiddlewareFunc].
//
// Before deciding, the middleware stores the route echo matched, with
// [ratelimit.WithRoute], so that [ratelimit.Route] keys a request by its
// route rather than its URL and [ratelimit.Layer] Routes can limit a layer to
// some routes: "GET /users/:id" for a route registered for one method,
// "/login" for one registered with e.Any (every method), so that changing
// the method never buys a fresh quota. A request echo matches no route for
// (404, or 405 for a method the route does not serve) is not keyed by route:
// route layers do not apply to it. A request a RouteNotFound handler
// answers is keyed by that handler's path, as an e.Any route is: echo's own
// (the catch-alls g.Use adds at a group's path and its "/*", so that a 404
// under /api/ is keyed "/api/*") or one registered with e.RouteNotFound.
// Middleware added with e.Use, g.Use or per route runs after routing; in
// e.Pre middleware the route is looked up in
// echo's router, so one Limiter in e.Pre or e.Use can hold per-IP, per-user
// and per-route layers in one atomic batch. In e.Pre the route is looked up
// by the path and method as they are when the middleware runs: put the
// Limiter after the e.Pre middleware that rewrites them
// (RemoveTrailingSlash, AddTrailingSlash, Rewrite, MethodOverride), or in
// e.Use; before them, a path they rewrite into a route would find none, and
// a method a client overrides (POST with X-HTTP-Method-Override: DELETE)
// would be keyed as the method it came with, so that route layers would not
// apply to it. A method rewritten after routing (MethodOverride in e.Use,
// where echo no longer routes by it) is not taken for the route's: the
// request is keyed by the method whose route holds the handler echo
// serves (POST, the method MethodOverride rewrites, when several share
// that handler), or by its path alone when that cannot be told.
//
// In e.Pre the Limiter sees the request the Pre middleware before it hand
// on, while echo routes the request it received: a Pre middleware that
// replaces the request with a copy (echo.WrapMiddleware around a net/http
// middleware calling r.WithContext, ContextTimeout, this package's
// Config.Result) and then MethodOverride or Rewrite changes only the copy,
// so the Limiter would key the request otherwise than echo routes it, and
// a client's override could escape route layers. With such Pre middleware,
// put the Limiter in e.Use, where it keys by the route echo serves.
//
// A method's route on a path also registered with e.Any (e.POST and e.Any
// on "/login") is keyed as the e.Any route, by the path alone: both share
// its quota, and a layer written "POST /login" matches neither (the
// unmatched-Routes warning says so); write "/login".
//
// # Responses
//
// By default the limiter writes its own responses, exactly as its net/http
// middleware does: 429 with Retry-After (or the [ratelimit.WithDeniedHandler]
// and [ratelimit.WithProblemDetails] responses), and 400 or 503 for errors;
// the middleware then returns nil, so echo's HTTPErrorHandler is not involved.
// With [Config.HTTPError] the middleware writes no body and returns an
// *echo.HTTPError with the status the limiter chose, for echo's
// HTTPErrorHandler to render like any other error. In both cases the
// rate-limit headers and Retry-After are set on c.Response().
//
// # Client IP
//
// Keys come from the Limiter's layers, such as [ratelimit.ClientIP], which
// reads r.RemoteAddr and trusts forwarded headers only from the proxies it is
// configured with. This package never keys by c.RealIP(): echo v4's RealIP
// trusts X-Forwarded-For and X-Real-IP from any client unless an IPExtractor
// is set, so a client could pick its own key. Echo's IPExtractor has no effect
// on the limiter's keys.
//
// # Keys from the echo context
//
// An authentication middleware in echo keeps the user in the context with
// c.Set. [Key] and [Get] turn what the echo.Context holds into a
// [ratelimit.KeyFunc], so a per-user layer beside a per-IP one needs no
// change to the request's context. Mount the limiter after the
// authentication middleware (in e.Use, not e.Pre, when authentication runs
// in e.Use):
//
//	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
//		{Key: ratelimit.MustClientIP(), Rule: perIP},
//		{Key: echolimit.Get("user"), Rule: perUser}, // skipped for anonymous requests
//	}))
//	e.Use(auth, echolimit.Middleware(l)) // auth calls c.Set("user", id)
//
// # The decision in the handler
//
// With [Config.Result] the handlers read the decision of their request with
// [ratelimit.ResultFromContext](c.Request().Context()).
package echolimit

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/internal/frameworkctx"
)

// Config configures the echo middleware. The zero value is the default.
type Config struct {
	// Skipper exempts the requests for which it returns true: they are not
	// decided, not charged and get no rate-limit headers. The default value
	// is middleware.DefaultSkipper, which skips nothing.
	Skipper middleware.Skipper

	// HTTPError, when true, makes the middleware return every response the
	// limiter would have written (a refusal, 429 or 413, or an error, 400 or
	// 503) as an *echo.HTTPError with that status and its standard text as
	// message, for echo's HTTPErrorHandler to write. The limiter's own body
	// and Content-Type are dropped; its rate-limit headers and Retry-After
	// stay on c.Response(). The default value, false, lets the limiter write
	// its standard response and returns nil.
	HTTPError bool

	// Result, when true, makes the middleware store the decision of every
	// request it admits in the request's context, where the handlers read it
	// with [ratelimit.ResultFromContext](c.Request().Context()), for
	// instance to show the remaining quota in a response body; c.Request()
	// is then a shallow copy of the request echo received. It costs two
	// allocations per request, three for more than two layers (see
	// [ratelimit.Limiter.AdmitWithResult]). The default value, false, stores
	// no Result.
	Result bool
}

// Middleware returns echo middleware that decides every request with l
// under the default Config. It panics if l is nil.
func Middleware(l *ratelimit.Limiter) echo.MiddlewareFunc {
	return MiddlewareWithConfig(l, Config{})
}

// MiddlewareWithConfig returns echo middleware that decides every request
// not skipped by cfg.Skipper with l (see [ratelimit.Limiter.Admit]) and
// calls the next handler only for the requests l admits. It panics if l is
// nil or refunds by response status (ratelimit.WithRefund: refund with
// Limiter.Refund on the Result instead).
func MiddlewareWithConfig(l *ratelimit.Limiter, cfg Config) echo.MiddlewareFunc {
	if l == nil {
		panic("echolimit: nil *ratelimit.Limiter")
	}
	if l.RefundsByStatus() {
		panic(errRefundsByStatus)
	}
	skip := cfg.Skipper
	if skip == nil {
		skip = middleware.DefaultSkipper
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if skip(c) {
				return next(c)
			}
			r := c.Request()
			kc := frameworkctx.New(ratelimit.WithRoute(r.Context(), RouteOf(c)), c)
			r = r.WithContext(kc)
			// done gives back in-flight slots (Layer.InFlight) when the
			// handler returns, a panic included.
			if !cfg.HTTPError {
				ok, done := admit(l, cfg.Result, c.Response(), kc, r)
				defer done()
				if !ok {
					return nil
				}
				return next(c)
			}
			h := c.Response().Header()
			rw := &captureWriter{header: h}
			ok, done := admit(l, cfg.Result, rw, kc, r)
			defer done()
			if !ok {
				h.Del(echo.HeaderContentType)
				h.Del(echo.HeaderContentLength)
				code := rw.code
				if code == 0 {
					if r.Context().Err() != nil {
						return nil // the client went away: nobody to answer
					}
					code = http.StatusTooManyRequests
				}
				return echo.NewHTTPError(code)
			}
			return next(c)
		}
	}
}

// admit decides r, whose context is kc, with l, writing to w; with result,
// an admitted request replaces the carried Context's request with its
// Result in the context. It returns done, which gives back the in-flight
// slots r holds (see ratelimit.Limiter.AdmitFunc). It clears kc: echo
// reuses the Context once the request is served.
func admit(l *ratelimit.Limiter, result bool, w http.ResponseWriter, kc *keyContext, r *http.Request) (bool, func()) {
	c, _ := kc.Get()
	defer kc.Clear()
	if !result {
		return l.AdmitFunc(w, r)
	}
	r2, ok, done := l.AdmitWithResultFunc(w, r)
	if ok {
		c.SetRequest(r2)
	}
	return ok, done
}

// RouteOf returns the route echo matches for c's request, as
// [ratelimit.Route] keys it: "GET /users/:id" for a route registered for
// its method, "/login" for one registered for every method (e.Any) and
// "/api/*" for a RouteNotFound handler's (a group's catch-all that g.Use
// adds, or one of e.RouteNotFound), "" for a request no route or handler
// matches (404, 405). Before routing (in e.Pre middleware) it looks the
// route up in the router echo will use: the request's host's (e.Host), or
// the default one.
func RouteOf(c echo.Context) string {
	e := c.Echo()
	r := c.Request()
	rt := router(e, r.Host)
	method := r.Method
	fc := e.AcquireContext()
	defer e.ReleaseContext(fc)
	path, h, allow := c.Path(), c.Handler(), c.Get(echo.ContextKeyHeaderAllow)
	lookup := echo.GetPath(r) // the path routes are looked up at
	if path == "" {
		fc.Reset(r, nil)
		rt.Find(r.Method, lookup, fc)
		path, h, allow = fc.Path(), fc.Handler(), fc.Get(echo.ContextKeyHeaderAllow)
	} else if matched(path, h, allow) {
		// Routed already (e.Use): the request's path and method now may
		// not be those echo routed by, if a middleware after routing
		// rewrote them (Rewrite, MethodOverride in e.Use). Look routes up
		// at the path the matched route's parameters make, and key by the
		// method whose route there holds the handler echo is serving,
		// never by one the client picked.
		lookup = routePath(path, c.ParamNames(), c.ParamValues())
		method = servedMethod(rt, r, fc, path, lookup, h)
	}
	if !matched(path, h, allow) {
		return ""
	}
	// A route registered for every method (e.Any, or a RouteNotFound
	// handler) matches another method too: then the method is not part of
	// the route.
	probe := echo.REPORT
	if method == probe {
		probe = echo.PROPFIND
	}
	fc.Reset(r, nil)
	rt.Find(probe, lookup, fc)
	if probed := fc.Path(); probed == path || probed != "" && matched(probed, fc.Handler(), fc.Get(echo.ContextKeyHeaderAllow)) {
		// The probe found the request's route, or a route of its own
		// method at a more specific path that shadows it (REPORT
		// /cal/home beside e.Any's /cal/:id): ask the routes at path.
		// The method is not part of the route when the request's method
		// has no route of its own there (a group's catch-all serves it),
		// or when every method e.Any registers has one (e.Any).
		if own, _, every := methodRoutes(rt, path, method, probe); !own || every {
			return path
		}
	}
	if method == "" {
		return path // a method after routing that no route at path has
	}
	return method + " " + path
}

// servedMethod returns the method of the route at path whose handler is h,
// the handler echo is serving: the request's own method when its route at
// path holds h (or when no route there does: a RouteNotFound handler),
// else the one method whose route holds h (POST, the method
// MethodOverride rewrites, among several), else "" (the request then is
// keyed by path alone). Handlers are told apart by the function value
// itself, not its code: two closures of one function are two handlers.
func servedMethod(rt *echo.Router, r *http.Request, fc echo.Context, path, lookup string, h echo.HandlerFunc) string {
	found := func(m string) bool {
		fc.Reset(r, nil)
		rt.Find(m, lookup, fc)
		return fc.Path() == path && matched(fc.Path(), fc.Handler(), fc.Get(echo.ContextKeyHeaderAllow)) && frameworkctx.SameFunc(fc.Handler(), h)
	}
	if found(r.Method) {
		return r.Method
	}
	served := ""
	for _, x := range rt.Routes() {
		if x.Path != path || x.Method == echo.RouteNotFound || x.Method == served || !found(x.Method) {
			continue
		}
		if served != "" && x.Method != http.MethodPost && served != http.MethodPost {
			return "" // several methods share the handler
		}
		if served == "" || x.Method == http.MethodPost {
			served = x.Method
		}
	}
	if served == "" && !hasMethodRoute(rt, path) {
		return r.Method // no route of a method there: a RouteNotFound handler serves it
	}
	return served
}

// routePath returns the path that route pattern matches with the given
// parameters: ":name" segments and the final "*" replaced by their values.
func routePath(pattern string, names, values []string) string {
	value := func(name string) string {
		for i, n := range names {
			if n == name && i < len(values) {
				return values[i]
			}
		}
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(pattern); {
		switch c := pattern[i]; {
		case c == ':':
			j := i + 1
			for j < len(pattern) && pattern[j] != '/' {
				j++
			}
			b.WriteString(value(pattern[i+1 : j]))
			i = j
		case c == '*':
			b.WriteString(value("*"))
			i++
		case c == '\\' && i+1 < len(pattern):
			b.WriteByte(pattern[i+1]) // an escaped ':' or '*', itself
			i += 2
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// hasMethodRoute reports whether rt has a route of some method of its own
// at path (not only a RouteNotFound handler).
func hasMethodRoute(rt *echo.Router, path string) bool {
	for _, x := range rt.Routes() {
		if x.Path == path && x.Method != echo.RouteNotFound {
			return true
		}
	}
	return false
}

// methodRoutes reports whether rt has a route registered at path for m1,
// and for m2: routes of their own, not the RouteNotFound catch-alls that
// echo's Group.Use adds at a group's own path and at its "/*"; and whether
// it has one for every method e.Any registers. It reads the router's
// routes afresh (routes added after the first request count), so it costs
// a walk of them: RouteOf asks it only when a probe finds a route
// answering another method at the request's path (an e.Any route, a route
// of the probe's method, or such a catch-all).
func methodRoutes(rt *echo.Router, path, m1, m2 string) (has1, has2, every bool) {
	var seen uint32
	for _, x := range rt.Routes() {
		if x.Path != path {
			continue
		}
		has1 = has1 || x.Method == m1
		has2 = has2 || x.Method == m2
		for i, m := range anyMethods {
			if x.Method == m {
				seen |= 1 << i
			}
		}
	}
	return has1, has2, seen == 1<<len(anyMethods)-1
}

// anyMethods are the methods echo's e.Any and g.Any register a route for.
var anyMethods = [...]string{
	http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead,
	http.MethodOptions, http.MethodPatch, http.MethodPost, echo.PROPFIND,
	http.MethodPut, http.MethodTrace, echo.REPORT,
}

// router returns the router echo routes a request for host with: the
// host's own (e.Host) when there is one, the default router otherwise.
func router(e *echo.Echo, host string) *echo.Router {
	if rt, ok := e.Routers()[host]; ok {
		return rt
	}
	return e.Router()
}

// matched reports whether the router found a route: a path, a handler other
// than echo's 404 and 405 handlers, and no Allow list (set for a 405).
func matched(path string, h echo.HandlerFunc, allow any) bool {
	if path == "" || h == nil || allow != nil {
		return false
	}
	p := reflect.ValueOf(h).Pointer()
	return p != notFound && p != methodNotAllowed
}

var (
	notFound         = reflect.ValueOf(echo.NotFoundHandler).Pointer()
	methodNotAllowed = reflect.ValueOf(echo.MethodNotAllowedHandler).Pointer()
)

// New builds a Limiter from layers and opts with [ratelimit.New] and returns
// its [Middleware]. It returns ratelimit.New's error for an invalid
// configuration, and an error wrapping [ratelimit.ErrConfig] for a Limiter
// that refunds by response status ([ratelimit.WithRefund]), which
// [Middleware] refuses.
func New(layers []ratelimit.Layer, opts ...ratelimit.Option) (echo.MiddlewareFunc, error) {
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
const errRefundsByStatus = "echolimit: the Limiter refunds by response status (ratelimit.WithRefund), which echo's middleware cannot see; use Config.Result and call Limiter.Refund on the Result after next(c)"

// captureWriter is the http.ResponseWriter the limiter writes to under
// Config.HTTPError: headers go to the real response, the status is recorded
// and the body dropped.
type captureWriter struct {
	header http.Header
	code   int
}

func (w *captureWriter) Header() http.Header { return w.header }

func (w *captureWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *captureWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(b), nil
}
