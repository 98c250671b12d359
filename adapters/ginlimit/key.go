package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/internal/frameworkctx"
)

// ErrNoContext is returned (wrapped) by a [Key] function for a request that
// reached the Limiter without this package's middleware, so that no
// *gin.Context is known: a Limiter with Key layers must be mounted with
// [Middleware], [MiddlewareFor] or [New].
// It wraps ratelimit.ErrConfig: the Limiter answers it as a configuration
// error (500 Internal Server Error unless the error handler writes a
// response, and one log line), never as a skip.
var ErrNoContext = frameworkctx.ConfigError("ginlimit: Key needs the request decided by ginlimit's middleware")

// Key returns a [ratelimit.KeyFunc] that keys a request by what fn finds in
// its *gin.Context, such as the user an authentication handler stored with
// c.Set: a Limiter mounted with this package's middleware after that
// handler charges the user's quota without rewriting the request's context.
//
// fn follows the KeyFunc contract: it returns a non-empty key, or an error.
// Returning an error wrapping [ratelimit.ErrNoKey] (no user: an anonymous
// request) makes the layer do what its IfNoKey says (skip the layer by
// default, or refuse the request); any other error is a key error. An empty
// key with no error is a key error ([ratelimit.ErrEmptyKey]), never a shared
// bucket. A request decided without this package's middleware fails with
// [ErrNoContext], a configuration error (answered 500, logged once). The
// key becomes a store key: prefer a stable opaque ID to an e-mail address
// or other personal data.
//
// Key panics if fn is nil.
func Key(fn func(c *gin.Context) (string, error)) ratelimit.KeyFunc {
	return frameworkctx.Key("ginlimit", fn, ErrNoContext)
}

// Get returns a [Key] function for the common case: the key is the string
// an earlier handler stored with c.Set(name, value), such as the
// authenticated user's ID. A request without it (an anonymous request), or
// with an empty one, returns [ratelimit.ErrNoKey]: the layer does what its
// IfNoKey says. A value that is not a string is a key error: a Limiter never
// guesses how to print it. Get panics if name is empty.
func Get(name string) ratelimit.KeyFunc {
	if name == "" {
		panic("ginlimit: Get called with an empty name")
	}
	return Key(func(c *gin.Context) (string, error) {
		v, ok := c.Get(name)
		return frameworkctx.String("ginlimit", name, v, ok)
	})
}
