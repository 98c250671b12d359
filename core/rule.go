package core

import (
	"errors"
	"fmt"
	"hash/maphash"
	"time"
)

// Bounds on rule fields. They keep every intermediate value of the built-in
// algorithms inside 64-bit integers (and Limit inside the 2^53 range that a
// Lua number in Redis holds exactly).
const (
	// MaxLimit is the largest Limit or Burst a Rule may have.
	MaxLimit = 1 << 50
	// MaxWindow is the longest Window, MaxDelay or refill time (the time an
	// empty bucket takes to fill: Burst x Window / Limit) a Rule may have.
	MaxWindow = 50 * 365 * 24 * time.Hour
	// MaxNameLen is the longest rule Name, in bytes.
	MaxNameLen = 64
	// DefaultName is the Name of a Rule whose Name is empty.
	DefaultName = "default"
)

var (
	// ErrInvalidRule is wrapped by every rule validation error; the message
	// names the field at fault.
	ErrInvalidRule = errors.New("ratelimit: invalid rule")
	// ErrInvalidCost is returned for a cost <= 0.
	ErrInvalidCost = errors.New("ratelimit: cost must be at least 1")
	// ErrCostExceedsCapacity is returned, with a refusing Decision whose
	// RetryAfter is 0, for a cost larger than the policy's capacity: such a
	// request can never be admitted, so nothing is charged and no retry time
	// is promised.
	ErrCostExceedsCapacity = errors.New("ratelimit: cost exceeds the policy's capacity")
	// ErrUnknownAlgorithm is returned by ParseAlgorithm for a name that is
	// not a built-in algorithm.
	ErrUnknownAlgorithm = errors.New("ratelimit: unknown algorithm")
)

// Rule is one quota: Limit units per Window, decided by Algorithm.
//
// A Rule is plain configuration. [NewPolicy] (or [New]) validates it and
// returns an immutable [*Policy]; a Rule is never checked at request time.
type Rule struct {
	// Name identifies the rule in response headers, metrics and store keys.
	// Store keys are namespaced by Name, and each record is tagged with the
	// Identity of the policy that wrote it: two rules with the same Name and
	// the same Identity share state in a shared Store; two with the same
	// Name and another Identity (another algorithm, Limit, Window or
	// capacity) meet on one record, which each reads only after converting
	// it to its own, carrying over the units in use (see Store). Give
	// unrelated rules distinct Names. It is at
	// most MaxNameLen bytes of printable ASCII without '"' or '\'. The
	// default value is DefaultName.
	Name string

	// Algorithm decides requests. The default value is TokenBucket.
	Algorithm Algorithm

	// Limit is the number of units (requests, or cost units) admitted per
	// Window. It must be in [1, MaxLimit].
	Limit int64

	// Window is the period over which Limit applies. It must be in
	// (0, MaxWindow].
	Window time.Duration

	// Burst is the capacity of the bucket for algorithms that have one
	// (TokenBucket: default Limit; LeakyBucket: default 1). Window
	// algorithms have no bucket and require 0. It must be in [0, MaxLimit].
	Burst int64

	// MaxDelay, for LeakyBucket only, turns the meter into a shaper: a
	// request that overflows the bucket but would conform within MaxDelay
	// is admitted and charged now, and its Decision.Delay says how long the
	// caller must hold it, as nginx limit_req does without nodelay. The
	// default value, 0, refuses instead of delaying.
	MaxDelay time.Duration
}

// PerSecond returns a token-bucket Rule admitting n units per second.
func PerSecond(n int64) Rule { return Rule{Limit: n, Window: time.Second} }

// PerMinute returns a token-bucket Rule admitting n units per minute.
func PerMinute(n int64) Rule { return Rule{Limit: n, Window: time.Minute} }

// PerHour returns a token-bucket Rule admitting n units per hour.
func PerHour(n int64) Rule { return Rule{Limit: n, Window: time.Hour} }

// Named returns a copy of r with its Name set.
func (r Rule) Named(name string) Rule { r.Name = name; return r }

// Using returns a copy of r with its Algorithm set.
func (r Rule) Using(a Algorithm) Rule { r.Algorithm = a; return r }

// WithBurst returns a copy of r with its Burst set.
func (r Rule) WithBurst(b int64) Rule { r.Burst = b; return r }

// Validate reports the first invalid field of r, as an error wrapping
// ErrInvalidRule, or nil when r can be made into a Policy.
func (r Rule) Validate() error {
	_, err := NewPolicy(r)
	return err
}

func ruleError(r Rule, format string, args ...any) error {
	name := r.Name
	if name == "" {
		name = DefaultName
	}
	return fmt.Errorf("%w %q: %s", ErrInvalidRule, name, fmt.Sprintf(format, args...))
}

// Policy is a validated Rule with the constants its algorithm needs. It is
// immutable and safe for concurrent use; build one with NewPolicy and share
// it. The zero value is not usable.
type Policy struct {
	rule     Rule
	alg      Algorithm
	capacity int64
	window   int64 // ns
	limit    uint64
	// tau is the refill time of an empty bucket, capacity x window / limit,
	// as whole nanoseconds plus a fraction tauR/limit.
	tauQ int64
	tauR uint64
	// unit is the cost of one unit, window / limit, as whole nanoseconds
	// plus a fraction unitR/limit.
	unitQ    int64
	unitR    uint64
	maxDelay int64
	nameHash uint64
	identity string
}

