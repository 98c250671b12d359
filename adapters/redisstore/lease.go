package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/limitry/ratelimit/core"
)

// Defaults of LeaseConfig.
const (
	// DefaultLeaseMaxAge is the default LeaseConfig.MaxAge.
	DefaultLeaseMaxAge = time.Second
	// DefaultHotThreshold is the default LeaseConfig.HotThreshold.
	DefaultHotThreshold = 10
	// DefaultHotPeriod is the default LeaseConfig.HotPeriod.
	DefaultHotPeriod = time.Second
	// DefaultLeaseKeys is the default LeaseConfig.MaxKeys and
	// RefusalCacheConfig.MaxKeys.
	DefaultLeaseKeys = 10000
)

// ErrInvalidLeaseConfig is returned by NewLeaseStore and NewRefusalCache for
// a configuration they cannot run; the error wrapping it names the field.
var ErrInvalidLeaseConfig = errors.New("ratelimit: redisstore: invalid lease or cache configuration")

// LeaseConfig configures a LeaseStore.
type LeaseConfig struct {
	// Size is the number of units a lease takes from the backend at once
	// (capped at a policy's capacity). It must be at least 1; there is no
	// default. A request costing more than the lease size is decided
	// exactly.
	Size int64

	// MaxAge is how long a lease may be spent after it was granted. Units
	// left when it ends are returned to the store that charged them if it
	// can refund (core.Refunder, as the Redis and memory stores do) when
	// the refund is sure to give back those units, and otherwise lost (see
	// the LeaseStore documentation). It is at most core.MaxWindow. The
	// default value is DefaultLeaseMaxAge, one second.
	MaxAge time.Duration

	// HotThreshold is the number of decisions of one key within one
	// HotPeriod from which the key is hot and decided from leases. 1 makes
	// every key hot from its first decision. The default value is
	// DefaultHotThreshold, 10.
	HotThreshold int

	// HotPeriod is the period over which decisions are counted to tell a hot
	// key. It is at most core.MaxWindow. The default value is
	// DefaultHotPeriod, one second.
	HotPeriod time.Duration

	// MaxKeys bounds the number of keys whose hotness and lease the store
	// keeps; the least recently used beyond it are forgotten, those without
	// a running lease first (see "Bounds" in the LeaseStore
	// documentation; a forgotten lease's units are lost). The default value
	// is DefaultLeaseKeys, 10,000.
	MaxKeys int
}

// LeaseStats counts what a LeaseStore did since it was created.
type LeaseStats struct {
	// Decisions is the number of Take calls.
	Decisions uint64
	// Local is the number of Take calls answered from a lease, with no
	// call to the backend.
	Local uint64
	// BackendCalls is the number of calls to the backend's Take: one per
	// exact decision, one per lease granted, and up to two more when a
	// lease is refused (see LeaseStore).
	BackendCalls uint64
	// Leases is the number of leases granted, and LeasedUnits the units
	// they charged to the backend.
	Leases, LeasedUnits uint64
	// ExpiredUnits is the number of leased units that were never spent: the
	// leftovers of leases that ended (MaxAge) not returned, of keys forgotten by the
	// LRU, of leases replaced under another policy, and units too few for
	// the request that ended a lease.
	ExpiredUnits uint64
	// ReturnedUnits is the number of leased units left when their lease
	// ended that were refunded to the store that charged them
	// (core.Refunder): sent in a refund the store accepted. A fixed
	// window's refund that reaches the store after the grant's window
	// ended is accepted and gives nothing back (see LeaseStore).
	ReturnedUnits uint64
	// Keys is the number of keys the store tracks now (at most MaxKeys).
	Keys int
}

