package core

import (
	"errors"
	"math"
	"math/bits"
	"time"
)

// The token and leaky buckets share one exact GCRA implementation. The
// state is the theoretical arrival time TAT = A + (B-1)/Limit nanoseconds
// (1 <= B <= Limit): the time at which the bucket would be whole again. B
// is 0 only in the zero State, a key never seen, which is whole at every
// instant (before 1970 too). A unit costs Window/Limit ns of TAT; the bucket
// admits while TAT' - now <= tau, tau being capacity x Window/Limit.
//
// A TAT further ahead than any admission can put it (now + tau + MaxDelay)
// comes from a decision at a later time. By at most ClockTolerance, it is
// read as it is (a caller that read its clock before another, decided
// after it: refused, nothing written). Further, the clock stepped back:
// that arrival time is read as exactly now + tau + MaxDelay, an empty
// bucket, so the key is refused for at most its own refill time (plus
// MaxDelay and ClockTolerance) and is never credited.

type tokenBucket struct{}

func (tokenBucket) Name() string { return "token_bucket" }

func (tokenBucket) Validate(r Rule) error {
	if r.MaxDelay != 0 {
		return errors.New("MaxDelay applies only to LeakyBucket")
	}
	return nil
}

func (tokenBucket) Capacity(r Rule) int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

func (tokenBucket) Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	gcraDecide(p, s, cost, now, commit, d)
}

func (tokenBucket) Expiry(p *Policy, s *State) int64 { return gcraExpiry(s) }

type leakyBucket struct{}

func (leakyBucket) Name() string { return "leaky_bucket" }

func (leakyBucket) Validate(Rule) error { return nil }

func (leakyBucket) Capacity(r Rule) int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return 1
}

func (leakyBucket) Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	gcraDecide(p, s, cost, now, commit, d)
}

func (leakyBucket) Expiry(p *Policy, s *State) int64 { return gcraExpiry(s) }

func gcraExpiry(s *State) int64 {
	if s.B == 0 {
		return math.MinInt64
	}
	return s.A + b2i(s.B > 1)
}

func gcraDecide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	*d = Decision{Limit: p.capacity, Policy: p}
	// base = max(TAT, now): a clock behind TAT sees fewer tokens, never
	// more, and at most an empty bucket (clamped: see above).
	bq, br := now, uint64(0)
	clamped := false
	if s.B != 0 && (s.A > now || (s.A == now && s.B > 1)) {
		bq, br = s.A, uint64(s.B-1)
		if lq := now + p.tauQ + p.maxDelay; !lessEq(bq, br, lq+int64(ClockTolerance), p.tauR) {
			bq, br, clamped = lq, p.tauR, true
		}
	}
	// TAT' = base + cost x Window/Limit.
	var nq int64
	var nr uint64
	if cost == 1 {
		// One unit, the common case, needs no division.
		nq, nr = bq+p.unitQ, br+p.unitR
		if nr >= p.limit {
			nq, nr = nq+1, nr-p.limit
		}
	} else {
		q, r := mulAddDiv(uint64(cost), uint64(p.window), br, p.limit)
		nq, nr = bq+int64(q), r
	}
	// Admit while TAT' - now <= tau + MaxDelay.
	dq := nq - now
	if lessEq(dq, nr, p.tauQ+p.maxDelay, p.tauR) {
		d.Allowed = true
		if !lessEq(dq, nr, p.tauQ, p.tauR) {
			d.Delay = time.Duration(ceilDiff(dq, nr, p.tauQ, p.tauR))
		}
		d.Remaining = gcraRemaining(p, dq, nr)
		d.ResetAfter = time.Duration(ceilDiff(dq, nr, 0, 0))
		if commit && (cost > 0 || clamped) {
			s.A, s.B = nq, int64(nr)+1
		}
		return
	}
	if commit && clamped {
		s.A, s.B = bq, int64(br)+1
	}
	// Refused: admitted once TAT' - now' <= tau + MaxDelay.
	d.RetryAfter = time.Duration(ceilDiff(dq, nr, p.tauQ+p.maxDelay, p.tauR))
	d.Remaining = gcraRemaining(p, bq-now, br)
	d.ResetAfter = time.Duration(ceilDiff(bq-now, br, 0, 0))
}

