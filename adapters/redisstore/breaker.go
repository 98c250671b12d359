package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Defaults of BreakerConfig.
const (
	// DefaultBreakerFailures is the number of consecutive failures (of a
	// decision's call to Redis, or of a pipeline's) that opens the breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerOpenFor is how long the breaker stays open.
	DefaultBreakerOpenFor = 2 * time.Second
	// DefaultBreakerProbes is the number of decisions a half-open breaker
	// lets through.
	DefaultBreakerProbes = 1
)

// BreakerConfig configures the circuit breaker (github.com/sony/gobreaker)
// that stops a Store from waiting on a Redis that is failing. While it is
// closed every decision goes to Redis; Failures consecutive failures (errors
// or timeouts; a caller's own cancellation does not count, nor does an error
// Redis replies about one call's own content, see callError; a pipeline's
// failure counts once, whatever the decisions it carried: see
// Config.Pipeline) open it, and for OpenFor no decision goes to Redis: Take
// fails fast with ErrUnavailable or decides with the Fallback. It then turns
// half-open and lets Probes decisions through: if they all succeed it
// closes, and if one fails it opens again.
type BreakerConfig struct {
	// Disabled turns the breaker off: every decision goes to Redis and
	// waits for its Timeout. The default value is false.
	Disabled bool

	// Failures is the number of consecutive failures that opens the
	// breaker: failed decisions, a pipeline of them counting once. The
	// default value is DefaultBreakerFailures, 5.
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

// breakerFactory makes the breakers of a Store: one for the whole store,
// or, on a Cluster, one per master.
type breakerFactory func(node string) *gobreaker.CircuitBreaker[struct{}]

func newBreaker(cfg *BreakerConfig, onChange func(from, to BreakerState)) (breakerFactory, error) {
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
	return func(node string) *gobreaker.CircuitBreaker[struct{}] {
		st := gobreaker.Settings{
			Name:        "redisstore " + node,
			MaxRequests: c.Probes,
			Timeout:     c.OpenFor,
			ReadyToTrip: func(n gobreaker.Counts) bool { return n.ConsecutiveFailures >= c.Failures },
			// A caller gone, a pacing wait, another node's open breaker,
			// or a reply about one call's own content says nothing about
			// this node; a pipeline's failure counts once, not once for
			// each of its calls (countedBefore, asked last, so that the
			// failure that counts is one that would).
			IsExcluded: func(err error) bool {
				return errors.Is(err, errCallerGone) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOverloaded) || errors.Is(err, errOtherNode) || callError(err) || countedBefore(err)
			},
		}
		if onChange != nil {
			st.OnStateChange = func(_ string, from, to gobreaker.State) {
				onChange(fromGobreaker(from), fromGobreaker(to))
			}
		}
		return gobreaker.NewCircuitBreaker[struct{}](st)
	}, nil
}

// callError reports whether err is Redis's error reply to one call's own
// content, which another key's call would not meet: an error met inside a
// script (a runtime error, a command's error reply: Redis names the
// script's line, "@user_script:"), a command on a key of another type
// (WRONGTYPE), or an argument a script refuses ("ERR ratelimit:"). The
// breaker does not count it: a key that some other client filled with a
// value no script of ours reads must not make every key's decisions fail
// fast. A reply that says the server cannot serve (serverReplies), also
// when a script's command met it, counts, as does every other error.
func callError(err error) bool {
	if err == nil {
		return false // before re, which escapes: a success allocates nothing
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range serverReplies {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, "-"+p) { // Redis 6 nests a command's reply as "-OOM ..."
			return false
		}
	}
	return strings.Contains(msg, "@user_script:") || strings.HasPrefix(msg, "WRONGTYPE ") || strings.HasPrefix(msg, "ERR ratelimit:")
}

// serverReplies are the prefixes of the error replies that say a server
// cannot serve: out of memory, busy with a script, loading its data, a
// replica, its master or cluster down, a slot migrating, unable to
// persist, without replicas, or refusing the client's credentials.
var serverReplies = []string{"OOM ", "BUSY ", "LOADING ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "MISCONF ", "NOREPLICAS ", "NOAUTH ", "NOPERM ", "WRONGPASS "}

// nodeBreaker is the breaker of one Cluster master.
type nodeBreaker struct {
	cb *gobreaker.CircuitBreaker[struct{}]
	// gen is the store's breakerGen when a decision last went through
	// cb: NodeStates drops a breaker no decision used since the sweep
	// before its last.
	gen atomic.Uint64
}

// breakerIdle is the least time between two sweeps of NodeStates: a
// master's breaker that no decision used during a whole such time is
// dropped.
const breakerIdle = time.Minute

// nodeBreaker returns the breaker of a Cluster master, made on first use.
func (s *Store) nodeBreaker(node string) *gobreaker.CircuitBreaker[struct{}] {
	g := s.breakerGen.Load()
	if v, ok := s.nodeBreakers.Load(node); ok {
		b := v.(*nodeBreaker)
		if b.gen.Load() != g {
			b.gen.Store(g)
		}
		return b.cb
	}
	b := &nodeBreaker{cb: s.newBreaker(node)}
	b.gen.Store(g)
	v, _ := s.nodeBreakers.LoadOrStore(node, b)
	return v.(*nodeBreaker).cb
}

// NodeStates returns the state of each Cluster master's circuit breaker,
// by the master's address, for the masters the store has talked to
// lately, and under "" the state of the breaker of the Cluster's slot map
// (the lookup of the master holding a key, which a client makes over the
// network until it has loaded the map); nil for a store that has one
// breaker for all (not a Cluster, or disabled). A breaker no decision went
// through for a minute or more, as seen by two calls of NodeStates (or
// State) at least a minute apart, is dropped: that of a master gone from
// the Cluster, or whose address changed, would otherwise report open or
// half-open for good; Config.OnStateChange hears a dropped breaker that was
// not closed change to closed. A master asked again gets a new breaker.
func (s *Store) NodeStates() map[string]BreakerState {
	if !s.perNode {
		return nil
	}
	g := s.breakerGen.Load()
	now := time.Now().UnixNano()
	if last := s.lastSweep.Load(); now-last >= int64(breakerIdle) && s.lastSweep.CompareAndSwap(last, now) {
		g = s.breakerGen.Add(1)
	}
	m := map[string]BreakerState{}
	s.nodeBreakers.Range(func(k, v any) bool {
		b := v.(*nodeBreaker)
		if g-b.gen.Load() > 1 {
			if st := fromGobreaker(b.cb.State()); s.nodeBreakers.CompareAndDelete(k, v) && st != BreakerClosed && s.onChange != nil {
				s.onChange(st, BreakerClosed) // its report was the last word on it
			}
			return true
		}
		m[k.(string)] = fromGobreaker(b.cb.State())
		return true
	})
	return m
}

// State returns the state of the circuit breaker, BreakerDisabled if the
// Store has none. An open breaker whose OpenFor has passed reports (and
// becomes) half-open. On a Cluster, where each master has its own breaker
// (see NodeStates), it returns the worst: open if any is open, else
// half-open if any is, else closed.
func (s *Store) State() BreakerState {
	if s.perNode {
		worst := BreakerClosed
		for _, st := range s.NodeStates() {
			if st == BreakerOpen || (st == BreakerHalfOpen && worst == BreakerClosed) {
				worst = st
			}
		}
		return worst
	}
	if s.breaker == nil {
		return BreakerDisabled
	}
	return fromGobreaker(s.breaker.State())
}