// LeaseStore is a core.Store decorator that spares the backend (a Redis
// Store) a round trip per decision on hot keys: it leases part of a key's
// quota from the backend, charged there atomically by one Take of the
// lease size, and spends it locally until the lease runs out or its MaxAge
// ends. It is safe for concurrent use.
//
// # Hot keys
//
// A key (a policy name and a request key) is hot when it has been decided
// at least HotThreshold times within the current HotPeriod, or was in the
// previous one; periods start at the key's first decision and follow each
// other. Only single-request batches count. A key that is not hot is
// decided exactly by the backend, one call per decision, as without the
// decorator.
//
// # What is decided from a lease
//
// Only batches of one request, of cost at most the lease size, under a
// policy without MaxDelay (shaping needs the backend's Delay), are decided
// from leases. Every other batch, layered limits included, goes to the
// backend exactly as it is, so batches stay all-or-nothing: a batch is
// never split between a lease and the backend. Such batches do not touch
// the leases (units already leased stay charged, so nothing is counted
// twice).
//
// For a hot key whose lease cannot pay the request, the store asks the
// backend for a new lease of Size units (capped at the policy's capacity),
// holding the key so that concurrent requests of this process wait for it
// rather than lease too. If the backend refuses the lease because fewer
// units are left, the store asks again for what the backend reported as
// Remaining (when it covers the request), and finally for the request's
// own cost, so the last units of a quota are admitted and a refusal
// carries the backend's RetryAfter for the request itself. A refused lease
// thus costs up to three calls; the key is then decided exactly (one call
// each) until the backend's RetryAfter has passed. A RefusalCache in front
// of the LeaseStore spares the backend those calls too.
//
// # Bounds
//
// Nothing is admitted that was not charged to the backend first: every
// unit spent locally was part of one backend Take of the lease. So across
// any number of processes the units admitted never exceed what the backend
// admits, while the backend keeps the key's state (see "Reset and lost
// state" below). Units are admitted up to MaxAge after they were charged, so a
// window-based quota (FixedWindow, SlidingWindowLog, SlidingWindowCounter)
// measured over its own windows may see up to the leased units of the
// preceding MaxAge spent in the next window.
//
// When a lease ends (MaxAge) with units left and the store that charged it
// implements core.Refunder (the Redis and memory stores do), the next
// decision of the key returns them with one Refund before it goes on, when
// that refund is sure to give back the lease's own units. That store is
// the backend, except for a lease a Redis Store's Fallback granted while
// Redis was unavailable: Redis never charged it, so its leftovers go back
// to the Fallback (or are lost if it cannot refund), never to Redis. (The
// LeaseStore tells the two apart only when its backend is the *Store
// itself, not a wrapper of it.) Units are returned only under a
// TokenBucket, LeakyBucket or FixedWindow policy, and only while the
// backend's quota still holds them, with a margin of MaxAge for the
// refund's own way to the backend: for a fixed window, until MaxAge
// before it ends; for a bucket, until MaxAge plus the leftovers' own
// refill time (units x Window / Limit) before it would be whole again;
// both by the backend's ResetAfter of the grant, measured from the grant.
// A fixed window's refund also names its charge (core.Request.ChargedAt,
// the grant's time), so a refund that reaches the backend after the
// grant's window ended, later than that margin allowed for, gives nothing
// back. A bucket's cannot (a refund by charge counts the refill since the
// charge against it, and would give back less than the leftovers): it
// gives back the most recent units in use (see core.Refunder), and counts
// on reaching the backend within MaxAge of the decision that returns it.
// (A bucket refills the units in use as one debt: once less of it is left
// than the leftovers, some of them have refilled.) A later refund could
// give back units the quota had already recovered, taking them from
// charges made since, by this process or another, and admit more than the
// quota. A refund to a Redis Store is bounded by its Timeout and goes
// through its circuit breaker, as a decision does: while the breaker is
// open it is not made, so a decision never waits on a Redis known to be
// failing. Stats reports returned units as ReturnedUnits. Units that are
// not returned (those, the units of other algorithms, a backend without
// Refund, a failed refund or one the breaker stopped, a key the LRU
// forgets, a lease replaced under another policy: one of another Identity
// or MaxDelay, not an equal policy made anew) are lost to the quota,
// as though they were admitted (most of them would have recovered by then
// anyway): with N processes, about N x Size units per key per MaxAge can
// then be refused early. Precisely:
// a process holds at most one lease per key and takes a new one only when
// the last is spent or has ended, and a lease that ends with units left
// lived MaxAge, so over any period T at most N x Size x (T/MaxAge + 1)
// leased units go unused. A full store forgets first a key without a
// running lease among the 64 least recently used (a lease counts as
// running, for this, until MaxAge after it ends by the time of the request
// that makes room, or of the latest grant for a Reset), and if they all
// have one, the one whose lease ends first. So a flood of other keys ends
// a lease early only when the 64 least recently used keys all hold leases
// that end later, or the flood's clock runs more than MaxAge ahead of the
// lease holder's; then that lease's leftovers are lost too. Stats reports them as ExpiredUnits. A key that
// cools down keeps spending its lease until it ends. Keep Size small
// against the quota and MaxAge short against its window.
//
// # Reset and lost state
//
// A lease's leftovers are returned to the record that charged them; a
// refund cannot tell that record from one made since. When the key's
// record is deleted while a process holds a lease (a Reset by another
// process, or state Redis lost: a restart without persistence, FLUSHALL,
// an eviction), the leftovers that process returns later are taken off
// the charges made since, which then admit that many more: up to Size - 1
// units per process holding a lease on the key, on top of the whole quota
// the reset or the loss gave. Reset through the LeaseStore (Reset, or a
// Limiter's Reset over it) drops this process's own lease first. To reset
// a hot key across a fleet without that margin, reset it in every process
// through its LeaseStore; a smaller Size makes the margin smaller (MaxAge
// does not change it).
//
// # Decisions from a lease
//
// A decision served from a lease is Allowed with the backend's Limit, a
// Remaining equal to the units this process still holds in the lease (a
// lower bound: the quota may hold more in the backend, but this process
// can promise only those), a ResetAfter counted down from the backend's
// ResetAfter when the lease was granted (which already counted the whole
// lease as spent), RetryAfter 0, and Fallback as the grant's (set when the
// backend's Fallback granted the lease while Redis was unavailable). So the headers never promise more
// than the backend would; they may promise less: a client told Remaining 0
// may still be admitted (from a new lease). Refusals are the backend's own
// decisions, with its RetryAfter.
//
// # Time
//
// Leases and hotness run on the time passed to Take (the callers' clock).
// Concurrent callers read their clock before they wait for the key, so a
// time somewhat earlier than a lease's grant is taken as the grant time; a
// time more than MaxAge before it (a clock stepped back) ends the lease.
// The backend may decide on its own clock (the Redis store's default).
type LeaseStore struct {
	backend core.Store
	size    int64
	maxAge  int64
	hotN    int
	hotP    int64

	mu      sync.Mutex
	keys    *simplelru.LRU[leaseKey, *leaseEntry]
	maxKeys int
	granted atomic.Int64 // the latest time a lease was granted at (Unix ns)

	decisions, local, calls, leases, leased, expired, returned atomic.Uint64
}

