// Package chilimit adapts a [ratelimit.Limiter] to the chi router
// (github.com/go-chi/chi/v5): middleware for r.Use, r.With and r.Group that
// finds the route chi will match, before chi has routed the request, so that
// [ratelimit.Route] keys and [ratelimit.Layer] Routes work wherever the
// middleware is mounted, top-level r.Use included.
//
// # One Limiter at the top level
//
// The middleware asks the router (chi's Mux.Find, from the routing context
// chi's ServeHTTP sets up) for the pattern the request will match. The route
// key is the full pattern, with the method only where the route names one:
// r.Post("/login", ...) gives "POST /login", r.Handle("/login", ...) gives
// "/login" for every method, so that changing the method never buys a fresh
// quota. A request chi matches no route for (a 404, or a 405 for a method
// the route does not serve) is not keyed by route: route layers do not apply
// to it, and chi answers it. The exceptions count more, never less: a
// request that matches no route as it is, but would once chi's rewriting
// middleware (CleanPath, StripSlashes, URLFormat, GetHead) rewrote it, is
// keyed by the route it would reach, wherever that middleware runs, so a
// HEAD counts with GET and /login/ or /login.json with /login even where no
// such middleware serves them. CleanPath, StripSlashes, URLFormat and
// GetHead in the root router's r.Use are applied first, as chi applies
// them (those after the last limiter of that stack, or all of them for a
// limiter in r.With or in a mounted router), so that a path they turn into
// another route (POST /login/ into POST /login beside a catch-all,
// /users/me.json into /users/me beside /users/{id}) is keyed by the route
// chi serves. In a mounted sub-router's own r.Use, where the limiter
// cannot see them, and between two limiters of one stack (for the first),
// they are applied only to a path that matches no route as it is: there, a
// path that a catch-all or a parameter matches keeps that route, so put
// such middleware before the limiter. The same holds for a limiter wrapped
// by another middleware in the root r.Use (middleware.Maybe, say): the
// limiter finds its place in the stack by the function Middleware returns,
// so wrapped, it cannot tell which rewriting middleware run after it. A
// sub-router mounted behind a plain middleware (r.Mount("/admin",
// auth(admin))) is opaque to chi's route tree, and its requests are keyed
// by the mount's pattern, "/admin/*": give the middleware to the
// sub-router (admin.Use(auth)) or to a group (r.Group with r.Use(auth),
// then r.Mount), so that chi sees its routes. Register routes before
// serving: the lookup remembers which paths are mount points (up to 4,096
// of them), so a Mount added at a path requests have already reached is
// seen only once that memory turns over. So one Limiter mounted with
// a top-level r.Use holds per-IP, per-user and per-route layers, decided
// and charged in one atomic batch:
//
//	ip := ratelimit.MustClientIP()
//	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
//		{Key: ip, Rule: core.PerMinute(100).Named("per-ip")},
//		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.PerMinute(2).Named("login"),
//			Routes: []string{"POST /login"}},
//	}))
//	r := chi.NewRouter()
//	r.Use(chilimit.Middleware(l))
//	r.Post("/login", login)
//
// A login refused by the "login" layer uses up none of the per-IP quota.
//
// The client IP comes from [ratelimit.ClientIP], which reads r.RemoteAddr
// and trusts forwarded headers only from configured proxies. Do not put
// chi's middleware.RealIP in front of the limiter: it rewrites r.RemoteAddr
// from headers any client can forge.
//
// # Per-user limits
//
// chi keeps no values of its own: an authentication middleware stores the
// user in the request's context. Store it with [ratelimit.WithUser] and a
// [ratelimit.User] layer keys by it, or key by the application's own
// context value with a [ratelimit.KeyFunc]. Mount the limiter after the
// authentication middleware:
//
//	func auth(next http.Handler) http.Handler {
//		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//			if id, ok := authenticate(r); ok {
//				r = r.WithContext(ratelimit.WithUser(r.Context(), id))
//			}
//			next.ServeHTTP(w, r)
//		})
//	}
//
//	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
//		{Key: ratelimit.MustClientIP(), Rule: perIP},
//		{Key: ratelimit.User(), Rule: perUser}, // skipped for anonymous requests
//	}))
//	r.Use(auth, chilimit.Middleware(l))
package chilimit

