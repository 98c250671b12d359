package core

import (
	"fmt"
	"time"
)

// Algorithm decides requests against a per-key State. Implementations are
// pure: the outcome depends only on the policy, the state, the cost and now
// (Unix nanoseconds). They never read a clock and never keep per-key data
// outside the State. Stores call them with the state locked, so an Algorithm
// needs no synchronisation of its own.
//
// Five algorithms are built in: TokenBucket, LeakyBucket, FixedWindow,
// SlidingWindowLog and SlidingWindowCounter. A user adds one by implementing
// this interface; the in-memory store runs any Algorithm, while stores that
// run their own code (Redis) accept only the algorithms they implement.
type Algorithm interface {
	// Name returns a stable identifier such as "token_bucket".
	Name() string

	// Validate reports rule fields the algorithm cannot use. NewPolicy has
	// already checked the bounds that apply to every algorithm.
	Validate(r Rule) error

	// Capacity returns the largest cost a valid rule admits at once.
	Capacity(r Rule) int64

	// Decide writes to d whether cost units are admitted at now for the
	// state s, overwriting every field of d. If commit is true and the
	// request is admitted, Decide updates s to charge it. A cost of 0
	// reports the state without charging. If commit is false, Decide leaves
	// s unchanged.
	//
	// A state written at a later time than now never credits quota. Up to
	// ClockTolerance later, the state's time is the decision's (nothing
	// moved back; durations still count from now). Further (the clock
	// stepped back), it never refuses the key for longer than the
	// policy's full-recovery time plus ClockTolerance from now; with
	// commit true, Decide may rewrite such a state to its equivalent at
	// now, admitted or not, so that the bound holds from the first
	// decision after the step.
	//
	// Decide is called only with 0 <= cost <= p.Capacity() and with now in
	// [MinTime, MaxTime]. A zero State is a key never seen before, whose
	// quota is whole at every such now, before 1970 included. (The decision
	// is written through a pointer rather than returned: returning the
	// struct costs a store-forwarding stall on every call.)
	Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision)

	// Expiry returns the Unix nanosecond time from which s decides exactly
	// like a zero State, so that a store may forget it: math.MinInt64 for a
	// zero State (whole at every instant). Stores use it to drop recovered
	// keys and to set key expiries. An Expiry of 0 for a state that is
	// already whole is also accepted, and right for every now >= 0.
	Expiry(p *Policy, s *State) int64
}

// State is the per-key state of an Algorithm: two registers whose meaning
// the algorithm defines, plus storage used by SlidingWindowLog. Its zero
// value is the state of a key never seen before. Algorithms own the
// registers; stores only copy State values and pass pointers to them.
type State struct {
	// A and B are the registers. The Algorithm gives them their meaning:
	// the built-in buckets keep the theoretical arrival time in them, the
	// window algorithms a window index and its count.
	A, B int64
	log  *timeLog
}

// The instants a Store decides at, as Unix nanoseconds: about 146 years
// either side of 1970 (1823 to 2116). The built-in stores clamp a time
// outside them (such as the zero time.Time, year 1) to the nearest bound,
// so every time.Time decides, and a never-seen key is whole at all of them.
const (
	// MinTime is the earliest instant a Store decides at: -2^62 ns, in 1823.
	MinTime = -1 << 62
	// MaxTime is the latest instant a Store decides at: 2^62-1 ns, in 2116.
	MaxTime = 1<<62 - 1
)

// ClockTolerance is how far behind a key's state a decision's time may lie
// and still be read as the state's own time rather than as a clock that
// stepped back. A caller that read its clock before another caller whose
// decision went first (both waiting on one lock, say, or a fleet's clocks a
// little apart in the Redis store's ClientTime mode) decides at a time
// earlier than the key's state: every algorithm then decides as at the
// state's time, moving nothing back, so such a decision never makes room
// for more requests than its absence would, and the durations it reports
// count from the caller's own time. A time further behind is a clock that
// stepped back (see Store).
const ClockTolerance = time.Second

// settle returns the time to decide at for a decision at now on a state
// last written at at (or later): at itself when now lies behind it by at
// most ClockTolerance, with shift, how far now moved forward; now
// otherwise.
func settle(now, at int64) (t, shift int64) {
	if at > now && at-now <= int64(ClockTolerance) {
		return at, at - now
	}
	return now, 0
}

