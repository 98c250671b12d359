package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// KeyFunc derives the rate-limit key of a request: the identity whose quota
// the request is charged to (a client IP network, an API key, a user, a
// route, or a combination).
//
// A KeyFunc returns either a non-empty key and a nil error, or an error. It
// must never return ("", nil): an empty key would put every such request into
// one shared bucket. Every KeyFunc in this package honours that rule.
//
// An error wrapping [ErrNoKey] means the key does not apply to this request
// (an anonymous request for a per-user limit); the middleware does what the
// layer's IfNoKey says: skip it (the default) or refuse the request. Any other error is a key error ([ErrInvalidClientIP],
// [ErrKeyTooLong], ...): the middleware never charges the request to an empty
// or default key, and handles it with its error policy instead.
//
// Keys are namespaced per layer by the middleware, so a KeyFunc need not add a
// prefix of its own. A KeyFunc must be safe for concurrent use.
type KeyFunc func(r *http.Request) (string, error)

var (
	// ErrNoKey is returned (possibly wrapped) by a KeyFunc whose key does
	// not apply to the request, e.g. [User] for an anonymous request. The
	// middleware skips a layer whose KeyFunc returns it, unless the layer's
	// IfNoKey is [NoKeyRefuse].
	ErrNoKey = errors.New("ratelimit: key does not apply to this request")

	// ErrKeyTooLong is returned (wrapped) by a [Header] key function
	// without [HashKey] when the header value is longer than
	// [MaxHeaderKeyLen].
	ErrKeyTooLong = errors.New("ratelimit: key value too long")

	// ErrEmptyKey is returned by [Composite] when one of its parts breaks
	// the KeyFunc contract by returning ("", nil).
	ErrEmptyKey = errors.New("ratelimit: key function returned an empty key")
)

// Limits on the work done for one request on hostile input.
const (
	// MaxHeaderKeyLen is the longest header value a [Header] key function
	// without [HashKey] uses as a key; a longer value is a key error
	// ([ErrKeyTooLong]). Hashed values have no such limit beyond the
	// server's own header size limit (http.Server.MaxHeaderBytes).
	MaxHeaderKeyLen = 1024

	// MaxRawPathKeyLen is the number of leading bytes of the URL path that
	// [RawPath] uses; longer paths share the key of their prefix.
	MaxRawPathKeyLen = 256
)

// Request-time errors carry context without allocating, and never echo the
// hostile value itself.
var (
	errHeaderKeyTooLong = fmt.Errorf("%w: header value longer than %d bytes", ErrKeyTooLong, MaxHeaderKeyLen)
)

// ---------------------------------------------------------------------------
// Header (API key)

type headerKeyConfig struct {
	hash bool
}

// HeaderOption configures [Header].
type HeaderOption func(*headerKeyConfig)

// HashKey makes a [Header] key function key by a hash of the header value
// instead of the value itself: the first 16 bytes of its SHA-256, as 32
// lowercase hex digits. Use it for secrets such as API keys and bearer
// tokens, so that no raw credential becomes a store key (or shows up in a
// Redis MONITOR or a metrics label). The hash is not keyed: it protects
// high-entropy secrets, not guessable values.
func HashKey() HeaderOption {
	return func(c *headerKeyConfig) { c.hash = true }
}