import (
	"net/http"
	stdpath "path"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/limitry/ratelimit"
)

// Middleware returns chi middleware that decides every request with l (see
// [ratelimit.Limiter.Admit]) and calls the next handler only for the
// requests l admits. Before deciding, it finds the route chi will match for
// the request and stores it with [ratelimit.WithRoute] for
// [ratelimit.Route] and [ratelimit.Layer] Routes (see the package
// documentation); outside a chi router there is no route, and a route layer
// is a configuration error ([ratelimit.ErrConfig]). The next handler
// receives the request unchanged (see [WithResult] for the exception). A
// Limiter with [ratelimit.WithRefund] refunds by the status the next
// handler writes, as [ratelimit.Limiter.Handler] does.
//
// Use it with r.Use, r.With or r.Group. Middleware panics if l is nil or an
// option is nil.
func Middleware(l *ratelimit.Limiter, opts ...Option) func(http.Handler) http.Handler {
	if l == nil {
		panic("chilimit: Middleware called with a nil *ratelimit.Limiter")
	}
	var o options
	for _, opt := range opts {
		if opt == nil {
			panic("chilimit: nil Option")
		}
		opt(&o)
	}
	mw := func(next http.Handler) http.Handler {
		if next == nil {
			panic("chilimit: middleware applied to a nil http.Handler")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dr := r
			if route, ok := RouteOf(r); ok {
				dr = r.WithContext(ratelimit.WithRoute(r.Context(), route))
			} else if r.Pattern != "" {
				// chi's pattern so far (a mount's "/api/*"), or, outside
				// chi, an http.ServeMux's ("/api/"), is not the route: a
				// route layer must find none, and fail loudly.
				dr = r.WithContext(r.Context())
				dr.Pattern = ""
			}
			if l.RefundsByStatus() {
				// WithRefund needs the status next writes: serve
				// through the Limiter's own handlers.
				if o.result {
					l.HandlerWithResult(next).ServeHTTP(w, dr)
					return
				}
				l.Handler(http.HandlerFunc(func(sw http.ResponseWriter, _ *http.Request) {
					next.ServeHTTP(sw, r)
				})).ServeHTTP(w, dr)
				return
			}
			// done gives back in-flight slots (Layer.InFlight) when the
			// handler returns, a panic included.
			if o.result {
				dr, ok, done := l.AdmitWithResultFunc(w, dr)
				defer done()
				if ok {
					next.ServeHTTP(w, dr)
				}
				return
			}
			ok, done := l.AdmitFunc(w, dr)
			defer done()
			if ok {
				next.ServeHTTP(w, r)
			}
		})
	}
	selfOnce.Do(func() { selfPC.Store(reflect.ValueOf(mw).Pointer()) })
	return mw
}

// Option configures the middleware.
type Option func(*options)

type options struct {
	result bool
}

// WithResult makes the middleware store the decision of every request it
// admits in the request's context, where the next handler reads it with
// [ratelimit.ResultFromContext], for instance to show the remaining quota in
// a response body. The next handler then receives a shallow copy of the
// request, whose context also holds the route (see [ratelimit.WithRoute]).
// It costs two allocations per request, three for more than two layers (see
// [ratelimit.Limiter.AdmitWithResult]); without it, no Result is stored.
func WithResult() Option { return func(o *options) { o.result = true } }

