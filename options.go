package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	"github.com/limitry/ratelimit/core"
)

// DefaultMaxWaiting is the number of shaped requests (see [WithMaxWaiting])
// that may wait at once when no option sets it.
const DefaultMaxWaiting = 1024

// Option configures a [Limiter]. Options are applied in order by [New]; an
// invalid option makes New return an error.
type Option func(*config)

// config is what the options set. It is read-only once New returns.
type config struct {
	store        core.Store
	clock        core.Clock
	observer     core.Observer
	dryRun       bool
	failClosed   bool
	errHandler   func(http.ResponseWriter, *http.Request, error)
	denied       func(http.ResponseWriter, *http.Request, *Result)
	problem      bool
	skips        []func(*http.Request) bool
	allow        []allowList
	cost         func(*http.Request) int64
	headers      HeaderSet
	resetDelta   bool
	partitionKey bool
	maxWaiting   int
	logger       *slog.Logger // nil: silent
	mux          *http.ServeMux
	slots        core.SlotStore
	refund       *refundConfig // nil: no refunds (see WithRefund)
	errs         []error
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("ratelimit: "+format, args...))
}

func defaultConfig() config {
	return config{headers: XRateLimitHeaders, maxWaiting: DefaultMaxWaiting, logger: slog.Default()}
}

// WithServeMux tells the Limiter the *http.ServeMux its handler wraps, so
// that a Limiter mounted around the whole mux, before routing, can key
// [Route] layers and apply [Layer.Routes]: for each request it asks
// mux.Handler(r) for the pattern the mux will match and sets r.Pattern to
// it, as the mux itself does when it serves r (replacing the pattern of an
// outer mux the Limiter is mounted under, as in
// outer.Handle("/api/", l.Handler(mux)); a pattern the mux matches nothing
// for is kept, as for a Limiter inside its own mux behind
// http.StripPrefix). A request the mux matches no pattern for, and that
// carries no pattern of its own (a 404, a 405, a redirect), is not keyed by
// route: route layers do not apply to it (the mux answers it). Without this
// option, or a framework adapter, a Route layer mounted before routing is a
// configuration error (see [ErrConfig]), never a skip.
func WithServeMux(mux *http.ServeMux) Option {
	return func(c *config) {
		if mux == nil {
			c.fail("WithServeMux: nil mux")
		}
		c.mux = mux
	}
}

// WithStore sets the Store that holds the per-key state, such as a Redis
// store shared by a fleet. The default value is a new [core.MemoryStore]
// with the default configuration, private to the Limiter (it reports
// evictions to the Observer set by [WithObserver], if any).
func WithStore(s core.Store) Option {
	return func(c *config) {
		if s == nil {
			c.fail("WithStore: nil store")
		}
		c.store = s
	}
}

// WithClock sets the clock decisions are made at and X-RateLimit-Reset is
// computed from. The default value is [core.SystemClock]. Tests use a
// [core.FakeClock]. Shaping delays (see [Limiter.Wait]) are waited on real
// timers whatever the clock.
func WithClock(clk core.Clock) Option {
	return func(c *config) {
		if clk == nil {
			c.fail("WithClock: nil clock")
		}
		c.clock = clk
	}
}

// WithObserver sets an Observer that receives every decision, store error
// and eviction (for metrics and logs). The default value is none, which costs
// nothing.
func WithObserver(o core.Observer) Option {
	return func(c *config) {
		if o == nil {
			c.fail("WithObserver: nil observer")
		}
		c.observer = o
	}
}

// WithDryRun makes the middleware decide without enforcing: every request is
// decided and charged when admitted, rate-limit headers are written, the
// Observer sees each decision with DecisionEvent.DryRun set, but no request
// is refused or delayed. Errors still reach the error handler (see
// [WithErrorHandler]); unless it writes a response, the request is served.
// Use it to try limits on production traffic before enforcing them.
func WithDryRun() Option { return func(c *config) { c.dryRun = true } }