// Header returns a KeyFunc that keys a request by the value of the named
// request header, typically an API key. When the header appears more than
// once, its first line is used, as http.Header.Get does. A missing or empty
// header returns [ErrNoKey], so the layer is skipped: make the key required
// (Layer.IfNoKey [NoKeyRefuse]), fall back with [FirstOf], or pair it with a per-IP
// layer so anonymous traffic is still limited.
//
// Without [HashKey] the value is the key, and a value longer than
// [MaxHeaderKeyLen] bytes is a key error ([ErrKeyTooLong]) rather than being
// truncated (which would merge distinct clients) or skipped (which would let
// a client escape the layer). With HashKey any length is accepted.
//
// Header panics if name is empty or not a valid header name (with a space,
// a colon or another character outside RFC 9110's token), which no request
// could carry, or one that net/http's server takes out of r.Header (Host,
// Transfer-Encoding, Trailer: read r.Host with a KeyFunc of your own): the
// layer would never find a key.
func Header(name string, opts ...HeaderOption) KeyFunc {
	name = strings.TrimSpace(name)
	if name == "" {
		panic("ratelimit: Header name is empty")
	}
	if !validHeaderName(name) {
		panic(fmt.Errorf("%w: Header: %q is not a valid header name", ErrInvalidKeyConfig, name))
	}
	name = http.CanonicalHeaderKey(name)
	if serverMoved(name) {
		panic(fmt.Errorf("%w: Header: net/http's server takes %q out of r.Header, so no request would carry it there; read it from the request (r.Host) with a KeyFunc of your own", ErrInvalidKeyConfig, name))
	}
	var c headerKeyConfig
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if c.hash {
		return func(r *http.Request) (string, error) {
			v := firstHeaderLine(r, name)
			if v == "" {
				return "", ErrNoKey
			}
			return hashHeaderKey(v), nil
		}
	}
	return func(r *http.Request) (string, error) {
		v := firstHeaderLine(r, name)
		if v == "" {
			return "", ErrNoKey
		}
		if len(v) > MaxHeaderKeyLen {
			return "", errHeaderKeyTooLong
		}
		return v, nil
	}
}

// firstHeaderLine returns the first line of the canonical header name, trimmed.
func firstHeaderLine(r *http.Request, name string) string {
	if v := r.Header[name]; len(v) > 0 {
		return trimListOWS(v[0])
	}
	return ""
}

// hashHeaderKey returns the first 16 bytes of SHA-256(v) in lowercase hex.
func hashHeaderKey(v string) string {
	sum := sha256.Sum256([]byte(v))
	var buf [32]byte
	hex.Encode(buf[:], sum[:16])
	return string(buf[:])
}

// ---------------------------------------------------------------------------
// User

type userContextKey struct{}

// WithUser returns a copy of ctx carrying the identity of the authenticated
// user, for [User] to key by. Authentication middleware calls it once the
// user is known, before the rate-limit middleware runs:
//
//	next.ServeHTTP(w, r.WithContext(ratelimit.WithUser(r.Context(), id)))
//
// The identity becomes a store key: prefer a stable opaque ID to an e-mail
// address or other personal data.
func WithUser(ctx context.Context, user string) context.Context {
	return context.WithValue(ctx, userContextKey{}, user)
}

// UserFromContext returns the user identity stored by [WithUser]. ok is
// false when none was stored or it is empty.
func UserFromContext(ctx context.Context) (user string, ok bool) {
	user, _ = ctx.Value(userContextKey{}).(string)
	return user, user != ""
}

// User returns a KeyFunc that keys a request by the user identity stored in
// its context by [WithUser]. A request with no user, or an empty one, returns
// [ErrNoKey]: the per-user layer is skipped for anonymous requests, never
// keyed by a shared empty user.
func User() KeyFunc {
	return func(r *http.Request) (string, error) {
		if u, ok := UserFromContext(r.Context()); ok {
			return u, nil
		}
		return "", ErrNoKey
	}
}

// ---------------------------------------------------------------------------
// Route

type routeContextKey struct{}

// ErrNoRoute is returned (wrapped) by [Route] for a request that carries no
// routing information at all: the limiter runs before routing and was told
// neither the ServeMux ([WithServeMux]) nor the pattern (a framework adapter
// or [WithRoute]). The middleware treats it as a configuration error
// ([ErrConfig]), never as an absent key: a route limit that cannot see the
// route must not silently limit nothing.
var ErrNoRoute = errors.New("ratelimit: no route pattern: the limiter runs before routing")