// RouteOf returns the route chi matches for r, as [ratelimit.Route] keys
// it: "POST /login" for a route registered for its method, "/login" for
// one registered for every method (r.Handle, r.HandleFunc), "" for a request
// no route matches. ok is false outside a chi router (no routing context).
// It may be called before chi has routed r, in a top-level r.Use. A
// method's route on a pattern also registered for every method (r.Handle
// and r.Get on "/graphql"), or one whose whole pattern reads the same as an
// every-method route's in a mount, is keyed as that every-method route:
// both share its quota, and a layer written "GET /graphql" matches neither
// (the unmatched-Routes warning says so).
//
// Before routing, the path is the one chi will route: the routing context's
// RoutePath when a middleware rewrote it (middleware.CleanPath,
// StripSlashes, URLFormat), the URL's otherwise. Inside a mounted
// sub-router, where the routing context holds only the rest of the path,
// RouteOf reads the URL. A path that matches no route as it is is tried
// as chi's rewriting middleware would leave it (cleaned, without its
// trailing slash, without its extension) and a HEAD as a GET, so that a
// rewrite that runs later (in a sub-router's own r.Use, or after the
// limiter) does not hide the route chi serves; chi's rewriting middleware
// in the root router's r.Use is applied first (see the package
// documentation). Rewrites of other kinds must run before the limiter. A
// mount point's own path (/users and /users/ for r.Route("/users", ...))
// gets the sub-router's "/" route, "/users/", as chi serves both. Inside a
// mount, if no form of the URL ends with a form of the rest of the path
// chi routes (the rest as it is, or as a rewrite in the sub-router leaves
// it), RouteOf cannot tell the route, and says so (ok false: a route layer
// fails loudly rather than skip the request).
func RouteOf(r *http.Request) (route string, ok bool) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return "", false
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	if path == "" {
		path = "/"
	}
	// In a mount, chi routes the rest of the path (RoutePath): a path is
	// the one chi routes only if it ends with that rest.
	rest := ""
	if rp := rctx.RoutePath; rp != "" {
		if len(rctx.RoutePatterns) == 0 {
			path = rp // not routed yet: chi's root routes this path
		} else {
			rest = rp
		}
	}
	method := rctx.RouteMethod // set by middleware such as GetHead
	if method == "" {
		method = r.Method
	}
	fc := chi.NewRouteContext()
	if len(rctx.RoutePatterns) == 0 {
		// Before routing, in the root router's r.Use: chi's rewriting
		// middleware later in that stack rewrites the path chi routes.
		var rp string
		if rp, method = rewriteRoute(r, rctx.Routes, false, rctx.RoutePath, method); rp != "" {
			path = rp
		}
	} else {
		// Routed (the limiter in r.With, or in a mounted router): the root
		// router's rewriting middleware have all run, from the URL's path.
		if rp, _ := rewriteRoute(r, rctx.Routes, true, "", method); rp != "" {
			path = rp
		}
		// With the path a rewrite left (CleanPath at the top, the limiter
		// in r.With), the route is the one chi matched when chi finds it
		// from the root as that route.
		if rest != "" {
			if pattern := find(rctx.Routes, fc, method, rest); pattern != "" && pattern == rctx.RoutePattern() {
				return routeKey(rctx, fc, method, rest, pattern), true
			}
		}
	}
	if rest == "/" && !strings.HasSuffix(path, "/") {
		// A mount point's own path ("/users" for r.Route("/users", ...)),
		// which chi routes as the sub-router's "/": its route is the one
		// "/users/" finds from the root.
		path += "/"
	}
	methods := []string{method}
	if method == http.MethodHead {
		methods = append(methods, http.MethodGet) // as GetHead serves it
	}
	if rest == "" || strings.HasSuffix(path, rest) {
		// The usual case, before any variant is built.
		if pattern := find(rctx.Routes, fc, method, path); pattern != "" {
			return routeKey(rctx, fc, method, path, pattern), true
		}
	}
	agrees := rest == ""
	var rests []string // the forms a rewrite in the sub-router leaves of rest
	if rest != "" {
		rests = pathVariants(rest)
		// In a mount, a rewrite in the sub-router (StripSlashes after the
		// limiter) makes chi serve a route of the sub-router for a form of
		// rest: look it up there first, where chi does, not from the root,
		// where another branch (a root route at the same path) may answer.
		if key := inMount(rctx, fc, methods, rests); key != "" {
			return key, true
		}
	}
	for _, m := range methods {
		for _, p := range pathVariants(path) {
			if rest != "" && !endsWithAny(p, rests) {
				continue
			}
			agrees = true
			if pattern := find(rctx.Routes, fc, m, p); pattern != "" {
				return routeKey(rctx, fc, m, p, pattern), true
			}
		}
	}
	return "", agrees
}