var _ core.Store = (*LeaseStore)(nil)

// leaseKey identifies one quota: stores namespace keys by policy name.
type leaseKey struct{ name, key string }

// leaseEntry is a key's hotness and lease. Its fields other than left and
// dead are guarded by sem, a one-slot lock that a waiter can give up on
// when its context ends.
type leaseEntry struct {
	sem   chan struct{}
	dead  atomic.Bool  // forgotten by the LRU
	left  atomic.Int64 // units of the lease not spent yet
	until atomic.Int64 // expires, readable without sem (for entry)

	policy      *core.Policy
	period      int64 // start of the current hot period (Unix ns)
	count, prev int   // decisions in the current and the previous period

	granted, expires int64     // the lease's grant time and end (Unix ns)
	charged          time.Time // the grant's charge, as a refund names it (core.Policy.ChargeStart)
	exactUntil       int64     // the backend refused a lease until then (Unix ns)
	resetAt          int64     // when the backend's quota is whole, as of the grant
	limit            int64
	fallback         bool          // the backend's Fallback granted the lease (core.Decision.Fallback)
	src              core.Refunder // the store that charged the lease, if it can refund
}

// NewLeaseStore returns a LeaseStore deciding with backend, configured by
// cfg, whose Size is required. It returns an error wrapping
// ErrInvalidLeaseConfig for a nil backend, a Size below 1, or a negative
// field.
func NewLeaseStore(backend core.Store, cfg *LeaseConfig) (*LeaseStore, error) {
	if backend == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidLeaseConfig)
	}
	if cfg == nil || cfg.Size < 1 {
		return nil, fmt.Errorf("%w: Size must be at least 1", ErrInvalidLeaseConfig)
	}
	c := *cfg
	if c.MaxAge < 0 || c.HotThreshold < 0 || c.HotPeriod < 0 || c.MaxKeys < 0 {
		return nil, fmt.Errorf("%w: negative MaxAge, HotThreshold, HotPeriod or MaxKeys", ErrInvalidLeaseConfig)
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultLeaseMaxAge
	}
	if c.MaxAge > core.MaxWindow || c.HotPeriod > core.MaxWindow {
		// Added to a time, a longer one would overflow: every lease would
		// be granted already ended.
		return nil, fmt.Errorf("%w: MaxAge %v or HotPeriod %v above core.MaxWindow (%v)", ErrInvalidLeaseConfig, c.MaxAge, c.HotPeriod, core.MaxWindow)
	}
	if c.HotThreshold == 0 {
		c.HotThreshold = DefaultHotThreshold
	}
	if c.HotPeriod == 0 {
		c.HotPeriod = DefaultHotPeriod
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultLeaseKeys
	}
	s := &LeaseStore{
		backend: backend,
		size:    c.Size,
		maxAge:  int64(c.MaxAge),
		hotN:    c.HotThreshold,
		hotP:    int64(c.HotPeriod),
	}
	keys, err := simplelru.NewLRU(c.MaxKeys, func(_ leaseKey, e *leaseEntry) {
		e.dead.Store(true)
		s.expired.Add(uint64(e.left.Swap(0)))
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidLeaseConfig, err)
	}
	s.keys, s.maxKeys = keys, c.MaxKeys
	return s, nil
}

