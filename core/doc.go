// Package core is the rate limiter behind github.com/limitry/ratelimit: rules,
// algorithms, clocks, stores and the Limiter that ties them together. It has no
// HTTP code and imports only the standard library and golang-lru.
//
// # Overview
//
// A [Rule] describes one quota: Limit units per Window, decided by an
// [Algorithm]. [NewPolicy] validates a Rule once and precomputes what the
// algorithms need; every later step works with the resulting [*Policy].
//
// A [Store] keeps per-key state and decides batches of [Request] values
// atomically: if any request in a batch is refused, none is charged. The
// in-memory [MemoryStore] is sharded and bounded by an LRU; the Redis store
// lives in adapters/redisstore. Any Store can prove that it decides like the
// memory store by running the conformance suite in core/storetest.
//
// A [Limiter] reads its [Clock] once per decision (none in Limiter.TakeAt,
// which is given the time), asks its Store, and reports to an optional
// [Observer]; with an Observer it reads the Clock once more, after the store
// returns, for the latency. Limiter.Allow and Limiter.AllowN decide one key
// under one rule (or a rule chosen per key by a [Resolver]); Limiter.Take
// decides a layered batch.
//
// # Time
//
// Algorithms are pure functions of (state, policy, cost, now), with now in
// Unix nanoseconds: nothing in an algorithm reads the wall clock. A clock that
// steps backwards, and runs on from there, never credits quota: every
// algorithm treats a time earlier than one it has already seen for a key as
// that later time (or stricter). Times that keep alternating by more than
// ClockTolerance do not run on: see Store.
// A time at most [ClockTolerance] behind the key's state (a caller that read
// the clock before another whose decision went first) is decided as the
// state's time, with nothing moved back.
//
// # Errors
//
// Invalid rules fail in NewPolicy or New with an error that names the field
// ([ErrInvalidRule]). A cost <= 0 is [ErrInvalidCost]; a cost above the
// policy's capacity is refused with [ErrCostExceedsCapacity] and charges
// nothing. Backend failures are returned wrapped, distinct from a refusal: a
// refusal is a Decision with Allowed false and a nil error.
package core