// inMount returns the route key of the route of the sub-router the
// request is in (reached through rctx.RoutePatterns, each a mount's "/*"
// pattern) that one of rests, the forms of the path the sub-router routes,
// finds for one of methods, "" for none: the route chi serves once a
// rewrite in the sub-router has left that form. The route is judged
// (every method or one) within the sub-router, where chi serves it.
func inMount(rctx *chi.Context, fc *chi.Context, methods, rests []string) string {
	if len(rctx.RoutePatterns) == 0 {
		return ""
	}
	sub, prefix := rctx.Routes, ""
	for _, mp := range rctx.RoutePatterns {
		// The mount chi routed through: its own "/*" entry, which a route
		// at the mount point's path (a GET /api/ beside r.Route("/api"))
		// does not hide for the paths below it.
		at, ok := strings.CutSuffix(mp, "/*")
		if !ok {
			return ""
		}
		var next chi.Routes
		for _, rt := range sub.Routes() {
			if rt.Pattern == mp && rt.SubRoutes != nil {
				next = rt.SubRoutes
				break
			}
		}
		if next == nil {
			return ""
		}
		sub, prefix = next, prefix+at
	}
	for _, m := range methods {
		for _, rv := range rests {
			if pattern := find(sub, fc, m, rv); pattern != "" {
				return routeKeyIn(sub, fc, m, rv, pattern, prefix)
			}
		}
	}
	return ""
}

// endsWithAny reports whether p ends with one of suffixes.
func endsWithAny(p string, suffixes []string) bool {
	for _, s := range suffixes {
		if strings.HasSuffix(p, s) {
			return true
		}
	}
	return false
}

// rewrite is one of chi's path-rewriting middleware.
type rewrite uint8

const (
	rewriteClean rewrite = iota + 1 // middleware.CleanPath
	rewriteStrip                    // middleware.StripSlashes
	rewriteExt                      // middleware.URLFormat
	rewriteHead                     // middleware.GetHead
)

var (
	// selfPC is the code of the middleware Middleware returns, the same
	// for every Limiter: it finds the limiter in a router's stack.
	selfPC   atomic.Uintptr
	selfOnce sync.Once
	// rewriters are chi's middleware that rewrite the path chi routes,
	// by their code.
	rewriters = map[uintptr]rewrite{
		reflect.ValueOf(middleware.CleanPath).Pointer():    rewriteClean,
		reflect.ValueOf(middleware.StripSlashes).Pointer(): rewriteStrip,
		reflect.ValueOf(middleware.URLFormat).Pointer():    rewriteExt,
		reflect.ValueOf(middleware.GetHead).Pointer():      rewriteHead,
	}
)

// rewriteRoute returns the route path (chi's RoutePath, "" for none) and
// method that the rewriting middleware of routes' own stack leave for r,
// starting from rp and method: all of them, or (all false) those after the
// last limiter in the stack, which have not run yet when it decides. (With
// two limiters in one stack, the first cannot tell itself from the second:
// the rewrites between them are tried for it only as pathVariants are.)
// Each acts as chi's own does: CleanPath cleans the URL's path only while
// no route path is set, StripSlashes and URLFormat rewrite the route path
// or, if none is set, the URL's decoded path, and GetHead routes a HEAD
// that has no route of its own as a GET, from the route path or the URL's
// raw path. It reads the stack afresh, a few comparisons, allocating
// nothing.
func rewriteRoute(r *http.Request, routes chi.Routes, all bool, rp, method string) (string, string) {
	mws := routes.Middlewares()
	if !all {
		last, self := -1, selfPC.Load()
		for i, m := range mws {
			if reflect.ValueOf(m).Pointer() == self {
				last = i
			}
		}
		if last < 0 {
			return rp, method
		}
		mws = mws[last+1:]
	}
	for _, m := range mws {
		k := rewriters[reflect.ValueOf(m).Pointer()]
		if k == 0 {
			continue
		}
		p := rp
		if p == "" {
			p = r.URL.Path
		}
		switch k {
		case rewriteHead:
			if r.Method == http.MethodHead {
				hp := rp
				if hp == "" {
					hp = r.URL.RawPath
					if hp == "" {
						hp = r.URL.Path
					}
				}
				if !routes.Match(chi.NewRouteContext(), http.MethodHead, hp) {
					rp, method = hp, http.MethodGet
				}
			}
		case rewriteClean:
			if rp == "" {
				if r.URL.RawPath != "" {
					p = r.URL.RawPath
				}
				rp = stdpath.Clean(p)
			}
		case rewriteStrip:
			if len(p) > 1 && p[len(p)-1] == '/' {
				rp = p[:len(p)-1]
			}
		case rewriteExt:
			if strings.IndexByte(p, '.') > 0 {
				if q := stripExt(p); q != p {
					rp = q
				}
			}
		}
	}
	return rp, method
}

