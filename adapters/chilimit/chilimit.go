// Package chilimit adapts a [ratelimit.Limiter] to the chi router
// (github.com/go-chi/chi/v5): middleware for r.Use, r.With and r.Group that
// also hands chi's route pattern to the limiter, so that [ratelimit.Route]
// keys a request by the pattern it matched ("GET /users/{id}") rather than by
// its path.
//
// # Where to mount route-keyed limits
//
// chi knows a request's full route pattern only once it has routed it.
// Middleware added with a top-level r.Use runs before routing: there the
// pattern is empty, so a layer keyed by [ratelimit.Route] (alone or inside
// [ratelimit.Composite]) does not apply and is skipped, as the root package
// skips every layer whose key is missing. Inside a sub-router made by
// r.Route or r.Mount, the sub-router's r.Use runs before the sub-router has
// routed: the pattern is only the mount point ("/api/*"), which every
// endpoint below it shares. Mount route-keyed limits where routing is done:
//
//	r.With(chilimit.Middleware(perRoute)).Post("/login", login)
//
//	r.Group(func(r chi.Router) {
//		r.Use(chilimit.Middleware(perRoute)) // a Group's Use runs per endpoint
//		r.Get("/users/{id}", getUser)
//	})
//
// Layers keyed by client IP, header or user work wherever the middleware is
// mounted, top-level r.Use included.
//
// The client IP comes from [ratelimit.ClientIP], which reads r.RemoteAddr
// and trusts forwarded headers only from configured proxies. Do not put
// chi's middleware.RealIP in front of the limiter: it rewrites r.RemoteAddr
// from headers any client can forge.
package chilimit

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/limitry/ratelimit"
)

// Middleware returns chi middleware that decides every request with l (see
// [ratelimit.Limiter.Admit]) and calls the next handler only for the
// requests l admits. Before deciding, it stores chi's route pattern, when
// there is one, with [ratelimit.WithRoute] for [ratelimit.Route] to key by.
// The next handler receives the request unchanged.
//
// Use it with r.Use, r.With or r.Group; see the package documentation for
// where route-keyed limits must be mounted. Middleware panics if l is nil.
func Middleware(l *ratelimit.Limiter) func(http.Handler) http.Handler {
	if l == nil {
		panic("chilimit: Middleware called with a nil *ratelimit.Limiter")
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("chilimit: middleware applied to a nil http.Handler")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dr := r
			if p := chi.RouteContext(r.Context()).RoutePattern(); p != "" {
				dr = r.WithContext(ratelimit.WithRoute(r.Context(), p))
			}
			if l.Admit(w, dr) {
				next.ServeHTTP(w, r)
			}
		})
	}
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
