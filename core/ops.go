package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Peeker is implemented by a Store that can report decisions without
// charging them.
//
// Peek decides reqs at now exactly as Take would (the same decisions, the
// same errors, and the same all-or-nothing reporting of a batch), but
// charges nothing: a key never seen stays unstored, and a record written
// under another policy is read through the carry-over of Store without
// being rewritten. The one state it writes is a record of the request's
// policy left ahead of a clock that stepped back, rewritten clamped to now
// as every decision rewrites it (see Algorithm): the bound on how long such
// a record refuses runs from the first decision after the step, and a
// Peek's RetryAfter must hold for the Take that follows it.
type Peeker interface {
	// Peek writes to out[i] the decision Take would make for reqs[i] at
	// now, and returns the error Take would return, but charges nothing.
	// Any other error is a backend failure.
	Peek(ctx context.Context, now time.Time, reqs []Request, out []Decision) error
}

// Resetter is implemented by a Store that can forget a key.
//
// Reset forgets the state of key under the Name of p, whatever policy wrote
// it, so that the key's next request finds its quota whole, as after a
// successful login. Resetting a key the store does not hold is not an
// error.
type Resetter interface {
	// Reset forgets key under p's Name. It returns nil when the key is
	// forgotten or was not held, and an error otherwise: for a nil p, or a
	// backend failure.
	Reset(ctx context.Context, p *Policy, key string) error
}

// Refunder is implemented by a Store that can give back units charged
// earlier.
//
// Refund gives back Cost units to every request of reqs at now, atomically:
// either every request is refunded or, on an error, none is. (A store
// whose keys live on several nodes may refund a batch node by node, each
// atomically, and says so, as the Redis store does for a batch spanning
// Cluster slots: a failure then leaves the charges on the nodes not
// reached, which limits more, never less.) What a refund
// gives back depends on the algorithm, and is never more than the key has
// in use, so a key never holds more than its capacity. A request with
// ChargedAt, the time of the charge it gives back, gets back only what that
// charge still holds:
//
//   - TokenBucket and LeakyBucket: the theoretical arrival time moves back
//     by Cost x Window / Limit, never before now (Cost tokens come back);
//     with ChargedAt, less the time elapsed since the charge began to give
//     its units back (Policy.ChargeStart), and nothing while the state is
//     ahead of a clock that stepped back.
//   - FixedWindow: Cost is subtracted from the current window's count; a
//     charge made in an earlier window (with ChargedAt: in another window
//     than now's) has expired and gives back nothing.
//   - SlidingWindowCounter: Cost is subtracted from the current window's
//     count, then what is left of it from the previous window's; with
//     ChargedAt, only from the count of the window the charge went to.
//   - SlidingWindowLog: the most recent entries of the trailing window
//     lose up to Cost units; with ChargedAt, only the entry of the
//     charge's time (none once it has left the window).
//   - A custom Algorithm implementing AlgorithmRefunder: its Refund, or,
//     with ChargedAt, its RefundCharge if it implements
//     AlgorithmChargeRefunder.
//
// Without ChargedAt a refund cannot tell which charges it stands for: made
// after a later charge (or, for the windows, after a window boundary), it
// gives back that charge's units. With ChargedAt, a key whose record
// another policy has written since gives back nothing, and so, in a
// MemoryStore, does a key evicted, holding state, since the charge (a full
// shard that has evicted more keys than it remembers, 32, since the
// charge gives back nothing for any key: see MemoryStore). Four limits
// remain, where a refund may give back units of later charges: a record
// that requests under another policy have converted and that requests under
// the refund's policy have converted back holds no history of the charge;
// a record reset (Resetter) since the charge holds only later charges (the
// root package's Limiter skips such refunds for its own resets);
// a clock that steps back between the charge and the refund shortens the
// time the refund sees the charge recovering; and in a bucket, the refund
// of an earlier charge moves the later charges' units forward, so that a
// later charge's ChargedAt (its start, from Policy.ChargeStart) is late. A refund of a key the store does
// not hold does nothing. A record written
// under another policy of the same Name is first carried over (see Store)
// and then refunded under the request's policy. A store cannot tell which
// charges a refund stands for: give back only what was charged.
//
// Refund validates the batch as Take does (ErrInvalidCost,
// ErrCostExceedsCapacity, ErrDuplicateRequest, ErrBatchTooLarge) and returns
// an error wrapping ErrRefundUnsupported, refunding nothing, when a
// request's algorithm cannot refund, and ErrFallbackCharge for a request
// marked as charged by a fallback (Request.Fallback) on a store that has
// none.
type Refunder interface {
	// Refund gives back the Cost of every request of reqs at now, as
	// described above. It returns nil once the batch is refunded (a key
	// not held gives back nothing), and an error otherwise: an invalid
	// batch, an algorithm that cannot refund, a fallback's charge on a
	// store without one, or a backend failure.
	Refund(ctx context.Context, now time.Time, reqs []Request) error
}