// pathVariants returns path, then the paths chi's rewriting middleware
// would route instead (CleanPath, StripSlashes, URLFormat, alone and
// together), so that a rewrite that runs after the limiter (later in the
// same r.Use, or in a mounted sub-router's own) does not hide the route
// chi then serves.
func pathVariants(path string) []string {
	out := make([]string, 0, 8)
	add := func(p string) {
		for _, q := range out {
			if q == p {
				return
			}
		}
		out = append(out, p)
	}
	for _, base := range [...]string{path, stdpath.Clean(path)} {
		add(base)
		slash := stripSlash(base)
		add(slash)
		add(stripExt(base))
		add(stripExt(slash))
	}
	return out
}

// stripSlash removes a trailing slash, as middleware.StripSlashes does.
func stripSlash(p string) string {
	if len(p) > 1 && p[len(p)-1] == '/' {
		return p[:len(p)-1]
	}
	return p
}

// stripExt removes the last segment's extension, as middleware.URLFormat
// does.
func stripExt(p string) string {
	base := strings.LastIndexByte(p, '/')
	if base < 0 {
		return p
	}
	if i := strings.LastIndexByte(p[base:], '.'); i > 0 {
		return p[:base+i]
	}
	return p
}

// routeKey returns the route key of pattern, which matched method and
// path: a route registered for every method (r.Handle, r.HandleFunc, a
// Mount) matches other methods too, and then the method is not part of the
// route. TRACE, CONNECT and OPTIONS (but the request's own method) are
// tried at path: one that no route serves there proves a route registered
// for its methods; one that reaches pattern too, with none unserved,
// proves a route for every method; one that reaches another route (a more
// specific one registered for it: a CORS preflight, say) proves nothing.
// When no probe decides, chi's registration of the matched route does.
func routeKey(rctx *chi.Context, fc *chi.Context, method, path, pattern string) string {
	return routeKeyIn(rctx.Routes, fc, method, path, pattern, "")
}

// routeKeyIn is routeKey in routes, a router that path and pattern are
// relative to, mounted at prefix (a mount's pattern, "" for the root).
func routeKeyIn(routes chi.Routes, fc *chi.Context, method, path, pattern, prefix string) string {
	same := false
	for _, probe := range [...]string{http.MethodTrace, http.MethodConnect, http.MethodOptions} {
		if probe == method {
			continue
		}
		switch find(routes, fc, probe, path) {
		case "":
			return method + " " + prefix + pattern
		case pattern:
			same = true
		}
	}
	h := handlersAt(routes, pattern)
	if same {
		if h != nil && h["*"] == nil && h[method] != nil {
			// A route of the method, whose pattern has routes of the
			// probes' methods too (OPTIONS, TRACE, CONNECT).
			return method + " " + prefix + pattern
		}
		return prefix + pattern
	}
	if h["*"] != nil {
		return prefix + pattern
	}
	return method + " " + prefix + pattern
}

// handlersAt returns the handlers routes registers pattern (a whole
// pattern, as find returns it) with, by method ("*" for a route of every
// method), or nil when it finds none. It looks at the routes of that
// pattern at this level, then in the mount with the longest prefix of the
// pattern, as chi routes, so that a method's route reading the same as an
// every-method route is keyed as that route, as the probes key it.
func handlersAt(routes chi.Routes, pattern string) map[string]http.Handler {
	var (
		sub  chi.Routes
		rest string
		best = -1
		own  map[string]http.Handler // pattern's at this level, of some methods
	)
	for _, rt := range routes.Routes() {
		if rt.SubRoutes == nil {
			if rt.Pattern == pattern {
				if rt.Handlers["*"] != nil {
					return rt.Handlers
				}
				own = rt.Handlers
			}
			continue
		}
		prefix := strings.TrimSuffix(rt.Pattern, "/*")
		if r, ok := strings.CutPrefix(pattern, prefix); ok && (r == "" || r[0] == '/') && len(prefix) > best {
			sub, rest, best = rt.SubRoutes, r, len(prefix)
		}
	}
	if sub == nil {
		return own
	}
	if rest == "" {
		rest = "/"
	}
	return handlersAt(sub, rest)
}

