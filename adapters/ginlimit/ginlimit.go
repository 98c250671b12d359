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
// Before deciding, the middleware stores gin's route pattern, c.FullPath()
// ("/users/:id"), with [ratelimit.WithRoute], so that [ratelimit.Route] keys
// a request by the route it matched rather than by its URL. Gin routes a
// request before running any of its handlers, so the pattern is complete in
// router.Use, group and per-route middleware alike; for a request no route
// matches (the NoRoute handlers) it is empty and a route-keyed layer is
// skipped.
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
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
)

// Middleware returns a gin handler that decides every request with l (see
// [ratelimit.Limiter.Admit]): it calls c.Next for the requests l admits and
// c.Abort, after l has written the response, for the others. Use it with
// router.Use, group.Use or in a route's handler list. It panics if l is nil.
func Middleware(l *ratelimit.Limiter) gin.HandlerFunc {
	if l == nil {
		panic("ginlimit: nil *ratelimit.Limiter")
	}
	return func(c *gin.Context) {
		r := c.Request
		if p := c.FullPath(); p != "" {
			r = r.WithContext(ratelimit.WithRoute(r.Context(), p))
		}
		if !l.Admit(c.Writer, r) {
			c.Abort()
			return
		}
		c.Next()
	}
}

// New builds a Limiter from layers and opts with [ratelimit.New] and returns
// its [Middleware]. It returns ratelimit.New's error for an invalid
// configuration.
func New(layers []ratelimit.Layer, opts ...ratelimit.Option) (gin.HandlerFunc, error) {
	l, err := ratelimit.New(layers, opts...)
	if err != nil {
		return nil, err
	}
	return Middleware(l), nil
}