// Reset implements core.Resetter: it drops this process's lease of the
// key under p's Name (its units are lost, counted in ExpiredUnits, never
// returned: the reset gives the key a whole quota, which they would take
// from) and resets the key in the backend, holding the key meanwhile so
// that no lease is granted in between. It returns an error wrapping
// core.ErrUnsupported when the backend cannot reset. Leases other
// processes hold on the key are theirs: see "Reset and lost state" in the
// LeaseStore documentation.
func (s *LeaseStore) Reset(ctx context.Context, p *core.Policy, key string) error {
	rs, err := resetterOf("LeaseStore", s.backend, p)
	if err != nil {
		return err
	}
	k := leaseKey{p.Name(), key}
	// No time of its own: leases are judged at the latest grant's.
	e, err := s.hold(ctx, k, s.granted.Load())
	if err != nil {
		return err
	}
	defer func() { <-e.sem }()
	s.expired.Add(uint64(e.left.Swap(0)))
	return rs.Reset(ctx, p, key)
}

// CheckPolicy implements core.PolicyChecker: it asks the backend, when
// the backend can tell, whether it can decide p (every policy goes to the
// backend, whether decided exactly or by leases).
func (s *LeaseStore) CheckPolicy(p *core.Policy) error {
	return core.CheckPolicies(s.backend, p)
}

