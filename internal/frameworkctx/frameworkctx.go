// Package frameworkctx carries a web framework's own request context (gin's
// *gin.Context, echo's echo.Context) to the Key functions of the framework
// adapters while a Limiter decides a request, and builds those Key
// functions, so that every adapter keys layers by the same rules.
package frameworkctx

import (
	"context"
	"fmt"
	"net/http"
	"unsafe"

	"github.com/limitry/ratelimit"
)

// key is the request-context key under which a Carrier answers its C.
type key[C any] struct{}

// Carrier is the request's context while a Limiter decides it, with the
// framework's context c. The adapter clears it once the request is decided:
// frameworks reuse their contexts.
type Carrier[C any] struct {
	// Context is the request's context, which answers every method but
	// Value for the Carrier's own key.
	context.Context
	c   C
	set bool
}

// New returns a Carrier of c over parent.
func New[C any](parent context.Context, c C) *Carrier[C] {
	return &Carrier[C]{Context: parent, c: c, set: true}
}

// Get returns the carried context, and false once Clear has run.
func (k *Carrier[C]) Get() (C, bool) { return k.c, k.set }

// Clear forgets the carried context.
func (k *Carrier[C]) Clear() {
	var zero C
	k.c, k.set = zero, false
}

// Value implements context.Context.
func (k *Carrier[C]) Value(name any) any {
	if _, ok := name.(key[C]); ok {
		if !k.set {
			return nil
		}
		return k.c
	}
	return k.Context.Value(name)
}

// Key returns a ratelimit.KeyFunc calling fn with the C that a Carrier
// holds in the request's context: noContext when there is none (the
// request was decided without the adapter's middleware), fn's error as it
// is, and ratelimit.ErrEmptyKey for an empty key. It panics, naming pkg,
// if fn is nil.
func Key[C any](pkg string, fn func(C) (string, error), noContext error) ratelimit.KeyFunc {
	if fn == nil {
		panic(pkg + ": Key called with a nil function")
	}
	return func(r *http.Request) (string, error) {
		c, ok := r.Context().Value(key[C]{}).(C)
		if !ok {
			return "", noContext
		}
		k, err := fn(c)
		if err != nil {
			return "", err
		}
		if k == "" {
			return "", ratelimit.ErrEmptyKey
		}
		return k, nil
	}
}

// String is the key of the adapters' Get: the string value v stored under
// name, where found reports that one was. A missing, nil or empty value is
// ratelimit.ErrNoKey; a value of another type is an error naming pkg and
// name (a Limiter never guesses how to print it).
func String(pkg, name string, v any, found bool) (string, error) {
	if !found || v == nil {
		return "", ratelimit.ErrNoKey
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: Get(%q): the value has type %T, not string", pkg, name, v)
	}
	if s == "" {
		return "", ratelimit.ErrNoKey
	}
	return s, nil
}

// ConfigError returns an error with the text msg that is a
// ratelimit.ErrConfig (errors.Is): a Limiter answers it as a configuration
// error, never as a skip.
func ConfigError(msg string) error { return configError(msg) }

type configError string

func (e configError) Error() string { return string(e) }

// Is reports that the error is a ratelimit.ErrConfig.
func (configError) Is(target error) bool { return target == ratelimit.ErrConfig }

// SameFunc reports whether a and b, values of a func type F (a framework's
// handler type), are the same function value: the same closure, not merely
// the same code, so that closures of one function literal (route
// middleware's wrappers, say) are told apart. F must be a func type.
func SameFunc[F any](a, b F) bool {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a)) == *(*unsafe.Pointer)(unsafe.Pointer(&b))
}