// gcraRemaining returns the whole tokens left when TAT - now = dq + dr/Limit:
// capacity - ceil((TAT-now) / (Window/Limit)), at least 0.
func gcraRemaining(p *Policy, dq int64, dr uint64) int64 {
	if !lessEq(dq, dr, p.tauQ, p.tauR) {
		return 0
	}
	// (dq x Limit + dr) / Window <= capacity, so the quotient fits.
	var used int64
	if hi, lo := bits.Mul64(uint64(dq), p.limit); hi == 0 && lo <= 1<<63-1-dr {
		d := lo + dr // fits in 64 bits: a plain division is cheaper
		used = int64(d / uint64(p.window))
		if d%uint64(p.window) != 0 {
			used++
		}
	} else {
		q, r := mulAddDiv(uint64(dq), p.limit, dr, uint64(p.window))
		used = int64(q) + b2i(r > 0)
	}
	if used >= p.capacity {
		return 0
	}
	return p.capacity - used
}

func (tokenBucket) Refund(p *Policy, s *State, cost, now int64) {
	gcraRefund(p, s, cost, now, now, false)
}

func (leakyBucket) Refund(p *Policy, s *State, cost, now int64) {
	gcraRefund(p, s, cost, now, now, false)
}

func (tokenBucket) RefundCharge(p *Policy, s *State, cost, start, now int64) {
	gcraRefund(p, s, cost, start, now, true)
}

func (leakyBucket) RefundCharge(p *Policy, s *State, cost, start, now int64) {
	gcraRefund(p, s, cost, start, now, true)
}

// ChargeStart returns the time from which a charge of cost, decided as d at
// at, gives its units back: what a refund of it names as Request.ChargedAt.
// at is the now given to the Take that made the charge; when d.At is set
// (the store decided on a clock of its own), d.At is read instead, and the
// time returned is on that clock.
// For the window algorithms it is when the charge was recorded: at, or the
// key's own later time when at lay behind it (see ClockTolerance), which
// d.ResetAfter shows. The buckets give units back in the order they were
// charged: a charge made when the bucket was not full starts to give its
// units back only once the units in use before it have come back, at +
// d.ResetAfter less the charge's own refill time. d must be the Decision
// of that very charge: for one that charged nothing (refused, or with
// nothing in use) or that another policy made (d.Policy set and not p), it
// returns at, from which a refund gives back less, never more; the
// Decision of a charge of another cost under p cannot be told apart, and
// names a wrong start.
func (p *Policy) ChargeStart(at time.Time, cost int64, d Decision) time.Time {
	if !d.At.IsZero() {
		at = d.At
	}
	if p == nil || cost < 1 || cost > p.capacity || d.ResetAfter <= 0 || !d.Allowed || (d.Policy != nil && d.Policy != p) {
		return at
	}
	if !isGCRA(p) {
		return p.recordedAt(at, d)
	}
	q, r := mulAddDiv(uint64(cost), uint64(p.window), 0, p.limit) // the charge's refill time
	if r > 0 {
		q++
	}
	// ResetAfter is the charge's TAT less at, rounded up to the store's
	// resolution (a nanosecond, a Redis microsecond): the start is right to
	// within it.
	if lead := int64(d.ResetAfter) - int64(q); lead > 0 {
		return at.Add(time.Duration(lead))
	}
	return at
}

// recordedAt returns when a window algorithm recorded a charge admitted as
// d at at: at, unless at lay behind the key's state and the charge went to
// the state's time (see settle), which d.ResetAfter, counted from at, then
// reaches past the end it would have from at: the window after at's (for a
// sliding counter, the window after that), or Window past at (a sliding
// log's newest entry). A store that keeps time to the microsecond (Redis)
// reports ResetAfter from its own reading of at, up to a microsecond
// earlier: the windows are read a microsecond before the end.
func (p *Policy) recordedAt(at time.Time, d Decision) time.Time {
	t, w := ClampTime(at), p.window
	margin := min(int64(time.Microsecond), w)
	end := t + int64(d.ResetAfter) - margin
	switch p.alg {
	case FixedWindow:
		if idx := windowIndex(end, w); idx > windowIndex(t, w) {
			return time.Unix(0, idx*w)
		}
	case SlidingWindowCounter:
		if idx := windowIndex(end, w) - 1; idx > windowIndex(t, w) {
			return time.Unix(0, idx*w)
		}
	case SlidingWindowLog:
		if lead := int64(d.ResetAfter) - w; lead > 0 {
			return at.Add(time.Duration(lead))
		}
	}
	return at
}