// Stats returns the store's counters.
func (s *LeaseStore) Stats() LeaseStats {
	s.mu.Lock()
	n := s.keys.Len()
	s.mu.Unlock()
	return LeaseStats{
		Decisions:     s.decisions.Load(),
		Local:         s.local.Load(),
		BackendCalls:  s.calls.Load(),
		Leases:        s.leases.Load(),
		LeasedUnits:   s.leased.Load(),
		ExpiredUnits:  s.expired.Load(),
		ReturnedUnits: s.returned.Load(),
		Keys:          n,
	}
}

// Take implements core.Store: it decides a single request of a hot key from
// a lease, and every other batch with the backend (see LeaseStore).
func (s *LeaseStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	s.decisions.Add(1)
	if len(reqs) != 1 || len(out) < 1 {
		return s.exact(ctx, now, reqs, out)
	}
	r := &reqs[0]
	if _, err := core.CheckBatch(reqs, out); err != nil || r.Policy.MaxDelay() > 0 || r.Cost > min(s.size, r.Policy.Capacity()) {
		return s.exact(ctx, now, reqs, out)
	}
	t := now.UnixNano()
	k := leaseKey{r.Policy.Name(), r.Key}
	e, err := s.hold(ctx, k, t)
	if err != nil {
		return err
	}
	hot := e.note(t, s.hotN, s.hotP)
	if e.policy != r.Policy {
		// Another policy: its lease's units are not this one's. An equal
		// policy made anew (a Resolver that builds one per request) keeps
		// the lease.
		if e.policy == nil || e.policy.Identity() != r.Policy.Identity() || e.policy.MaxDelay() != r.Policy.MaxDelay() {
			s.expired.Add(uint64(e.left.Swap(0)))
		}
		e.policy = r.Policy
	}
	if left := e.left.Load(); left > 0 {
		// The CAS fails only when the LRU forgot e meanwhile (and took its
		// units); then the lease is gone.
		if t >= e.granted-s.maxAge && t < e.expires && left >= r.Cost && e.left.CompareAndSwap(left, left-r.Cost) {
			left -= r.Cost
			out[0] = core.Decision{
				Allowed:    true,
				Limit:      e.limit,
				Remaining:  left,
				ResetAfter: time.Duration(max(e.resetAt-t, 0)),
				Policy:     r.Policy,
				Fallback:   e.fallback,
			}
			<-e.sem
			s.local.Add(1)
			return nil
		}
		s.giveBack(ctx, now, e, r.Key, e.left.Swap(0))
	}
	if !hot || (t < e.exactUntil && t >= e.granted-s.maxAge) {
		<-e.sem
		return s.exact(ctx, now, reqs, out)
	}
	err = s.lease(ctx, now, t, e, r, out)
	<-e.sem
	return err
}

// giveBack returns n units of e's lease to the store that charged it when
// a refund at now is sure to give back those units (see returnable), and
// counts them as expired otherwise. It requires e.sem held.
func (s *LeaseStore) giveBack(ctx context.Context, now time.Time, e *leaseEntry, key string, n int64) {
	if n <= 0 {
		return
	}
	if e.src != nil && s.returnable(e, now.UnixNano(), n) {
		s.calls.Add(1)
		reqs := []core.Request{{Policy: e.policy, Key: key, Cost: n}}
		if e.policy.Algorithm() == core.FixedWindow {
			// The charge named (see core.Refunder): the backend gives
			// back only while the grant's window is its current one,
			// however late the refund reaches it.
			reqs[0].ChargedAt = e.charged
		}
		var err error
		if st, ok := e.src.(*Store); ok {
			// Bounded by the store's Timeout, and not made while its
			// breaker is open: the decision waits for no more than its own.
			err = st.refundOnPath(ctx, now, reqs)
		} else {
			err = e.src.Refund(ctx, now, reqs)
		}
		if err == nil {
			s.returned.Add(uint64(n))
			return
		}
	}
	s.expired.Add(uint64(n))
}