// AlgorithmRefunder is implemented by an Algorithm that can give back units
// charged earlier; every built-in algorithm does. Refund updates s to give
// back up to cost units at now (1 <= cost <= p.Capacity(), now in
// [MinTime, MaxTime]), never more than the state has in use. It is called
// with the state locked, like Decide.
type AlgorithmRefunder interface {
	// Refund gives back up to cost units of s at now, in place; it cannot
	// fail.
	Refund(p *Policy, s *State, cost, now int64)
}

// AlgorithmChargeRefunder is implemented by an AlgorithmRefunder that can
// give back the units of one charge, named by chargedAt (Unix nanoseconds:
// the Request's ChargedAt, which may be after now if the clock has since
// stepped back): every built-in algorithm does. RefundCharge updates s to
// give back up to cost units of what that charge still holds at now, never
// what has recovered since nor the units of later charges. It is called
// with the state locked, like Decide.
type AlgorithmChargeRefunder interface {
	// RefundCharge gives back up to cost units of s at now, in place, out
	// of what the charge made at chargedAt still holds; it cannot fail.
	RefundCharge(p *Policy, s *State, cost, chargedAt, now int64)
}

var (
	// ErrUnsupported is returned by a Limiter's Peek, Reset and Refund when
	// its Store does not implement Peeker, Resetter or Refunder.
	ErrUnsupported = errors.New("ratelimit: the store does not support this operation")
	// ErrRefundUnsupported is returned by Refund for a request whose
	// Algorithm does not implement AlgorithmRefunder.
	ErrRefundUnsupported = errors.New("ratelimit: the algorithm cannot refund")
	// ErrFallbackCharge is returned by Refund for a request marked as
	// charged by a fallback (Request.Fallback) by a store that has none:
	// it made no such charge, and refunds nothing.
	ErrFallbackCharge = errors.New("ratelimit: refund of a charge a fallback made, to a store without one")
)

var (
	_ Peeker   = (*MemoryStore)(nil)
	_ Resetter = (*MemoryStore)(nil)
	_ Refunder = (*MemoryStore)(nil)
)

// CheckRefund validates a batch for Refunder.Refund the way every Store
// must before touching state: its size, costs (at least 1, at most the
// capacity), duplicates, and that every algorithm can refund.
func CheckRefund(reqs []Request) error {
	if len(reqs) > MaxBatch {
		return ErrBatchTooLarge
	}
	var out [MaxBatch]Decision
	if over, err := CheckBatch(reqs, out[:len(reqs)]); err != nil {
		if over >= 0 {
			r := &reqs[over]
			return fmt.Errorf("%w: refund of %q capacity %d, cost %d", err, r.Policy.rule.Name, r.Policy.capacity, r.Cost)
		}
		return err
	}
	for i := range reqs {
		if _, ok := reqs[i].Policy.alg.(AlgorithmRefunder); !ok {
			return fmt.Errorf("%w: %s", ErrRefundUnsupported, reqs[i].Policy.alg.Name())
		}
	}
	return nil
}