var nameSeed = maphash.MakeSeed()

// NewPolicy validates r and returns its Policy. The error wraps
// ErrInvalidRule and names the field at fault.
func NewPolicy(r Rule) (*Policy, error) {
	if r.Name == "" {
		r.Name = DefaultName
	}
	if r.Algorithm == nil {
		r.Algorithm = TokenBucket
	}
	if len(r.Name) > MaxNameLen {
		return nil, ruleError(r, "Name is longer than %d bytes", MaxNameLen)
	}
	for i := 0; i < len(r.Name); i++ {
		if c := r.Name[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return nil, ruleError(r, "Name has a character outside printable ASCII, or '\"' or '\\' (byte %d)", i)
		}
	}
	if r.Algorithm.Name() == "" {
		return nil, ruleError(r, "Algorithm has an empty Name")
	}
	switch {
	case r.Limit <= 0:
		return nil, ruleError(r, "Limit must be positive, got %d", r.Limit)
	case r.Limit > MaxLimit:
		return nil, ruleError(r, "Limit %d exceeds MaxLimit (%d)", r.Limit, int64(MaxLimit))
	case r.Window <= 0:
		return nil, ruleError(r, "Window must be positive, got %v", r.Window)
	case r.Window > MaxWindow:
		return nil, ruleError(r, "Window %v exceeds MaxWindow (%v)", r.Window, MaxWindow)
	case r.Burst < 0:
		return nil, ruleError(r, "Burst must not be negative, got %d", r.Burst)
	case r.Burst > MaxLimit:
		return nil, ruleError(r, "Burst %d exceeds MaxLimit (%d)", r.Burst, int64(MaxLimit))
	case r.MaxDelay < 0:
		return nil, ruleError(r, "MaxDelay must not be negative, got %v", r.MaxDelay)
	case r.MaxDelay > MaxWindow:
		return nil, ruleError(r, "MaxDelay %v exceeds MaxWindow (%v)", r.MaxDelay, MaxWindow)
	}
	if err := r.Algorithm.Validate(r); err != nil {
		return nil, ruleError(r, "%v", err)
	}
	c := r.Algorithm.Capacity(r)
	if c <= 0 || c > MaxLimit {
		return nil, ruleError(r, "Algorithm %s gives capacity %d, outside [1, MaxLimit]", r.Algorithm.Name(), c)
	}
	p := &Policy{
		rule:     r,
		alg:      r.Algorithm,
		capacity: c,
		window:   int64(r.Window),
		limit:    uint64(r.Limit),
		maxDelay: int64(r.MaxDelay),
		nameHash: maphash.String(nameSeed, r.Name),
	}
	// The refill time must stay within MaxWindow so that now + tau + MaxDelay
	// never overflows.
	q, rem, fits := mulDivChecked(uint64(c), uint64(r.Window), p.limit)
	if !fits || q > uint64(MaxWindow) {
		return nil, ruleError(r, "refill time Burst x Window / Limit exceeds MaxWindow (%v)", MaxWindow)
	}
	p.tauQ, p.tauR = int64(q), rem
	p.unitQ, p.unitR = int64(uint64(r.Window)/p.limit), uint64(r.Window)%p.limit
	p.identity = fmt.Sprintf("%s;l=%d;w=%d;c=%d", r.Algorithm.Name(), r.Limit, int64(r.Window), c)
	return p, nil
}

// MustPolicy is like NewPolicy but panics on an invalid rule. It is meant for
// rules fixed at program start.
func MustPolicy(r Rule) *Policy {
	p, err := NewPolicy(r)
	if err != nil {
		panic(err)
	}
	return p
}

// Rule returns the validated rule, with defaults filled in.
func (p *Policy) Rule() Rule { return p.rule }

// Name returns the rule's Name.
func (p *Policy) Name() string { return p.rule.Name }

// Algorithm returns the rule's Algorithm.
func (p *Policy) Algorithm() Algorithm { return p.alg }

// Limit returns the rule's Limit: units admitted per Window.
func (p *Policy) Limit() int64 { return p.rule.Limit }

// Window returns the rule's Window.
func (p *Policy) Window() time.Duration { return p.rule.Window }

// Capacity returns the largest cost the policy can ever admit at once, and
// the largest Remaining a Decision reports: Burst (or the algorithm's
// default) for buckets, Limit for windows.
func (p *Policy) Capacity() int64 { return p.capacity }

// MaxDelay returns the rule's MaxDelay.
func (p *Policy) MaxDelay() time.Duration { return time.Duration(p.maxDelay) }

// Identity names what the policy's per-key state means: the algorithm's
// Name and the parameters its State is read under (Limit, Window in
// nanoseconds and capacity), as in "token_bucket;l=100;w=60000000000;c=100".
// Two policies with the same Identity read a State identically; stores tag
// every key's state with the Identity that wrote it and never read it under
// another. MaxDelay and Name are not part of it: they change decisions, not
// what the state means.
func (p *Policy) Identity() string { return p.identity }

// String returns a short description such as "api: 100 per 1m0s (token_bucket, capacity 100)":
// the Name, Limit per Window, and the Algorithm with the capacity it gives.
func (p *Policy) String() string {
	return fmt.Sprintf("%s: %d per %v (%s, capacity %d)", p.rule.Name, p.rule.Limit, p.rule.Window, p.alg.Name(), p.capacity)
}