// stateTime returns the time a decision at now reads s at under p, a
// built-in algorithm, to convert it to another policy: the time s says it
// was last written at (a window's start, a log's newest entry) when now
// lies behind it by at most ClockTolerance (see settle), now otherwise. A
// bucket's is now: its arrival time does not say when its last decision
// was made.
func stateTime(p *Policy, s *State, now int64) int64 {
	at := now
	switch p.alg {
	case FixedWindow, SlidingWindowCounter:
		if s.B != 0 {
			at = s.A * p.window
		}
	case SlidingWindowLog:
		if s.log != nil && s.log.len > 0 {
			at = s.log.newest()
		}
	}
	t, _ := settle(now, at)
	return t
}

// later adds shift (see settle) to d's durations, which count from the
// caller's own time.
func (d *Decision) later(shift int64) {
	if d.RetryAfter > 0 {
		d.RetryAfter += time.Duration(shift)
	}
	if d.ResetAfter > 0 {
		d.ResetAfter += time.Duration(shift)
	}
}

// ClampTime returns t as Unix nanoseconds clamped to [MinTime, MaxTime].
// Unlike t.UnixNano, it is defined for every t.
func ClampTime(t time.Time) int64 {
	switch sec := t.Unix(); {
	case sec < MinTime/1_000_000_000-1: // the division rounds toward zero, Unix down
		return MinTime
	case sec > MaxTime/1_000_000_000:
		return MaxTime
	}
	return clampNanos(t.UnixNano())
}

// clampNanos clamps Unix nanoseconds to [MinTime, MaxTime].
func clampNanos(ns int64) int64 { return min(max(ns, MinTime), MaxTime) }

// Built-in algorithms.
var (
	// TokenBucket is a bucket of Burst tokens (default Limit) refilled
	// continuously at Limit/Window; a new key starts full and a request of
	// cost c is admitted when c tokens are available. It is implemented in
	// the exact form of the generic cell rate algorithm (GCRA), with the
	// theoretical arrival time kept as whole nanoseconds plus a fraction in
	// units of 1/Limit ns, so no rounding error accumulates however many
	// requests are made.
	TokenBucket Algorithm = tokenBucket{}

	// LeakyBucket is the leaky bucket as a meter: the bucket's level drains
	// at Limit/Window and a request of cost c is admitted when level + c
	// fits in Burst (default 1, which spaces requests at least Window/Limit
	// apart). With Rule.MaxDelay it shapes instead: an overflowing request
	// that would fit within MaxDelay is admitted with Decision.Delay set.
	LeakyBucket Algorithm = leakyBucket{}

	// FixedWindow counts units in windows aligned to multiples of Window
	// since the Unix epoch and admits while count + cost <= Limit.
	FixedWindow Algorithm = fixedWindow{}

	// SlidingWindowLog remembers every admission in the trailing window
	// (now-Window, now] and admits while their total + cost <= Limit. It is
	// exact and costs memory in proportion to the admissions in the window:
	// up to 16 bytes per admitted request (requests admitted at the same
	// instant share an entry), so up to 16 x Limit bytes per key.
	SlidingWindowLog Algorithm = slidingWindowLog{}

	// SlidingWindowCounter approximates a sliding window with two counters:
	// the previous fixed window's count weighted by the fraction of it still
	// inside the sliding window, plus the current window's count. A request
	// is admitted when prev x (Window-elapsed)/Window + curr + cost <= Limit,
	// compared exactly in integers. It uses 16 bytes per key; Limit must be
	// below 2^32.
	SlidingWindowCounter Algorithm = slidingWindowCounter{}
)

// Algorithms returns the built-in algorithms.
func Algorithms() []Algorithm {
	return []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}
}

// ParseAlgorithm returns the built-in algorithm with the given Name, such as
// "token_bucket", for configuration files. An unknown name is an error
// wrapping ErrUnknownAlgorithm.
func ParseAlgorithm(name string) (Algorithm, error) {
	for _, a := range Algorithms() {
		if a.Name() == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("%w %q (want one of token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter)", ErrUnknownAlgorithm, name)
}

// decideBuiltin calls Decide on p's algorithm directly when it is one of
// the built-ins, so that s and d may stay on the caller's stack (passed
// through the Algorithm interface, they would escape to the heap), and
// reports whether it did; for any other algorithm it does nothing.
func decideBuiltin(p *Policy, s *State, cost, now int64, commit bool, d *Decision) bool {
	switch p.alg.(type) {
	case tokenBucket, leakyBucket:
		gcraDecide(p, s, cost, now, commit, d)
	case fixedWindow:
		fixedWindow{}.Decide(p, s, cost, now, commit, d)
	case slidingWindowCounter:
		slidingWindowCounter{}.Decide(p, s, cost, now, commit, d)
	case slidingWindowLog:
		slidingWindowLog{}.Decide(p, s, cost, now, commit, d)
	default:
		return false
	}
	return true
}