// lockOrder fills hashes with the hash of every request, shardIdx with its
// shard and order with the distinct shards, ascending, and returns their
// number.
func (m *MemoryStore) lockOrder(reqs []Request, hashes *[MaxBatch]uint64, shardIdx, order *[MaxBatch]int) int {
	nord := 0
	for i := range reqs {
		h := m.hash(&reqs[i])
		si := m.shard(h)
		hashes[i], shardIdx[i] = h, si
		j := nord
		for j > 0 && order[j-1] > si {
			j--
		}
		if j > 0 && order[j-1] == si {
			continue
		}
		copy(order[j+1:nord+1], order[j:nord])
		order[j] = si
		nord++
	}
	return nord
}

// Reset implements Resetter: it forgets key under p's Name.
func (m *MemoryStore) Reset(_ context.Context, p *Policy, key string) error {
	if p == nil {
		return errors.New("ratelimit: reset without a policy")
	}
	r := Request{Policy: p, Key: key}
	h := m.hash(&r)
	s := &m.shards[m.shard(h)]
	s.lock()
	s.remove(h)
	s.mu.Unlock()
	return nil
}

// Refund implements Refunder. It locks the batch's shards in index order,
// as Take does, so the batch is refunded atomically. A refund renews its
// key's recency as a decision does (see MemoryStore). It refuses, with
// ErrFallbackCharge, a request whose charge another store's fallback made
// (Request.Fallback): a MemoryStore has no fallback, and made no such
// charge.
func (m *MemoryStore) Refund(_ context.Context, now time.Time, reqs []Request) error {
	for i := range reqs {
		if reqs[i].Fallback {
			return ErrFallbackCharge
		}
	}
	return m.refund(reqs, ClampTime(now))
}

func (m *MemoryStore) refund(reqs []Request, now int64) error {
	if err := CheckRefund(reqs); err != nil {
		return err
	}
	var (
		shardIdx, order [MaxBatch]int
		hashes          [MaxBatch]uint64
	)
	nord := m.lockOrder(reqs, &hashes, &shardIdx, &order)
	for _, si := range order[:nord] {
		m.shards[si].lock()
	}
	for i := range reqs {
		r := &reqs[i]
		s := &m.shards[shardIdx[i]]
		ref, sl, ok := s.find(hashes[i], &s.cur)
		if !ok {
			continue // never charged, or forgotten: nothing in use
		}
		if converted(&s.cur, r.Policy) && !r.ChargedAt.IsZero() {
			// A record another policy wrote since the charge holds none of
			// the charge's own history: nothing is given back.
			continue
		}
		if !r.ChargedAt.IsZero() && s.evictedSince(hashes[i], before(ClampTime(r.ChargedAt), chargeLead(r.Policy))) {
			// Evicted since the charge (or maybe: see evictedSince), the
			// key's record holds only later charges: nothing is given back.
			continue
		}
		if s.adopt(&s.cur, r.Policy, now) {
			continue // a conversion that drops units is not stored (see adopt)
		}
		refundOne(r, &s.cur.st, now)
		s.put(hashes[i], ref, sl, &s.cur)
	}
	for k := nord - 1; k >= 0; k-- {
		s := &m.shards[order[k]]
		s.cur = memEntry{}
		s.mu.Unlock()
	}
	return nil
}

// refundOne gives back r's cost in st at now, by the charge r.ChargedAt
// names when the algorithm can (see Refunder).
func refundOne(r *Request, st *State, now int64) {
	p := r.Policy
	if !r.ChargedAt.IsZero() {
		if cr, ok := p.alg.(AlgorithmChargeRefunder); ok {
			cr.RefundCharge(p, st, r.Cost, ClampTime(r.ChargedAt), now)
			return
		}
	}
	p.alg.(AlgorithmRefunder).Refund(p, st, r.Cost, now)
}

// Peek implements Peeker. It locks the batch's shards in index order, as
// Take does, and decides on copies of the states. It predicts ErrStoreFull
// as Take would meet it, from the keys the shards hold; with KeepActive it
// examines the shard's least recently used keys in order.
func (m *MemoryStore) Peek(_ context.Context, now time.Time, reqs []Request, out []Decision) error {
	return m.peekBatch(reqs, out, ClampTime(now))
}