// returnable reports whether a refund at t of left units, e's leftovers,
// gives back the lease's own units: under a policy whose refund gives back
// units still in use (a bucket's, a fixed window's current window's),
// while the backend still holds them, by its ResetAfter at the grant, for
// MaxAge more (the refund's own way to the backend). A time before the
// grant (a caller that read its clock before waiting for the key) counts
// as the grant's; one more than MaxAge before it (a clock stepped back)
// tells nothing, and returns nothing. It requires e.sem held.
//
// A fixed window holds the lease's charge until it ends (resetAt). A
// bucket owes, at any time u after the grant, at least resetAt - u of
// refill (its arrival time only grows with later charges). The refund
// moves that debt back by left x Window / Limit; it leaves the bucket as
// though the lease had charged only what it spent as long as, at every
// charge since the grant and at the refund (at most MaxAge after t), the
// debt held all the leftovers: resetAt - u >= left x Window / Limit. Had
// the bucket's debt shrunk below them, the units refilled in between
// served later charges, and a refund would give them back a second time:
// the leftovers are then lost.
func (s *LeaseStore) returnable(e *leaseEntry, t int64, left int64) bool {
	if t < e.granted-s.maxAge {
		return false
	}
	owed := e.resetAt - max(t, e.granted) - s.maxAge // the debt left at the latest refund
	switch e.policy.Algorithm() {
	case core.FixedWindow:
		return owed >= 0
	case core.TokenBucket, core.LeakyBucket:
		need, ok := refillTime(left, e.policy.Window(), e.policy.Limit())
		return ok && owed >= need
	}
	return false
}

// refillTime returns n x window / limit in nanoseconds, rounded up (the
// time a bucket of limit per window takes to refill n units), and false if
// it does not fit an int64. n, window and limit must be positive.
func refillTime(n int64, window time.Duration, limit int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(n), uint64(window))
	if hi >= uint64(limit) {
		return 0, false
	}
	q, r := bits.Div64(hi, lo, uint64(limit))
	if q >= math.MaxInt64 {
		return 0, false
	}
	if r != 0 {
		q++
	}
	return int64(q), true
}

// exact decides the batch with the backend.
func (s *LeaseStore) exact(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	s.calls.Add(1)
	return s.backend.Take(ctx, now, reqs, out)
}

// grant decides the lease req with the backend, and returns the store that
// charged it if that store can refund (see core.Refunder), nil otherwise:
// the backend, or, for a Redis Store that failed and let its Fallback
// decide, the Fallback, which alone charged the lease (Redis never saw it,
// and a refund there would credit units no one charged).
func (s *LeaseStore) grant(ctx context.Context, now time.Time, req []core.Request, out []core.Decision) (core.Refunder, error) {
	s.calls.Add(1)
	if st, ok := s.backend.(*Store); ok {
		fellBack, err := st.take(ctx, now, req, out)
		if fellBack {
			rf, _ := st.fallback.(core.Refunder)
			return rf, err
		}
		return st, err
	}
	err := s.backend.Take(ctx, now, req, out)
	rf, _ := s.backend.(core.Refunder)
	return rf, err
}

// hold returns k's entry with its sem held, waiting for it until ctx ends.
func (s *LeaseStore) hold(ctx context.Context, k leaseKey, t int64) (*leaseEntry, error) {
	for {
		e := s.entry(k, t)
		select {
		case e.sem <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("redisstore: waiting for a lease: %w", ctx.Err())
		}
		if !e.dead.Load() {
			return e, nil
		}
		<-e.sem // forgotten by the LRU meanwhile: take the new entry
	}
}

// leaseEvictionScan bounds the keys with a running lease that entry moves
// past to forget one without.
const leaseEvictionScan = 64

