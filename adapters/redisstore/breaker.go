package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Defaults of BreakerConfig.
const (
	// DefaultBreakerFailures is the number of consecutive failed decisions
	// that opens the breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerOpenFor is how long the breaker stays open.
	DefaultBreakerOpenFor = 2 * time.Second
	// DefaultBreakerProbes is the number of decisions a half-open breaker
	// lets through.
	DefaultBreakerProbes = 1
)

// BreakerConfig configures the circuit breaker (github.com/sony/gobreaker)
// that stops a Store from waiting on a Redis that is failing. While it is
// closed every decision goes to Redis; Failures consecutive failures
// (errors or timeouts; a caller's own cancellation does not count) open
// it, and for OpenFor no decision goes to Redis: Take fails fast with
// ErrUnavailable or decides with the Fallback. It then turns half-open and
// lets Probes decisions through: if they all succeed it closes, and if one
// fails it opens again.
type BreakerConfig struct {
	// Disabled turns the breaker off: every decision goes to Redis and
	// waits for its Timeout. The default value is false.
	Disabled bool

	// Failures is the number of consecutive failed decisions that opens
	// the breaker. The default value is DefaultBreakerFailures, 5.
	Failures uint32

	// OpenFor is how long the breaker stays open before probing Redis
	// again. The default value is DefaultBreakerOpenFor, 2s.
	OpenFor time.Duration

	// Probes is the number of decisions let through while half-open, all
	// of which must succeed to close the breaker. The default value is
	// DefaultBreakerProbes, 1.
	Probes uint32
}

// BreakerState is the state of a Store's circuit breaker.
type BreakerState int

// Breaker states.
const (
	// BreakerClosed: decisions go to Redis.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: a few probe decisions go to Redis; the others are
	// refused as while open.
	BreakerHalfOpen
	// BreakerOpen: no decision goes to Redis.
	BreakerOpen
	// BreakerDisabled: the Store has no breaker (BreakerConfig.Disabled).
	BreakerDisabled
)

// String returns "closed", "half-open", "open" or "disabled".
func (b BreakerState) String() string {
	switch b {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	case BreakerDisabled:
		return "disabled"
	}
	return fmt.Sprintf("BreakerState(%d)", int(b))
}

func fromGobreaker(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	case gobreaker.StateOpen:
		return BreakerOpen
	}
	return BreakerClosed
}

func newBreaker(cfg *BreakerConfig, onChange func(from, to BreakerState)) (*gobreaker.CircuitBreaker[struct{}], error) {
	var c BreakerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Disabled {
		return nil, nil
	}
	if c.OpenFor < 0 {
		return nil, fmt.Errorf("redisstore: Breaker.OpenFor must not be negative, got %v", c.OpenFor)
	}
	if c.Failures == 0 {
		c.Failures = DefaultBreakerFailures
	}
	if c.OpenFor == 0 {
		c.OpenFor = DefaultBreakerOpenFor
	}
	if c.Probes == 0 {
		c.Probes = DefaultBreakerProbes
	}
	st := gobreaker.Settings{
		Name:        "redisstore",
		MaxRequests: c.Probes,
		Timeout:     c.OpenFor,
		ReadyToTrip: func(n gobreaker.Counts) bool { return n.ConsecutiveFailures >= c.Failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, errCallerGone) },
	}
	if onChange != nil {
		st.OnStateChange = func(_ string, from, to gobreaker.State) {
			onChange(fromGobreaker(from), fromGobreaker(to))
		}
	}
	return gobreaker.NewCircuitBreaker[struct{}](st), nil
}

// State returns the state of the circuit breaker, BreakerDisabled if the
// Store has none. An open breaker whose OpenFor has passed reports (and
// becomes) half-open.
func (s *Store) State() BreakerState {
	if s.breaker == nil {
		return BreakerDisabled
	}
	return fromGobreaker(s.breaker.State())
}