func (m *MemoryStore) peekBatch(reqs []Request, out []Decision, now int64) error {
	over, err := CheckBatch(reqs, out)
	if err != nil && !errors.Is(err, ErrCostExceedsCapacity) {
		return err
	}
	err = nil
	var (
		shardIdx, order [MaxBatch]int
		hashes          [MaxBatch]uint64
		held            [MaxBatch]memEntry // copies of the held records
		found           [MaxBatch]bool
	)
	n := len(reqs)
	nord := m.lockOrder(reqs, &hashes, &shardIdx, &order)
	for _, si := range order[:nord] {
		m.shards[si].lock()
	}
	all := true
	for i := 0; i < n; i++ {
		r := &reqs[i]
		s := &m.shards[shardIdx[i]]
		if _, sl, ok := s.find(hashes[i], &held[i]); ok {
			found[i] = true
			if held[i].pol.identity == r.Policy.identity {
				// A state left ahead of a clock that stepped back is
				// written clamped, as every decision writes it (charging
				// nothing), so that the RetryAfter reported holds for
				// the next decision, whose own clamp would otherwise
				// start again from its later time. Only the state is
				// written: a Peek does not renew the key in the LRU. It
				// is clamped under the request's policy, as its Take
				// would clamp it (policies of one Identity may differ in
				// MaxDelay, and so in how far ahead a state may be).
				s.cur = held[i]
				r.Policy.alg.Decide(r.Policy, &s.cur.st, 0, now, true, &s.dec)
				held[i].st = s.cur.st
				s.write(sl, &s.cur.st)
				s.cur = memEntry{}
			}
		}
		lost := m.peekState(s, held[i], found[i], r.Policy, now, &s.scratch)
		// Every request over its capacity (CheckBatch names the first) is
		// decided at cost 0 and refused with no RetryAfter: Decide takes
		// no cost above the capacity.
		cost, big := r.Cost, r.Cost > r.Policy.capacity
		if big {
			cost = 0
		}
		r.Policy.alg.Decide(r.Policy, &s.scratch, cost, now, false, &s.dec)
		out[i] = s.dec
		if big {
			out[i].Allowed = false
			out[i].RetryAfter = 0
		} else if found[i] && converted(&held[i], r.Policy) && (lost || !out[i].Allowed) {
			// refused, as Take refuses it (see takeOther); Peek writes
			// only a clamp
			s.refuseConverted(held[i], hashes[i], r.Policy, cost, now, &out[i], lost)
		}
		all = all && out[i].Allowed
	}
	var retry int64
	if all {
		never := false
		for _, si := range order[:nord] {
			need, own := 0, 0
			for i := 0; i < n; i++ {
				if shardIdx[i] == si {
					if !found[i] {
						need++
					} else {
						own++
					}
				}
			}
			if need == 0 {
				continue
			}
			if r, e := m.roomFor(&m.shards[si], need, own, hashes[:n], now); e != nil {
				err = e
				never = never || r == 0
				retry = max(retry, r)
			}
		}
		if never {
			retry = 0
		}
		if err != nil {
			all = false
		}
	}
	if !all {
		// Report the requests that would have passed without their cost.
		for i := 0; i < n; i++ {
			if !out[i].Allowed {
				continue
			}
			r := &reqs[i]
			s := &m.shards[shardIdx[i]]
			m.peekState(s, held[i], found[i], r.Policy, now, &s.scratch)
			r.Policy.alg.Decide(r.Policy, &s.scratch, 0, now, false, &s.dec)
			out[i] = s.dec
			if err != nil {
				out[i].Allowed = false
				out[i].RetryAfter = time.Duration(retry)
			}
		}
	}
	for k := nord - 1; k >= 0; k-- {
		s := &m.shards[order[k]]
		s.scratch = State{}
		s.mu.Unlock()
	}
	if over >= 0 {
		return fmt.Errorf("%w: %q capacity %d, cost %d", ErrCostExceedsCapacity, reqs[over].Policy.rule.Name, reqs[over].Policy.capacity, reqs[over].Cost)
	}
	return err
}