// errRouteUnmatched is Route's error for a request the router matched no
// route for: the route layer does not apply (the router answers it).
var errRouteUnmatched = fmt.Errorf("%w: no route matched", ErrNoKey)

// WithRoute returns a copy of ctx carrying the route the router matched, for
// [Route] to key by. pattern is the route as the router names it: the
// method and the pattern ("GET /users/{id}") when the route serves one
// method, the pattern alone ("/login") when it serves every method. An
// empty pattern records that the router matched no route (a 404 or 405):
// route layers then do not apply. Framework adapters call it.
func WithRoute(ctx context.Context, pattern string) context.Context {
	return context.WithValue(ctx, routeContextKey{}, pattern)
}

// RouteFromContext returns the route stored by [WithRoute]. ok is false when
// none was stored or it is empty (no route matched).
func RouteFromContext(ctx context.Context) (pattern string, ok bool) {
	pattern, _ = ctx.Value(routeContextKey{}).(string)
	return pattern, pattern != ""
}

// Route returns a KeyFunc that keys a request by the route the router
// matched, so every request to one endpoint shares a quota whatever its path
// parameters, and the number of keys is bounded by the number of routes. The
// key is the pattern plus the method only where the route names one:
// "POST /login" for a route registered for POST, "/login" for one that
// serves every method (http.ServeMux's Handle("/login", ...), chi's Handle),
// so that changing the method never buys a fresh quota. A GET route serving
// HEAD counts HEAD with GET, as the router serves it.
//
// The route comes from [WithRoute] (framework adapters), failing that from
// r.Pattern, set by http.ServeMux when it routes the request and by the
// Limiter before routing with [WithServeMux]. A request the router matched
// no route for returns an error wrapping [ErrNoKey]: a route layer does not
// apply to it. A request with no routing information at all returns
// [ErrNoRoute], a configuration error.
func Route() KeyFunc { return routeKey }

// routeKey is the KeyFunc Route returns.
func routeKey(r *http.Request) (string, error) {
	if p, routed := r.Context().Value(routeContextKey{}).(string); routed {
		if p == "" {
			return "", errRouteUnmatched
		}
		return p, nil
	}
	if r.Pattern != "" {
		return normalizePattern(r.Pattern), nil
	}
	return "", ErrNoRoute
}

// normalizePattern writes the space between a ServeMux pattern's method and
// path as one space ("POST\t /x" is "POST /x"), allocating only when the
// pattern was written otherwise.
func normalizePattern(p string) string {
	i := strings.IndexAny(p, " \t")
	if i < 0 || strings.IndexByte(p[:i], '/') >= 0 {
		return p
	}
	if p[i] == ' ' && i+1 < len(p) && p[i+1] != ' ' && p[i+1] != '\t' {
		return p
	}
	return p[:i] + " " + strings.TrimLeft(p[i:], " \t")
}

// RawPath returns a KeyFunc that keys a request by its method and URL path,
// "GET /users/42", using at most the first [MaxRawPathKeyLen] bytes of the
// path. Prefer [Route]: every distinct path is a distinct key, so a client
// requesting random paths creates keys without bound (the store's capacity
// caps the memory, at the price of evicting other keys). Use it only for a
// handful of known paths, or behind a router that rejects unknown ones.
//
// The method is written as its class, so that a client cannot buy a quota
// per spelling from a handler that serves any method: HEAD is GET (net/http
// serves HEAD with the GET handler), the other methods of RFC 9110 and
// RFC 5789 (POST, PUT, PATCH, DELETE, OPTIONS, CONNECT, TRACE) are
// themselves, and every other method, lower-case spellings included, is
// "OTHER". A handler that serves every method is thus limited per class, at
// most nine quotas per path; key by the path alone (a KeyFunc of your own)
// to limit it as a whole.
func RawPath() KeyFunc {
	return func(r *http.Request) (string, error) {
		var path string
		if r.URL != nil {
			path = r.URL.Path
		}
		if len(path) > MaxRawPathKeyLen {
			path = path[:MaxRawPathKeyLen]
		}
		return methodClass(r) + " " + path, nil
	}
}