// WithFailClosed refuses requests when the store fails (a Redis outage):
// after the error handler, the middleware answers 503 Service Unavailable
// with a short text body. A full [core.MemoryConfig.KeepActive] store is not
// a failure: its refusals are answered 429 whatever the fail policy, and so
// are configuration errors answered 500.
//
// The default is fail-open: a request the store could not decide is served,
// without rate-limit headers, after the error handler has seen the error.
// Fail-open keeps the service up when the limiter's backend is down, at the
// price of not limiting during the outage (logged once, see [WithLogger]);
// choose fail-closed when the limiter protects something that must never be
// overrun. A store error met once the request's own context has ended (the
// client went away) is neither: the request is dropped without a response.
// Only the request's context decides that: a context.Canceled from a store
// or Resolver while it is live is a store failure.
func WithFailClosed() Option { return func(c *config) { c.failClosed = true } }

// WithErrorHandler sets a function called for every error the middleware
// meets: a key error (a KeyFunc error other than ErrNoKey, such as
// ErrInvalidClientIP), a cost below 1, a missing required key (wrapping
// [ErrMissingKey]), a configuration error met at request time (wrapping
// [ErrConfig]), a full store (wrapping core.ErrStoreFull), a Resolver error,
// or a store or slot store error (wrapping [ErrStoreFailure]; a slot store
// that fails open beside rate layers, which then decide, too, whether they
// admit or refuse the request). It runs before the default action. If it
// writes a response (calls WriteHeader or Write), the request stops there
// (a request it stops after rate layers admitted it is given back their
// charge, as the fail-closed policy would have charged nothing); otherwise the default action follows: 400 Bad Request with a
// short text body for a request error, 401 for a missing required key, 500
// for a configuration error, 429 with Retry-After for a full store, the fail
// policy (see [WithFailClosed]) for a store error, and in dry-run mode the
// request is served. A request whose own context ended before the store
// answered is not an error and never reaches it. The default value is none.
//
// Refusals are not errors: they go to the denied handler (see
// [WithDeniedHandler]).
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) {
		if h == nil {
			c.fail("WithErrorHandler: nil handler")
		}
		c.errHandler = h
	}
}

// WithDeniedHandler replaces the response to a refused request: a request
// over its quota (Result.Err is nil), one whose cost exceeds a layer's
// capacity (Result.Err wraps core.ErrCostExceedsCapacity; by default 413),
// and a shaped request that found the waiting room full (Result.Err is
// [ErrTooManyWaiting]). It receives the Result with the decisions of every
// applied layer; the refusing ones have Refused set. When it runs, the
// rate-limit headers and, for a request over its quota, Retry-After are
// already set on w; it must write the status and body. The Result and its
// Layers remain valid after the handler returns. The default value writes
// 429 Too Many Requests (413 Content Too Large for a cost above capacity)
// with a short text body, or problem details with [WithProblemDetails].
func WithDeniedHandler(h func(w http.ResponseWriter, r *http.Request, res *Result)) Option {
	return func(c *config) {
		if h == nil {
			c.fail("WithDeniedHandler: nil handler")
		}
		c.denied = h
	}
}

// WithProblemDetails makes the default refusal an RFC 9457 problem details
// document (Content-Type application/problem+json) instead of short text.
// A request over its quota gets the type proposed by the IETF RateLimit
// draft:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Too Many Requests","status":429,
//	 "detail":"Quota exceeded; retry after 3 seconds.",
//	 "violated-policies":["per-ip"]}
//
// where violated-policies lists the names of the refusing layers. A request
// whose cost exceeds a layer's capacity gets type "about:blank" with status
// 413, and one refused by a full store (core.MemoryConfig.KeepActive) type
// "about:blank" with status 429. With [WithDeniedHandler] set, the denied
// handler answers the quota refusals and the 413 instead; a full store's
// 429 stays problem details (the error handler, see [WithErrorHandler], may
// write it instead).
func WithProblemDetails() Option { return func(c *config) { c.problem = true } }

