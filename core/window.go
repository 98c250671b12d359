package core

import (
	"errors"
	"math"
	"time"
)

func windowValidate(r Rule) error {
	if r.Burst != 0 {
		return errors.New("Burst must be 0 for window algorithms (their capacity is Limit)")
	}
	if r.MaxDelay != 0 {
		return errors.New("MaxDelay applies only to LeakyBucket")
	}
	return nil
}

// windowIndex returns floor(now / w), the index of the epoch-aligned window
// holding now.
func windowIndex(now, w int64) int64 {
	i := now / w
	if now%w < 0 {
		i--
	}
	return i
}

// fixedWindow keeps A = window index, B = units admitted in it.
type fixedWindow struct{}

func (fixedWindow) Name() string { return "fixed_window" }

func (fixedWindow) Validate(r Rule) error { return windowValidate(r) }

func (fixedWindow) Capacity(r Rule) int64 { return r.Limit }

func (fixedWindow) Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	*d = Decision{Limit: p.capacity, Policy: p}
	var shift int64
	if s.B > 0 {
		// A window that starts at most ClockTolerance after now is the
		// window of a decision made first by a caller that read its clock
		// later: decided in it, as at its start.
		now, shift = settle(now, s.A*p.window)
	}
	idx := windowIndex(now, p.window)
	var count int64
	moved := false
	if s.B > 0 {
		switch {
		case s.A == idx:
			count = s.B
		case s.A > idx:
			// The clock stepped back (by more than ClockTolerance, see
			// settle above): the count of a window that lies in the future
			// is this window's count, so the key recovers when this window
			// ends, and nothing is credited.
			count, moved = s.B, true
		}
	}
	end := (idx + 1) * p.window
	if count+cost <= p.capacity {
		d.Allowed = true
		count += cost
	} else {
		d.RetryAfter = time.Duration(end - now)
	}
	if commit && (d.Allowed && cost > 0 || moved) {
		s.A, s.B = idx, count
	}
	d.Remaining = p.capacity - count
	if count > 0 {
		d.ResetAfter = time.Duration(end - now)
	}
	if shift > 0 {
		d.later(shift)
	}
}

func (fixedWindow) Expiry(p *Policy, s *State) int64 {
	if s.B == 0 {
		return math.MinInt64
	}
	return (s.A + 1) * p.window
}

// slidingWindowCounter keeps A = current window index and B = the previous
// window's count << 32 | the current window's count.
type slidingWindowCounter struct{}

func (slidingWindowCounter) Name() string { return "sliding_window_counter" }

func (slidingWindowCounter) Validate(r Rule) error {
	if r.Limit >= 1<<32 {
		return errors.New("Limit must be below 2^32 for SlidingWindowCounter")
	}
	return windowValidate(r)
}

func (slidingWindowCounter) Capacity(r Rule) int64 { return r.Limit }

// swcCounts returns the window index and the previous and current counts
// as of now. A record of a window that lies in the future (the clock
// stepped back; Decide and Refund first settle a time within
// ClockTolerance of the record's window) counts in full, capped at the capacity, as the current
// window's count, and moved reports it: the key recovers within two
// windows, and nothing is credited, since the weighted count of the record
// never exceeded min(prev + curr, capacity).
func swcCounts(p *Policy, s *State, now int64) (idx, prev, curr int64, moved bool) {
	idx = windowIndex(now, p.window)
	if s.B == 0 {
		return idx, 0, 0, false
	}
	sp, sc := int64(uint64(s.B)>>32), s.B&(1<<32-1)
	switch {
	case idx == s.A:
		return idx, sp, sc, false
	case idx < s.A:
		return idx, 0, min(sp+sc, p.capacity), true
	case idx == s.A+1:
		return idx, sc, 0, false
	default:
		return idx, 0, 0, false
	}
}

// swcWeighted returns ceil(prev x (w - e) / w), the previous window's
// weighted contribution at elapsed time e into the current window.
func swcWeighted(prev, e, w int64) int64 {
	if prev == 0 {
		return 0
	}
	if e < 0 {
		e = 0
	}
	q, r := mulAddDiv(uint64(prev), uint64(w-e), 0, uint64(w))
	return int64(q) + b2i(r > 0)
}

