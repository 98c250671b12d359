package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/limitry/ratelimit/core"
)

// Layer names of the one-liners, unless [LayerName] sets another.
const (
	// NamePerIP is the layer name of [LimitByIP].
	NamePerIP = "per-ip"
	// NamePerKey is the layer name of [LimitByHeader].
	NamePerKey = "per-key"
	// NamePerUser is the layer name of [LimitByUser].
	NamePerUser = "per-user"
)

// LimitOption configures a one-liner ([LimitByIP], [LimitByHeader],
// [LimitByUser]). It is one of:
//
//   - an [Option], passed through to the Limiter: [WithStore],
//     [WithHeaders], [WithClock], [WithObserver], [WithDeniedHandler],
//     [WithErrorHandler], [WithSkip], ... every Option [New] takes;
//   - an [IPOption], passed to the [ClientIP] key function that finds the
//     client: [TrustedProxyCIDRs], [TrustedProxies], [TrustedHops],
//     [FromHeader], [IPv6Prefix], [IPv4Prefix];
//   - [LayerName], the name of the one-liner's layer.
//
// No other type implements it.
type LimitOption interface {
	applyLimit(*limitConfig)
}

// limitConfig is what a one-liner's LimitOptions set.
type limitConfig struct {
	opts   []Option
	ipOpts []IPOption
	name   string
	err    error
}

func (o Option) applyLimit(c *limitConfig)   { c.opts = append(c.opts, o) }
func (o IPOption) applyLimit(c *limitConfig) { c.ipOpts = append(c.ipOpts, o) }

type layerName string

func (n layerName) applyLimit(c *limitConfig) {
	if n == "" && c.err == nil {
		c.err = errors.New("ratelimit: LayerName is empty")
	}
	c.name = string(n)
}

// LayerName names the layer of a one-liner, instead of [NamePerIP],
// [NamePerKey] or [NamePerUser]. The name appears in the IETF RateLimit
// headers and in metrics, and namespaces the layer's keys in the store: give
// two one-liners that share a store ([WithStore]) distinct names unless they
// are meant to share their quotas. It must be a valid core.Rule Name.
func LayerName(name string) LimitOption { return layerName(name) }

// LimitByIP returns middleware that admits at most limit requests per window
// from each client IP, the common case in one line:
//
//	mux := http.NewServeMux()
//	...
//	http.ListenAndServe(":8080", ratelimit.LimitByIP(100, time.Minute)(mux))
//
// or r.Use(ratelimit.LimitByIP(100, time.Minute)) on a router that takes
// middleware. The client is found by [ClientIP] with the IPOptions among
// opts: without any, it is the connecting peer (r.RemoteAddr) and no header
// is believed, which is right for a server reached directly. Behind a load
// balancer or CDN, name it, so that forwarded headers are believed from it
// and from nobody else:
//
//	ratelimit.LimitByIP(100, time.Minute, ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
//
// An IPv6 client is keyed by its /64 unless [IPv6Prefix] says otherwise. A
// request whose client cannot be determined safely (a garbage
// X-Forwarded-For entry from a trusted proxy) is a key error, answered 400
// Bad Request by default, never charged to another key.
//
// The middleware is a [Limiter] with one layer named [NamePerIP] (see
// [LayerName]): a token bucket holding limit requests, refilled over window,
// so a client may burst up to limit requests and is then admitted at
// limit/window. It writes the X-RateLimit-* headers and answers a client over
// its quota 429 Too Many Requests with Retry-After. The Options among opts
// reach everything else a Limiter does: a shared store ([WithStore]), header
// sets ([WithHeaders]), handlers, a clock for tests. It keeps its state in a
// private in-memory store unless WithStore is given. Each call builds a
// new Limiter with its own quotas: call it once per limit, not per request.
//
// LimitByIP panics if its arguments are invalid, as http.ServeMux.Handle
// does on a bad pattern, so that a misconfigured limit stops the program at
// start-up instead of serving unlimited: limit or window not positive or too
// large (the panic value is an error wrapping core.ErrInvalidRule), an
// invalid IPOption (wrapping [ErrInvalidKeyConfig]) such as a malformed CIDR
// or FromHeader without trusted proxies, an invalid Option (any error [New]
// returns), an empty or invalid LayerName, or a nil LimitOption. To have an error instead (limits read from
// configuration), parse them with core.ParseRate, whose rules always fit, or
// build the Limiter with [New]; LimitByIP(n, w) is the same as
//
//	l, err := ratelimit.New([]ratelimit.Layer{{
//		Key:  ratelimit.MustClientIP(),
//		Rule: core.Rule{Name: ratelimit.NamePerIP, Limit: n, Window: w},
//	}})
//	... l.Handler
func LimitByIP(limit int64, window time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	return oneLiner("LimitByIP", NamePerIP, limit, window, opts, func(ip KeyFunc) KeyFunc { return ip })
}

