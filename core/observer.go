package core

import "time"

// Observer receives what a Limiter and a MemoryStore do, for metrics and
// logs. Its methods are called synchronously on the request path and must be
// fast and safe for concurrent use. A Limiter without an Observer does no
// extra work, not even reading the clock for latency.
//
// Embed NopObserver to implement only some methods.
type Observer interface {
	// ObserveDecision is called once per request of every decided batch.
	ObserveDecision(DecisionEvent)
	// ObserveError is called when a store fails (with any error but
	// ErrCostExceedsCapacity, a refusal), unless the error is the caller's
	// context ending: a client that went away is no store failure. The
	// HTTP middleware also reports through it the requests it refuses
	// before any store decides them because too many requests are waiting
	// for a shaping delay (ratelimit.ErrTooManyWaiting).
	ObserveError(ErrorEvent)
	// ObserveEviction is called when a MemoryStore evicts a key that still
	// held state.
	ObserveEviction(EvictionEvent)
}

// DecisionEvent describes one decision.
type DecisionEvent struct {
	// Key is the key decided. Never use it as a metric label: keys are
	// unbounded and may identify people.
	Key string
	// Decision is the decision, with its Policy.
	Decision Decision
	// Admitted reports whether the request was admitted: every decision of
	// its batch was Allowed. It is false when this request's own policy
	// allowed it but another policy of the batch refused.
	Admitted bool
	// DryRun reports that the Limiter is in dry-run mode: a refused
	// decision was reported but not enforced.
	DryRun bool
	// Latency is the time the store took for the whole batch: the
	// Limiter's Clock read after the store returned, less the time of the
	// decision.
	Latency time.Duration
}

// ErrorEvent describes a store failure (see Observer.ObserveError).
type ErrorEvent struct {
	// Policies are the policies of the failed batch.
	Policies []*Policy
	// Err is the error the store returned (or the middleware met).
	Err error
	// Latency is the time the failed call took.
	Latency time.Duration
}

// EvictionEvent describes a key evicted while it still held state.
type EvictionEvent struct {
	// PolicyName is the Name of the evicted key's policy.
	PolicyName string
	// Key is the evicted key (not for metric labels).
	Key string
	// Stale is how much longer the state would have mattered.
	Stale time.Duration
}

// NopObserver is an Observer that does nothing; embed it to implement only
// some methods of Observer.
type NopObserver struct{}

// ObserveDecision does nothing.
func (NopObserver) ObserveDecision(DecisionEvent) {}

// ObserveError does nothing.
func (NopObserver) ObserveError(ErrorEvent) {}

// ObserveEviction does nothing.
func (NopObserver) ObserveEviction(EvictionEvent) {}
