// Package ratelimit is rate-limiting middleware for Go HTTP services: per-key
// quotas (per client IP, API key, user, route, or a combination), several
// limits decided and charged atomically, standard response headers, and a
// 429 with an honest Retry-After for a client over its quota. It is correct
// under concurrency, bounded in memory, and moves from one process to a
// Redis fleet by changing the store, not the handlers.
//
// # The common case in one line
//
// [LimitByIP], [LimitByHeader] and [LimitByUser] return a ready
// func(http.Handler) http.Handler:
//
//	http.ListenAndServe(":8080", ratelimit.LimitByIP(100, time.Minute)(mux))
//
// Each one is a [Limiter] with one layer; [LimitOption] values reach the rest:
// the Options [New] takes, the [IPOption] values that name trusted proxies,
// and [LayerName]. They panic at start-up on an invalid argument; build with
// [New] to get an error instead.
//
// # Layers
//
// A [Limiter] is built once with [New] from one or more [Layer] values, each a
// [KeyFunc] (whose quota a request is charged to) and a core.Rule (the quota:
// Limit units per Window under an algorithm):
//
//	limiter, err := ratelimit.New([]ratelimit.Layer{
//		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100).Named("per-ip")},
//		{Key: ratelimit.User(), Rule: core.PerMinute(20).Named("per-user")},
//	}, ratelimit.WithHeaders(ratelimit.AllHeaders))
//	if err != nil {
//		log.Fatal(err) // every misconfiguration knowable now is reported here
//	}
//	http.ListenAndServe(":8080", limiter.Handler(mux))
//
// Every layer whose key applies to a request is decided in one atomic store
// call: the request is admitted only if every such layer admits it, and a
// request refused by one layer charges no layer. A layer whose key does not
// apply ([ErrNoKey]: an anonymous request under [User]) is skipped for that
// request; a key that cannot be determined safely (a forged or garbage
// X-Forwarded-For, see [ClientIP]) is an error, answered 400 by default, and
// never charged to a shared key.
//
// Key functions: [ClientIP] (the connecting peer; forwarded headers only from
// trusted proxies; IPv6 grouped by /64), [Header] (an API key, optionally
// hashed), [User] (the identity the application's authentication stored with
// [WithUser]), [Route] (the matched route pattern), [RawPath], [Composite]
// and [Global].
//
// # Responses and headers
//
// An admitted request gets X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (Unix epoch seconds; see [WithResetDelta]) from its most
// restrictive layer, or the IETF RateLimit-Policy and RateLimit fields with
// one item per layer, or both ([WithHeaders]). A refused request is answered
// 429 Too Many Requests with Retry-After in whole seconds, rounded up, never
// early; [WithProblemDetails] makes the body RFC 9457 problem details and
// [WithDeniedHandler] replaces it. Errors (a key error, a store failure) go to
// [WithErrorHandler]; when the store fails, requests are served (the default)
// or refused with 503 ([WithFailClosed]).
//
// [Limiter.Handler] wraps a handler. Framework adapters and custom flows use
// [Limiter.Admit], which does everything but call the next handler, or its
// parts [Limiter.Decide], [Limiter.WriteHeaders], [Limiter.Refuse] and
// [Limiter.Wait].
//
// # Never silently unlimited
//
// A limit that stops applying is refused or reported, never waved through:
// a [Route] layer that sees no route, equally named policies met at request
// time and a memory store too small for a request are configuration errors
// ([ErrConfig], 500); a full KeepActive store refuses with 429; a layer may
// refuse a request without its key ([NoKeyRefuse]) or fall back to another
// ([FirstOf]); and each such condition, and fail-open serving, is logged once
// ([WithLogger]).
//
// # Beyond request rates
//
//   - Concurrency limits: a layer with [Layer.InFlight] admits at most N
//     requests per key in flight, composed with rate layers in one Limiter.
//   - Runtime reloads: [Limiter.SetRules] replaces rules while serving,
//     keeping every key's usage.
//   - Idempotent retries: [NewIdempotency] charges a retry that carries the
//     same Idempotency-Key once.
//   - Refunds and peeks: [WithRefund] counts only failed (or only
//     successful) requests; [Limiter.Peek] and [Limiter.Reset] inspect and
//     forget a key's state.
//   - The decision in the handler: [Limiter.HandlerWithResult] and
//     [ResultFromContext].
//   - Outbound calls: [NewTransport] is an http.RoundTripper that keeps
//     requests to a rate-limited API within the same rules and pauses at the
//     server's word (Retry-After, RateLimit).
//
// # The model underneath
//
// Package github.com/limitry/ratelimit/core holds what has no HTTP in it:
// rules and their algorithms (token bucket, leaky bucket, fixed window,
// sliding window log and counter), core.ParseRate for rates written in
// configuration ("100/min", "1000-H"), clocks (a fake one for tests), the
// Store interface with its atomic batches, the bounded in-memory store, and
// observers. This module requires nothing beyond the standard library and
// golang-lru.
//
// # Adapters
//
// Frameworks and backends live in modules of their own, so an application
// downloads only those it uses:
//
//   - github.com/limitry/ratelimit/adapters/chilimit: chi middleware for
//     r.Use and r.With, handing chi's route pattern to [Route].
//   - github.com/limitry/ratelimit/adapters/echolimit: an echo.MiddlewareFunc,
//     handing echo's route path to Route.
//   - github.com/limitry/ratelimit/adapters/ginlimit: a gin.HandlerFunc,
//     handing gin's route path to Route.
//   - github.com/limitry/ratelimit/adapters/redisstore: a Store on Redis
//     (single node, Sentinel, Cluster), shared by a fleet, with quota leases
//     and a refused-key cache for hot keys, concurrency slots and a
//     ReplayStore for idempotency keys.
//   - github.com/limitry/ratelimit/adapters/promlimit: Prometheus metrics, as
//     a core.Observer.
package ratelimit