// find returns the pattern chi serves method and path with, as Mux.Find
// does, except for a mount point's own path: chi's Mount registers
// "/users" and "/users/" (for r.Mount("/users", sub), r.Route("/users",
// ...)) as stubs that hand the request to the sub-router, which routes "/";
// Find stops at the stubs, and find goes on into the sub-router, so that
// both paths get the sub-router's route, "/users/".
func find(routes chi.Routes, fc *chi.Context, method, path string) string {
	fc.Reset()
	pattern := routes.Find(fc, method, path)
	if pattern == "" {
		return ""
	}
	sub := mountOf(routes, pattern, method)
	if sub == nil {
		return pattern
	}
	fc.Reset()
	if sp := sub.Find(fc, method, "/"); sp != "" {
		return strings.TrimSuffix(pattern, "/") + sp
	}
	return ""
}

// mountKey is the key of an entry of mounts.
type mountKey struct {
	routes          chi.Routes
	pattern, method string
}

// mountVal is an entry of mounts: the sub-router, or nil.
type mountVal struct{ sub chi.Routes }

// mounts remembers mountAt's answers by router, pattern and method, so
// that a request walks its router's routes once per pattern, not once per
// request. It is emptied when it holds maxMounts entries (nmounts), so
// that routers built and dropped over a process's life (one per tenant,
// say) are not kept. (A Mount added at a path requests already reached,
// after they did, is seen once the cache has been emptied.)
var (
	mounts  sync.Map
	nmounts atomic.Int64
)

// maxMounts bounds mounts.
const maxMounts = 4096

// mountOf is mountAt, remembered in mounts when routes is a pointer (a
// *chi.Mux), which is safe to hash; any other chi.Routes (a host router of
// a map type, say, whose hashing would panic) is looked up anew.
func mountOf(routes chi.Routes, pattern, method string) chi.Routes {
	if reflect.TypeOf(routes).Kind() != reflect.Pointer {
		return mountAt(routes, pattern, method)
	}
	k := mountKey{routes, pattern, method}
	if v, ok := mounts.Load(k); ok {
		return v.(mountVal).sub
	}
	sub := mountAt(routes, pattern, method)
	if nmounts.Add(1) > maxMounts {
		mounts.Clear()
		nmounts.Store(1)
	}
	mounts.Store(k, mountVal{sub})
	return sub
}

// mountAt returns the sub-router that Mount's stub at pattern ("/users" or
// "/users/" for r.Mount("/users", sub); "/{tenant}/users" for one with a
// parameter) hands method's requests to, in routes or in a router mounted
// in it: nil when pattern is no such stub, or when a route of its own
// serves method there (chi hides Mount's stubs from Routes, not the routes
// registered at the same pattern, which chi serves for their methods).
func mountAt(routes chi.Routes, pattern, method string) chi.Routes {
	base := strings.TrimSuffix(pattern, "/")
	var sub chi.Routes
	for _, rt := range routes.Routes() {
		if rt.SubRoutes == nil {
			if rt.Pattern == pattern && (rt.Handlers[method] != nil || rt.Handlers["*"] != nil) {
				return nil // a route of its own for method
			}
			continue
		}
		prefix := strings.TrimSuffix(rt.Pattern, "/*")
		if prefix == base {
			sub = rt.SubRoutes
			continue
		}
		if strings.HasPrefix(base, prefix+"/") {
			if s := mountAt(rt.SubRoutes, pattern[len(prefix):], method); s != nil {
				return s
			}
		}
	}
	return sub
}

// New builds a Limiter from layers and opts with [ratelimit.New] and returns
// its [Middleware]. It returns ratelimit.New's error for an invalid
// configuration.
func New(layers []ratelimit.Layer, opts ...ratelimit.Option) (func(http.Handler) http.Handler, error) {
	l, err := ratelimit.New(layers, opts...)
	if err != nil {
		return nil, err
	}
	return Middleware(l), nil
}