// isGCRA reports whether p decides by a theoretical arrival time (the token
// and leaky buckets).
func isGCRA(p *Policy) bool { return p.alg == TokenBucket || p.alg == LeakyBucket }

// gcraTAT returns s's arrival time as Decide reads it at now: clamped at
// now + tau + MaxDelay when beyond it by more than tol (ClockTolerance;
// clamped reports it), or ok false when the bucket is whole at now.
func gcraTAT(p *Policy, s *State, now, tol int64) (aq int64, ar uint64, clamped, ok bool) {
	if s.B == 0 || s.A < now || (s.A == now && s.B == 1) {
		return 0, 0, false, false
	}
	aq, ar = s.A, uint64(s.B-1)
	if lq := now + p.tauQ + p.maxDelay; !lessEq(aq, ar, lq+tol, p.tauR) {
		aq, ar, clamped = lq, p.tauR, true
	}
	return aq, ar, clamped, true
}

// gcraInUse returns the units s has in use under p at now, ceil((TAT -
// now) x Limit / Window), a shaping bucket's queue beyond its capacity
// included: saturated at 1<<62, beyond any capacity. A TAT beyond now +
// tau + MaxDelay is read there, by however much: within ClockTolerance it
// is a later decision's, which left exactly that much in use at its time.
func gcraInUse(p *Policy, s *State, now int64) int64 {
	aq, dr, _, ok := gcraTAT(p, s, now, 0)
	if !ok {
		return 0
	}
	hi, lo := bits.Mul64(uint64(aq-now), p.limit)
	var c uint64
	lo, c = bits.Add64(lo, dr, 0)
	hi += c
	if hi >= uint64(p.window) {
		return 1 << 62
	}
	q, r := bits.Div64(hi, lo, uint64(p.window))
	if r > 0 {
		q++
	}
	return int64(min(q, 1<<62))
}

// gcraRoomWait returns the time until s has at most x units in use under p
// (see gcraInUse), at least 0.
func gcraRoomWait(p *Policy, s *State, x, now int64) int64 {
	aq, dr, _, ok := gcraTAT(p, s, now, int64(ClockTolerance))
	if !ok {
		return 0
	}
	dq := aq - now
	// TAT - now - x x Window / Limit, rounded up: x units fit in what is
	// left of TAT - now, which is within tau + MaxDelay.
	xq, xr, fits := mulDivChecked(uint64(x), uint64(p.window), p.limit)
	if !fits || xq > uint64(p.tauQ+p.maxDelay) {
		return 0
	}
	return max(ceilDiff(dq, dr, int64(xq), xr), 0)
}

// gcraRefund moves the theoretical arrival time back by cost x Window/Limit,
// never before now: the bucket regains at most cost units, never more than
// it has in use. With byCharge, start is when the charge began to give its
// units back (see Policy.ChargeStart) and the time since then is taken off
// (units come back one per emission interval from then on, whatever came
// after the charge), and a TAT left ahead of a clock that stepped back
// gives nothing back (which charges it holds is then unknown). Otherwise
// such a TAT is first clamped as Decide clamps it.
func gcraRefund(p *Policy, s *State, cost, start, now int64, byCharge bool) {
	aq, ar, clamped, ok := gcraTAT(p, s, now, int64(ClockTolerance))
	if !ok || (clamped && byCharge) {
		return // whole at now, or which charges it holds is unknown
	}
	q, r := mulAddDiv(uint64(cost), uint64(p.window), 0, p.limit)
	if byCharge && now > start {
		elapsed := uint64(now - start)
		if q < elapsed || (q == elapsed && r == 0) {
			return // the charge has given back all it held
		}
		q -= elapsed
	}
	nq := aq - int64(q)
	if ar < r {
		nq, ar = nq-1, ar+p.limit
	}
	nr := ar - r
	if lessEq(nq, nr, now, 0) {
		*s = State{} // whole: at every instant, also after a clock step back
		return
	}
	s.A, s.B = nq, int64(nr)+1
}