// peekState sets st to the state e holds for p at now: a zero State for a
// key not held (found false), and the carried-over state for a record of
// another Identity, reporting whether that dropped units above p's
// capacity (see adopt). Requires s.mu.
func (m *MemoryStore) peekState(s *memShard, e memEntry, found bool, p *Policy, now int64, st *State) (lost bool) {
	*st = State{}
	if !found {
		return false
	}
	if !converted(&e, p) {
		*st = e.st // Decide without commit writes nothing, the log included
		return false
	}
	s.exam = e
	lost = s.adopt(&s.exam, p, now)
	*st = s.exam.st
	s.exam = memEntry{}
	return lost
}

// roomFor is makeRoom without removing anything: the error and RetryAfter
// Take would meet making room for need new keys in s (it writes only the
// clamps a decision writes, as Peek does). Requires s.mu.
func (m *MemoryStore) roomFor(s *memShard, need, own int, batch []uint64, now int64) (int64, error) {
	if need+own > s.cap {
		return 0, fmt.Errorf("%w: a batch needs %d keys in a shard of %d", ErrStoreFull, need+own, s.cap)
	}
	excess := s.count() + need - s.cap
	if excess <= 0 || !m.keepActive {
		return 0, nil
	}
	if wait := s.recoveryWait(excess, batch, now); wait > 0 {
		return wait, ErrStoreFull
	}
	return 0, nil
}

// Peek reports the decisions Take would make for reqs now, charging
// nothing, and whether the batch would be admitted (see Peeker). It returns
// an error wrapping ErrUnsupported when the Store is not a Peeker.
func (l *Limiter) Peek(ctx context.Context, reqs []Request, out []Decision) (bool, error) {
	return l.PeekAt(ctx, l.clock.Now(), reqs, out)
}

// PeekAt is Peek at a time read from the Limiter's Clock.
func (l *Limiter) PeekAt(ctx context.Context, now time.Time, reqs []Request, out []Decision) (bool, error) {
	if l.mem != nil {
		return admitted(reqs, out, l.mem.peekBatch(reqs, out, ClampTime(now)))
	}
	pk, ok := l.store.(Peeker)
	if !ok {
		return false, fmt.Errorf("%w: %T has no Peek", ErrUnsupported, l.store)
	}
	if len(out) < len(reqs) {
		return false, ErrShortOutput
	}
	rc := append([]Request(nil), reqs...)
	oc := make([]Decision, len(reqs))
	err := pk.Peek(ctx, now, rc, oc)
	copy(out, oc)
	return admitted(reqs, out, err)
}

// Refund gives back the cost of requests charged earlier, atomically, now
// (see Refunder). It returns an error wrapping ErrUnsupported when the
// Store is not a Refunder.
func (l *Limiter) Refund(ctx context.Context, reqs []Request) error {
	return l.RefundAt(ctx, l.clock.Now(), reqs)
}

// RefundAt is Refund at a time read from the Limiter's Clock.
func (l *Limiter) RefundAt(ctx context.Context, now time.Time, reqs []Request) error {
	if l.mem != nil {
		return l.mem.Refund(ctx, now, reqs)
	}
	rf, ok := l.store.(Refunder)
	if !ok {
		return fmt.Errorf("%w: %T has no Refund", ErrUnsupported, l.store)
	}
	return rf.Refund(ctx, now, append([]Request(nil), reqs...))
}

// Reset forgets key's state under the Name of p, or, when p is nil, of the
// policy Allow would decide key under (the Resolver's, else the Limiter's),
// so that its next request finds the quota whole (see Resetter). It returns
// ErrNoPolicy when there is no policy and an error wrapping ErrUnsupported
// when the Store is not a Resetter.
func (l *Limiter) Reset(ctx context.Context, p *Policy, key string) error {
	if p == nil && l.resolver != nil {
		rp, err := l.resolver.Resolve(ctx, key)
		if err != nil {
			return fmt.Errorf("ratelimit: resolving the policy: %w", err)
		}
		p = rp
	}
	if p == nil {
		p = l.policy
	}
	if p == nil {
		return ErrNoPolicy
	}
	rs, ok := l.store.(Resetter)
	if !ok {
		return fmt.Errorf("%w: %T has no Reset", ErrUnsupported, l.store)
	}
	return rs.Reset(ctx, p, key)
}