// methodClass returns r's method as RawPath keys it.
func methodClass(r *http.Request) string {
	switch m := r.Method; m {
	case "", http.MethodGet, http.MethodHead:
		return http.MethodGet
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "OTHER"
}

// ---------------------------------------------------------------------------
// Composite and constant keys

// Composite returns a KeyFunc whose key combines the keys of all fns, e.g.
// per user per route. Every part must produce a key: if one returns an error,
// the composite returns that error unchanged, so a missing part ([ErrNoKey])
// skips the layer instead of charging a bucket shared by everyone missing it.
// A part returning ("", nil) yields [ErrEmptyKey].
//
// The encoding is unambiguous: each part is written as its length in
// decimal, a colon, and the part ("3:a|b" + "1:c"), so ("a|b", "c") and
// ("a", "b|c") never share a key.
//
// Composite panics if fns is empty or contains nil.
func Composite(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 {
		panic("ratelimit: Composite needs at least one KeyFunc")
	}
	for i, fn := range fns {
		if fn == nil {
			panic(fmt.Sprintf("ratelimit: Composite KeyFunc %d is nil", i))
		}
	}
	fns = append([]KeyFunc(nil), fns...)
	return func(r *http.Request) (string, error) {
		var stack [4]string
		parts := stack[:0]
		size := 0
		for _, fn := range fns {
			k, err := fn(r)
			if err != nil {
				return "", err
			}
			if k == "" {
				return "", ErrEmptyKey
			}
			parts = append(parts, k)
			size += len(k) + 1 + decimalDigits(len(k))
		}
		var b strings.Builder
		b.Grow(size)
		var num [20]byte
		for _, k := range parts {
			b.Write(strconv.AppendInt(num[:0], int64(len(k)), 10))
			b.WriteByte(':')
			b.WriteString(k)
		}
		return b.String(), nil
	}
}

func decimalDigits(n int) int {
	l := 1
	for n >= 10 {
		n /= 10
		l++
	}
	return l
}

// FirstOf returns a KeyFunc that keys a request by the first of fns that
// applies to it: FirstOf(User(), ClientIP()) keys signed-in users by user
// and everyone else by client IP, so leaving the user out (or the API key)
// never escapes the layer. A part returning an error wrapping [ErrNoKey] is
// passed over; any other error is returned at once (a key error never falls
// through to a weaker key). When no part applies, FirstOf returns [ErrNoKey].
//
// Each key is prefixed with the index of the part that produced it ("0:" +
// user, "1:" + address), so a user named like an address never shares that
// address's bucket.
//
// FirstOf panics if fns is empty or contains nil.
func FirstOf(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 {
		panic("ratelimit: FirstOf needs at least one KeyFunc")
	}
	for i, fn := range fns {
		if fn == nil {
			panic(fmt.Sprintf("ratelimit: FirstOf KeyFunc %d is nil", i))
		}
	}
	fns = append([]KeyFunc(nil), fns...)
	return func(r *http.Request) (string, error) {
		for i, fn := range fns {
			k, err := fn(r)
			if err != nil {
				if errors.Is(err, ErrNoKey) {
					continue
				}
				return "", err
			}
			if k == "" {
				return "", ErrEmptyKey
			}
			return strconv.Itoa(i) + ":" + k, nil
		}
		return "", ErrNoKey
	}
}

// Global returns a KeyFunc that keys every request by the constant name: one
// quota shared by all requests (a global cap in front of a fragile backend).
// Global panics if name is empty.
func Global(name string) KeyFunc {
	if name == "" {
		panic("ratelimit: Global name is empty")
	}
	return func(*http.Request) (string, error) { return name, nil }
}