// entry returns k's entry, created if needed at t. When the store is full,
// it forgets the least recently used key without a running lease (no units
// left, or a lease that ended more than MaxAge before t: a caller's clock
// may run ahead of the lease holder's) among the leaseEvictionScan least
// recently used, or, if they all have one, the one of them whose lease
// ends first: a flood of one-off keys must not make it forget a hot key's
// lease, whose units would be lost.
func (s *LeaseStore) entry(k leaseKey, t int64) *leaseEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.keys.Get(k); ok {
		return e
	}
	if s.keys.Len() >= s.maxKeys {
		// Past running leases, remembering the one that ends first: if the
		// scan finds no key without one, that one is forgotten.
		var (
			first      leaseKey
			firstUntil int64
			found      bool
		)
		for i := range min(leaseEvictionScan, s.keys.Len()) {
			old, oe, ok := s.keys.GetOldest()
			if !ok || oe.left.Load() == 0 || t >= oe.until.Load()+s.maxAge {
				found = true
				break
			}
			if u := oe.until.Load(); i == 0 || u < firstUntil {
				first, firstUntil = old, u
			}
			s.keys.Get(old) // a running lease's key: to the front, and look at the next
		}
		if !found {
			s.keys.Remove(first)
		}
	}
	e := &leaseEntry{sem: make(chan struct{}, 1)}
	s.keys.Add(k, e)
	return e
}

// note counts a decision at t and reports whether the key is hot. It
// requires e.sem held.
func (e *leaseEntry) note(t int64, n int, p int64) bool {
	switch {
	case t < e.period: // read before another caller's later time
		if e.count == 0 || t < e.period-p {
			e.period, e.count, e.prev = t, 0, 0
		}
	case e.count == 0:
		e.period, e.count, e.prev = t, 0, 0
	case t-e.period >= 2*p:
		e.period, e.count, e.prev = t, 0, 0
	case t-e.period >= p:
		e.period, e.prev, e.count = e.period+p, e.count, 0
	}
	e.count++
	return e.count >= n || e.prev >= n
}

// lease asks the backend for a lease paying r, and decides r with it. It
// requires e.sem held and e's lease empty.
func (s *LeaseStore) lease(ctx context.Context, now time.Time, t int64, e *leaseEntry, r *core.Request, out []core.Decision) error {
	want := min(s.size, r.Policy.Capacity())
	req := [1]core.Request{{Policy: r.Policy, Key: r.Key}}
	for refused := false; ; refused = true {
		req[0].Cost = want
		src, err := s.grant(ctx, now, req[:], out[:1])
		if err != nil {
			return err
		}
		d := &out[0]
		if !d.Allowed {
			if want == r.Cost {
				// The backend's own refusal of r. Until its RetryAfter
				// ends, ask for no lease: decide exactly, one call each.
				e.granted, e.expires = t, t
				e.until.Store(t)
				e.exactUntil = t + int64(d.RetryAfter)
				return nil
			}
			if !refused && d.Remaining >= r.Cost && d.Remaining < want {
				// Once: under contention each refusal would name a
				// smaller Remaining, and the key waits on its calls.
				want = d.Remaining
			} else {
				want = r.Cost
			}
			continue
		}
		if want == r.Cost {
			return nil // decided exactly
		}
		left := want - r.Cost
		s.leases.Add(1)
		s.leased.Add(uint64(want))
		e.granted, e.expires = t, t+s.maxAge
		e.charged = d.Policy.ChargeStart(now, want, *d)
		e.until.Store(e.expires)
		for g := s.granted.Load(); t > g && !s.granted.CompareAndSwap(g, t); g = s.granted.Load() {
		}
		e.resetAt = t + int64(d.ResetAfter)
		e.limit = d.Limit
		e.fallback = d.Fallback
		e.src = src
		e.left.Store(left)
		if e.dead.Load() { // forgotten while leasing: nobody can spend it
			s.expired.Add(uint64(e.left.Swap(0)))
		}
		d.Remaining = left
		return nil
	}
}