// WithSkip exempts requests for which skip returns true (health checks,
// internal endpoints): they are not decided, not charged and get no
// rate-limit headers. Several calls accumulate; a request is skipped if any
// predicate returns true. skip must be safe for concurrent use.
func WithSkip(skip func(r *http.Request) bool) Option {
	return func(c *config) {
		if skip == nil {
			c.fail("WithSkip: nil function")
			return
		}
		c.skips = append(c.skips, skip)
	}
}

// WithSkipCIDRs exempts requests whose connecting peer (r.RemoteAddr) is
// inside one of cidrs, such as internal networks or monitoring hosts. Entries
// are CIDR prefixes ("10.0.0.0/8", "2001:db8::/32") or bare addresses (a
// single host); an unparseable entry is a construction error, and so are
// entries that together cover every IPv4 or every IPv6 address (no client
// of that family would be limited). IPv4-mapped IPv6 entries are treated as
// the IPv4 networks they map.
//
// Only the peer address is used, never a forwarded header, so a client can
// never get itself allowlisted by forging X-Forwarded-For. Behind a proxy
// the peer is the proxy: use [WithSkipCIDRsFrom] with the [ClientIP] key
// function that knows your trusted proxies. The first request exempted here
// that carries a forwarded header (X-Forwarded-For, Forwarded, X-Real-IP)
// is logged (see [WithLogger]): its peer is likely a proxy, whose clients
// would all be exempt.
func WithSkipCIDRs(cidrs ...string) Option {
	return func(c *config) { c.addAllow("WithSkipCIDRs", nil, cidrs) }
}

// WithSkipCIDRsFrom is like [WithSkipCIDRs] with the client address given by
// clientIP, a key function made by [ClientIP] (typically the same one the
// per-IP layer uses), so that behind trusted proxies the allowlist sees the
// real client while forged headers from untrusted peers are ignored exactly
// as ClientIP ignores them. A request is skipped only when the whole network
// clientIP keys it by lies inside an entry: with the default IPv6 /64
// grouping, a single-host IPv6 entry never matches (use [IPv6Prefix](128)
// in the key function given here). A key error, or a key that is not an
// address or network, skips nothing.
func WithSkipCIDRsFrom(clientIP KeyFunc, cidrs ...string) Option {
	return func(c *config) {
		if clientIP == nil {
			c.fail("WithSkipCIDRsFrom: nil key function")
			return
		}
		c.addAllow("WithSkipCIDRsFrom", clientIP, cidrs)
	}
}