// swcEarliest returns the earliest elapsed time e in [0, w) at which
// prev x (w-e) <= room x w holds, or w when none does.
func swcEarliest(prev, room, w int64) int64 {
	if room < 0 {
		return w
	}
	if prev == 0 {
		return 0
	}
	// e >= w - room x w / prev, so e = w - floor(room x w / prev).
	q, _ := mulAddDiv(uint64(room), uint64(w), 0, uint64(prev))
	if q >= uint64(w) {
		return 0
	}
	return w - int64(q)
}

func (slidingWindowCounter) Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	*d = Decision{Limit: p.capacity, Policy: p}
	w := p.window
	var shift int64
	if s.B != 0 {
		now, shift = settle(now, s.A*w) // as in fixedWindow.Decide
	}
	idx, prev, curr, moved := swcCounts(p, s, now)
	start := idx * w
	e := now - start
	used := swcWeighted(prev, e, w) + curr
	if used+cost <= p.capacity {
		d.Allowed = true
		curr += cost
		used += cost
		if commit && (cost > 0 || moved) {
			s.A, s.B = idx, int64(uint64(prev)<<32|uint64(curr))
		}
	} else {
		if commit && moved {
			s.A, s.B = idx, int64(uint64(prev)<<32|uint64(curr))
		}
		// This window, once the previous window's weight has decayed enough.
		var at int64
		if e2 := swcEarliest(prev, p.capacity-curr-cost, w); e2 < w {
			at = start + e2
		} else if e3 := swcEarliest(curr, p.capacity-cost, w); e3 < w {
			at = start + w + e3 // the next window, where curr becomes prev
		} else {
			at = start + 2*w
		}
		if at <= now {
			at = now + 1
		}
		d.RetryAfter = time.Duration(at - now)
	}
	d.Remaining = max(p.capacity-used, 0)
	switch {
	case curr > 0:
		d.ResetAfter = time.Duration(start + 2*w - now)
	case prev > 0:
		d.ResetAfter = time.Duration(start + w - now)
	}
	if shift > 0 {
		d.later(shift)
	}
}

func (slidingWindowCounter) Expiry(p *Policy, s *State) int64 {
	switch {
	case s.B&(1<<32-1) != 0:
		return (s.A + 2) * p.window
	case s.B != 0:
		return (s.A + 1) * p.window
	}
	return math.MinInt64
}

// RefundCharge gives back up to cost units of the count of the charge made
// at at, while the state's window is that charge's and is not over: a
// charge made in an earlier window has expired, and a state of a later
// window holds later charges (also when the clock has since stepped back).
func (fixedWindow) RefundCharge(p *Policy, s *State, cost, at, now int64) {
	if s.B == 0 || s.A != windowIndex(at, p.window) || s.A < windowIndex(now, p.window) {
		return
	}
	s.B -= min(s.B, cost)
}

// Refund gives back up to cost units of the current window's count; a
// charge made in an earlier window has already expired.
func (fixedWindow) Refund(p *Policy, s *State, cost, now int64) {
	if s.B > 0 {
		now, _ = settle(now, s.A*p.window)
	}
	idx := windowIndex(now, p.window)
	if s.B == 0 || s.A < idx {
		return
	}
	// A window that lies in the future counts as this one (see Decide).
	s.A, s.B = idx, s.B-min(s.B, cost)
}

// RefundCharge gives back up to cost units of the count of the window the
// charge made at at went to, as the state holds it: its current window's
// or the one before; from an older window nothing is left (and the state
// of a later window, also when the clock has since stepped back, holds no
// count of the charge's).
func (slidingWindowCounter) RefundCharge(p *Policy, s *State, cost, at, now int64) {
	if s.B == 0 {
		return
	}
	sp, sc := int64(uint64(s.B)>>32), s.B&(1<<32-1)
	switch windowIndex(at, p.window) {
	case s.A:
		sc -= min(sc, cost)
	case s.A - 1:
		sp -= min(sp, cost)
	default:
		return
	}
	s.B = int64(uint64(sp)<<32 | uint64(sc))
}

// Refund gives back up to cost units, from the current window's count
// first (the most recent charges), then from the previous window's.
func (slidingWindowCounter) Refund(p *Policy, s *State, cost, now int64) {
	if s.B != 0 {
		now, _ = settle(now, s.A*p.window)
	}
	idx, prev, curr, _ := swcCounts(p, s, now)
	if prev == 0 && curr == 0 {
		if s.B != 0 {
			s.A, s.B = idx, 0
		}
		return
	}
	k := min(curr, cost)
	curr -= k
	prev -= min(prev, cost-k)
	s.A, s.B = idx, int64(uint64(prev)<<32|uint64(curr))
}
