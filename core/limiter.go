package core

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Resolver chooses the Policy for a key, for tiers (free, pro, internal) and
// per-tenant overrides. A nil Policy with a nil error means the Limiter's
// default policy.
type Resolver interface {
	// Resolve returns the Policy that key is decided under, one built by
	// NewPolicy, or nil for the default. It is called on the request path,
	// before the store, and must be safe for concurrent use. A non-nil
	// error stops the request before anything is charged; a Limiter
	// treats it as a store failure.
	Resolve(ctx context.Context, key string) (*Policy, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, key string) (*Policy, error)

// Resolve calls f.
func (f ResolverFunc) Resolve(ctx context.Context, key string) (*Policy, error) { return f(ctx, key) }

// PolicyLister is implemented by Resolvers that know every policy they can
// return, such as the one Tiers builds. Limiters use it at construction to
// refuse a configuration whose layers could meet two equally named policies.
type PolicyLister interface {
	// Policies returns every Policy that Resolve can return (nil entries
	// are ignored). It is called when a Limiter is built, not per request.
	Policies() []*Policy
}

// Tiers returns a Resolver that validates every rule of tiers now and, per
// request, maps the key to a tier name with tierOf and that name to its
// policy. An unknown or empty tier name resolves to the Limiter's default
// policy. Rules are validated at construction: an invalid one is an error,
// and so is a tier named "" (the empty name means the default policy).
func Tiers(tierOf func(ctx context.Context, key string) string, tiers map[string]Rule) (Resolver, error) {
	if tierOf == nil {
		return nil, errors.New("ratelimit: Tiers needs a tierOf function")
	}
	if _, ok := tiers[""]; ok {
		return nil, errors.New(`ratelimit: Tiers: a tier named "": the empty tier name resolves to the Limiter's default policy; give the Limiter that rule, or the tier a name`)
	}
	ps := make(map[string]*Policy, len(tiers))
	for name, r := range tiers {
		p, err := NewPolicy(r)
		if err != nil {
			return nil, fmt.Errorf("tier %q: %w", name, err)
		}
		ps[name] = p
	}
	return &tierResolver{tierOf: tierOf, byName: ps}, nil
}

// tierResolver is the Resolver Tiers returns.
type tierResolver struct {
	tierOf func(ctx context.Context, key string) string
	byName map[string]*Policy
}

// Resolve implements Resolver.
func (t *tierResolver) Resolve(ctx context.Context, key string) (*Policy, error) {
	return t.byName[t.tierOf(ctx, key)], nil
}

// Policies implements PolicyLister: the tiers' policies, sorted by tier name.
func (t *tierResolver) Policies() []*Policy {
	names := make([]string, 0, len(t.byName))
	for n := range t.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	ps := make([]*Policy, len(names))
	for i, n := range names {
		ps[i] = t.byName[n]
	}
	return ps
}

// Limiter decides requests: it reads its Clock once per decision, asks its
// Store, and reports to its Observer, reading the Clock once more for the
// latency when it has one. It is safe for concurrent use.
//
// Allow and AllowN decide one key under the Limiter's policy (or the one its
// Resolver picks); Take decides a layered batch of requests atomically.
type Limiter struct {
	policy   *Policy
	store    Store
	mem      *MemoryStore // store, when it is a *MemoryStore
	clock    Clock
	sys      *systemClock // clock, when it is a SystemClock
	observer Observer
	resolver Resolver
	dryRun   bool
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithStore sets the Store. The default is a new MemoryStore with the
// default configuration and the Limiter's Observer (see WithObserver), to
// which it reports its evictions.
func WithStore(s Store) Option { return func(l *Limiter) { l.store = s } }

// WithClock sets the Clock. The default is SystemClock().
func WithClock(c Clock) Option { return func(l *Limiter) { l.clock = c } }

// WithObserver sets the Observer: it receives the Limiter's decisions and
// errors, and the evictions of its default store (a store given with
// WithStore reports to the Observer its own configuration names). The
// default is none.
func WithObserver(o Observer) Option { return func(l *Limiter) { l.observer = o } }

// WithResolver sets a Resolver that picks the policy of each Allow and AllowN
// call by key. The default is none: every key gets the Limiter's policy.
func WithResolver(r Resolver) Option { return func(l *Limiter) { l.resolver = r } }

// WithDryRun marks the Limiter as deciding without enforcing: decisions are
// made, charged when allowed and reported with DryRun set, and callers such
// as the HTTP middleware let refused requests through. Without it the
// Limiter enforces (the shape matches the root package's WithDryRun).
func WithDryRun() Option { return func(l *Limiter) { l.dryRun = true } }

// New returns a Limiter whose Allow and AllowN decide under rule. It returns
// an error wrapping ErrInvalidRule for an invalid rule, and one wrapping
// ErrUnsupportedPolicy when the store cannot decide it (PolicyChecker);
// nothing is checked later at request time.
func New(rule Rule, opts ...Option) (*Limiter, error) {
	p, err := NewPolicy(rule)
	if err != nil {
		return nil, err
	}
	return NewWithPolicy(p, opts...)
}

// NewWithPolicy is like New for an existing Policy. A nil policy makes a
// Limiter for Take only; its Allow and AllowN return an error unless a
// Resolver supplies a policy. It returns an error wrapping
// ErrUnsupportedPolicy when the store cannot decide p or a policy the
// Resolver lists (PolicyChecker, PolicyLister).
func NewWithPolicy(p *Policy, opts ...Option) (*Limiter, error) {
	l := &Limiter{policy: p}
	for _, o := range opts {
		o(l)
	}
	if l.store == nil {
		m, err := NewMemoryStore(&MemoryConfig{Observer: l.observer})
		if err != nil {
			return nil, err
		}
		l.store = m
	}
	if err := CheckPolicies(l.store, p); err != nil {
		return nil, err
	}
	if pl, ok := l.resolver.(PolicyLister); ok {
		if err := CheckPolicies(l.store, pl.Policies()...); err != nil {
			return nil, err
		}
	}
	if l.clock == nil {
		l.clock = SystemClock()
	}
	l.mem, _ = l.store.(*MemoryStore)
	l.sys, _ = l.clock.(*systemClock)
	return l, nil
}

// Must panics if err is not nil and returns l otherwise, for limiters
// built at program start: core.Must(core.New(rule)).
func Must(l *Limiter, err error) *Limiter {
	if err != nil {
		panic(err)
	}
	return l
}

// Policy returns the Limiter's default policy (nil for a Take-only Limiter).
func (l *Limiter) Policy() *Policy { return l.policy }

// Store returns the Limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Clock returns the Limiter's clock.
func (l *Limiter) Clock() Clock { return l.clock }

// Observer returns the Limiter's observer, or nil.
func (l *Limiter) Observer() Observer { return l.observer }

// DryRun reports whether the Limiter is in dry-run mode.
func (l *Limiter) DryRun() bool { return l.dryRun }

// ErrNoPolicy is returned by Allow and AllowN on a Limiter with no policy
// for the key.
var ErrNoPolicy = errors.New("ratelimit: no policy for this key")

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether cost units may be charged to key now, and charges
// them if so. It returns ErrInvalidCost for cost < 1 and
// ErrCostExceedsCapacity, with a refusing Decision, for a cost above the
// policy's capacity, and one wrapping ErrUnsupportedPolicy when the store
// cannot decide the policy (one a Resolver picked without listing it: see
// PolicyChecker), a configuration error. A refusal is a Decision with
// Allowed false and a nil error; any other non-nil error is a store
// failure (or the Resolver's).
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	p := l.policy
	if l.resolver != nil {
		rp, err := l.resolver.Resolve(ctx, key)
		if err != nil {
			err = fmt.Errorf("ratelimit: resolving the policy: %w", err)
			// Reported as a store failure is, unless the caller's
			// context ending caused it (see TakeAt).
			if l.observer != nil && (ctx.Err() == nil || !errors.Is(err, ctx.Err())) {
				var ps []*Policy // the policy the key would have had without a Resolver, if any
				if l.policy != nil {
					ps = []*Policy{l.policy}
				}
				l.observer.ObserveError(ErrorEvent{Policies: ps, Err: err})
			}
			return Decision{}, err
		}
		if rp != nil {
			p = rp
		}
	}
	if p == nil {
		return Decision{}, ErrNoPolicy
	}
	reqs := [1]Request{{Policy: p, Key: key, Cost: cost}}
	var out [1]Decision
	var err error
	if l.mem != nil && l.observer == nil && cost >= 1 && cost <= p.capacity {
		// The path Take takes for this request, without its checks of a
		// batch and its report of the batch's admission.
		err = l.mem.takeOne(&reqs[0], clampNanos(l.NowUnixNano()), &out[0])
	} else {
		_, err = l.Take(ctx, reqs[:], out[:])
	}
	return out[0], err
}

// Take decides a batch of requests atomically (see Store) and reports
// whether all were admitted. out must be at least as long as reqs. Errors
// are as for Store.Take.
func (l *Limiter) Take(ctx context.Context, reqs []Request, out []Decision) (bool, error) {
	return l.TakeAtUnixNano(ctx, l.NowUnixNano(), reqs, out)
}

// admitted reports whether a decided batch was admitted.
func admitted(reqs []Request, out []Decision, err error) (bool, error) {
	if err != nil || len(reqs) == 0 {
		return false, err
	}
	for i := range reqs {
		if !out[i].Allowed {
			return false, nil
		}
	}
	return true, nil
}

// NowUnixNano reads the Limiter's clock as Unix nanoseconds, for
// TakeAtUnixNano. On the system clock it costs one monotonic clock read and
// builds no time.Time.
func (l *Limiter) NowUnixNano() int64 {
	if l.sys != nil {
		return l.sys.unixNano()
	}
	return ClampTime(l.clock.Now())
}

// TakeAtUnixNano is TakeAt with the time as Unix nanoseconds, as returned by
// NowUnixNano.
func (l *Limiter) TakeAtUnixNano(ctx context.Context, now int64, reqs []Request, out []Decision) (bool, error) {
	if l.mem != nil && l.observer == nil {
		return admitted(reqs, out, l.mem.take(reqs, out, now))
	}
	return l.TakeAt(ctx, time.Unix(0, now), reqs, out)
}

// TakeAt is like Take at a time the caller read from the Limiter's Clock,
// for callers that need the decision time again (to turn ResetAfter into
// an absolute time, say) without a second clock read.
func (l *Limiter) TakeAt(ctx context.Context, now time.Time, reqs []Request, out []Decision) (bool, error) {
	var err error
	if l.mem != nil {
		err = l.mem.take(reqs, out, ClampTime(now))
	} else {
		err = l.takeStore(ctx, now, reqs, out)
	}
	ok, err := admitted(reqs, out, err)
	// A store error caused by the caller's context ending (its client
	// went away) is no store failure: it is not reported.
	if l.observer != nil && (err == nil || ctx.Err() == nil || !errors.Is(err, ctx.Err())) {
		l.observe(reqs, out, ok, now, err)
	}
	return ok, err
}

// takeStore calls a Store that is not the MemoryStore through the interface,
// on copies, so that the caller's arrays stay on its stack in the common
// in-memory case.
func (l *Limiter) takeStore(ctx context.Context, now time.Time, reqs []Request, out []Decision) error {
	if len(out) < len(reqs) {
		return ErrShortOutput // as the store would say, before it charges
	}
	rc := append([]Request(nil), reqs...)
	oc := make([]Decision, len(reqs))
	err := l.store.Take(ctx, now, rc, oc)
	copy(out, oc)
	return err
}

func (l *Limiter) observe(reqs []Request, out []Decision, ok bool, start time.Time, err error) {
	// Both ends clamped as the decision's time is (NowUnixNano): a clock
	// outside [MinTime, MaxTime] measures no latency, not centuries.
	lat := max(time.Duration(ClampTime(l.clock.Now())-ClampTime(start)), 0)
	if err != nil && !errors.Is(err, ErrCostExceedsCapacity) {
		ps := make([]*Policy, len(reqs))
		for i := range reqs {
			ps[i] = reqs[i].Policy
		}
		l.observer.ObserveError(ErrorEvent{Policies: ps, Err: err, Latency: lat})
		return
	}
	for i := range reqs {
		l.observer.ObserveDecision(DecisionEvent{Key: reqs[i].Key, Decision: out[i], Admitted: ok, DryRun: l.dryRun, Latency: lat})
	}
}