func (c *config) addAllow(opt string, ip KeyFunc, cidrs []string) {
	if len(cidrs) == 0 {
		c.fail("%s: no CIDRs", opt)
		return
	}
	a := allowList{ip: ip}
	var v4, v6 []netip.Prefix
	for _, s := range cidrs {
		p, err := parsePrefix(s)
		if err != nil {
			c.fail("%s: invalid CIDR %q: %v", opt, s, err)
			return
		}
		a.prefixes = append(a.prefixes, p)
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	// An allowlist of every address of a family would limit none of its
	// clients: never silently.
	if coversAll(v4, 32) {
		c.fail("%s: the entries cover every IPv4 address, so no IPv4 client would be limited; list the networks to exempt", opt)
		return
	}
	if coversAll(v6, 128) {
		c.fail("%s: the entries cover every IPv6 address, so no IPv6 client would be limited; list the networks to exempt", opt)
		return
	}
	c.allow = append(c.allow, a)
}

// parsePrefix parses a CIDR prefix or a bare address, masks it and reads
// an IPv4-mapped or NAT64 prefix as the IPv4 prefix it holds
// (prefixAsRead).
func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	if strings.IndexByte(s, '/') >= 0 {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, err
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, err
		}
		if a.Zone() != "" {
			return p, errors.New("zones are not allowed")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if err := canonicalPrefix(p); err != nil {
		return p, err
	}
	return prefixAsRead(p), nil
}

// WithCost sets the cost of each request for layers without a Cost function
// of their own (see [Layer]), e.g. by endpoint weight or payload size. The
// default value charges 1 per request. A cost below 1 is a request error:
// the error handler sees an error wrapping core.ErrInvalidCost and the
// default answer is 400 Bad Request. A cost above a layer's capacity is
// refused with 413 Content Too Large (see [WithDeniedHandler]). cost must be
// safe for concurrent use; it is called once per request.
func WithCost(cost func(r *http.Request) int64) Option {
	return func(c *config) {
		if cost == nil {
			c.fail("WithCost: nil function")
		}
		c.cost = cost
	}
}

// WithHeaders chooses which rate-limit header sets are written (see
// [HeaderSet]). The default value is [XRateLimitHeaders]. Retry-After is
// written on every 429 whatever the set, [NoHeaders] included.
func WithHeaders(set HeaderSet) Option {
	return func(c *config) {
		if set&^AllHeaders != 0 {
			c.fail("WithHeaders: unknown header set %#x", uint8(set))
		}
		c.headers = set
	}
}

// WithResetDelta writes X-RateLimit-Reset as the number of seconds until the
// quota is whole again (rounded up) instead of the default, the Unix epoch
// second at which it is (rounded up), as GitHub and most libraries send it.
func WithResetDelta() Option { return func(c *config) { c.resetDelta = true } }

// WithPartitionKey adds the pk parameter to every item of the IETF
// RateLimit-Policy and RateLimit fields: a Byte Sequence holding the first
// 12 bytes of the SHA-256 of the layer's key, so that a client can tell which
// quota partition it is charged to. The raw key (an IP address, a user id,
// an API key) never appears. The hash is not keyed: it hides the key from
// casual readers and logs but a guessable key (an IPv4 address) can be found
// by trying candidates. It is off by default because it costs a hash and an
// allocation per request; it has no effect without [IETFHeaders].
func WithPartitionKey() Option { return func(c *config) { c.partitionKey = true } }

// WithMaxWaiting bounds the number of requests that may wait at once for a
// shaping delay (a LeakyBucket layer with Rule.MaxDelay; see [Limiter.Wait]).
// A request to a shaping layer that finds n requests already waiting (or
// being decided for a shaping layer) is refused with 429 (Result.Err is
// [ErrTooManyWaiting], reported to the Observer's ObserveError under the
// request's shaping policies). Admit and Handler take the waiting slot before
// charging the request, so such a refusal charges nothing, and its
// Retry-After is when every request waiting now has been served: the
// longest MaxDelay of the shaping layers and of the refused request's own
// policies, or later for requests decided under rules SetRules has since
// replaced (a Resolver that picks shaping policies should list them, see
// core.PolicyLister, so that their delays count for every request). After
// [Limiter.Decide], [Limiter.Wait] can only count the waiters after the
// charge: its refusal keeps the charge (the store cannot take one back) and
// its Retry-After is the request's delay, or when the requests waiting
// through Wait are served if that is later. n must be at least 1; the
// default value is [DefaultMaxWaiting].
func WithMaxWaiting(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.fail("WithMaxWaiting: n must be at least 1, got %d", n)
		}
		c.maxWaiting = n
	}
}

// WithSlotStore sets where the in-flight slots of concurrency layers (see
// [Layer.InFlight]) are kept, such as a Redis-backed store shared by a
// fleet. The default value is a new core.SlotTable of the Limiter's own,
// when a layer is a concurrency layer. A Limiter without concurrency
// layers ignores it.
func WithSlotStore(s core.SlotStore) Option {
	return func(c *config) {
		if s == nil {
			c.fail("WithSlotStore: nil SlotStore")
			return
		}
		c.slots = s
	}
}