// LimitByHeader returns middleware that admits at most limit requests per
// window for each value of the named request header, typically an API key:
//
//	ratelimit.LimitByHeader("X-API-Key", 1000, time.Hour)
//
// The value is hashed before it is used as a key (see [HashKey]), so that no
// credential reaches the store, a log or a metric. A request without the
// header, or with an empty one, is not let through unlimited: it is limited
// by its client IP, at the same rate, as [LimitByIP] would limit it (with the
// IPOptions among opts). Hashed values and client addresses never share a
// key. Values of any length are accepted; the server's header size limit
// (http.Server.MaxHeaderBytes) bounds them.
//
// The header is taken as the client says it: a client that invents a new
// value for every request gets a new quota every time. Mount the middleware
// behind the authentication that rejects unknown keys, so that only valid
// keys reach it, or use [LimitByUser] with the identity the authentication
// establishes.
//
// The layer is named [NamePerKey] (see [LayerName]); otherwise it is
// [LimitByIP] in every respect, its options and its panics included.
// LimitByHeader also panics if name is not a valid header name (empty, or
// with a space or other character outside RFC 9110's token), which no
// request could carry, or one net/http's server takes out of r.Header
// (Host, Transfer-Encoding, Trailer): every request would be limited by its
// address alone.
func LimitByHeader(name string, limit int64, window time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	if !validHeaderName(strings.TrimSpace(name)) {
		panic(fmt.Errorf("%w: LimitByHeader: %q is not a valid header name", ErrInvalidKeyConfig, name))
	}
	if c := http.CanonicalHeaderKey(strings.TrimSpace(name)); serverMoved(c) {
		panic(fmt.Errorf("%w: LimitByHeader: net/http's server takes %q out of r.Header, so every request would be limited by its address alone", ErrInvalidKeyConfig, c))
	}
	hdr := Header(name, HashKey())
	return oneLiner("LimitByHeader", NamePerKey, limit, window, opts, func(ip KeyFunc) KeyFunc {
		return func(r *http.Request) (string, error) {
			k, err := hdr(r)
			if errors.Is(err, ErrNoKey) {
				// A 32-digit hex hash never equals an address
				// ("192.0.2.1") or a network ("2001:db8::/64").
				return ip(r)
			}
			return k, err
		}
	})
}

// LimitByUser returns middleware that admits at most limit requests per
// window for each authenticated user: the identity the application's
// authentication middleware stores with [WithUser], which must therefore run
// before it:
//
//	auth(ratelimit.LimitByUser(100, time.Minute)(mux))
//
// An anonymous request (no user in its context) is not let through
// unlimited: it is limited by its client IP, at the same rate, as [LimitByIP]
// would limit it (with the IPOptions among opts). A user whose identity looks
// like an address never shares the quota of that address: user keys are
// prefixed "user:".
//
// The layer is named [NamePerUser] (see [LayerName]); otherwise it is
// [LimitByIP] in every respect, its options and its panics included. To
// limit both per IP and per user, atomically, use [New] with two layers.
func LimitByUser(limit int64, window time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	return oneLiner("LimitByUser", NamePerUser, limit, window, opts, func(ip KeyFunc) KeyFunc {
		return func(r *http.Request) (string, error) {
			if u, ok := UserFromContext(r.Context()); ok {
				return "user:" + u, nil
			}
			return ip(r)
		}
	})
}

// serverMoved reports whether net/http's server takes the header name
// (canonical) out of r.Header: Host to r.Host, Transfer-Encoding to
// r.TransferEncoding, Trailer to r.Trailer. A key read from r.Header by
// that name would never be found.
func serverMoved(name string) bool {
	return name == "Host" || name == "Transfer-Encoding" || name == "Trailer"
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// oneLiner builds the Limiter of a one-liner whose key is made by key from
// the client-IP key function, and returns its Handler. It panics on any
// configuration error.
func oneLiner(fn, name string, limit int64, window time.Duration, opts []LimitOption, key func(ip KeyFunc) KeyFunc) func(http.Handler) http.Handler {
	c := limitConfig{name: name}
	for i, o := range opts {
		if o == nil {
			panic(fmt.Errorf("ratelimit: %s: LimitOption %d is nil", fn, i))
		}
		o.applyLimit(&c)
	}
	if c.err != nil {
		panic(c.err)
	}
	ip, err := ClientIP(c.ipOpts...)
	if err != nil {
		panic(err)
	}
	l, err := New([]Layer{{
		Key:  key(ip),
		Rule: core.Rule{Name: c.name, Limit: limit, Window: window},
	}}, c.opts...)
	if err != nil {
		panic(err)
	}
	return l.Handler
}
