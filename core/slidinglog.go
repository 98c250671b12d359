package core

import (
	"math"
	"time"
)

// slidingWindowLog keeps, in State.log, one entry per admission instant
// (a time and the units admitted then), oldest first.
type slidingWindowLog struct{}

func (slidingWindowLog) Name() string { return "sliding_window_log" }

func (slidingWindowLog) Validate(r Rule) error { return windowValidate(r) }

func (slidingWindowLog) Capacity(r Rule) int64 { return r.Limit }

type logEntry struct{ t, n int64 }

// timeLog is a ring buffer of log entries. Entries older than a cutoff are
// dropped lazily, when a committed decision prunes them.
type timeLog struct {
	ents  []logEntry
	head  int   // index of the oldest entry
	len   int   // number of entries
	total int64 // sum of n over the entries
}

func (l *timeLog) at(i int) *logEntry { return &l.ents[(l.head+i)%len(l.ents)] }

func (l *timeLog) newest() int64 {
	if l == nil || l.len == 0 {
		return 0
	}
	return l.at(l.len - 1).t
}

// expired returns the number of leading entries with t <= cutoff and the
// units they hold.
func (l *timeLog) expired(cutoff int64) (k int, units int64) {
	for k < l.len {
		e := l.at(k)
		if e.t > cutoff {
			break
		}
		units += e.n
		k++
	}
	return k, units
}

func (l *timeLog) drop(k int, units int64) {
	l.head = (l.head + k) % max(len(l.ents), 1)
	l.len -= k
	l.total -= units
	if l.len == 0 {
		l.head = 0
	}
}

// push records n units at t (at least the newest entry's time), in a ring
// grown by doubling up to capacity entries: each entry holds at least one
// unit of the policy's capacity, so no more are ever live.
func (l *timeLog) push(t, n, capacity int64) {
	if l.len > 0 {
		if last := l.at(l.len - 1); last.t == t {
			last.n += n
			l.total += n
			return
		}
	}
	if l.len == len(l.ents) {
		grown := make([]logEntry, max(l.len+1, int(min(int64(max(4, 2*len(l.ents))), capacity))))
		for i := 0; i < l.len; i++ {
			grown[i] = *l.at(i)
		}
		l.ents, l.head = grown, 0
	}
	*l.at(l.len) = logEntry{t, n}
	l.len++
	l.total += n
}

// clampFuture moves the entries recorded after now (by a clock that has
// since stepped back) to now, merging them into one entry.
func (l *timeLog) clampFuture(now, capacity int64) {
	var n int64
	for l.len > 0 && l.at(l.len-1).t > now {
		n += l.at(l.len - 1).n
		l.len--
	}
	l.total -= n
	if l.len == 0 {
		l.head = 0
	}
	l.push(now, n, capacity)
}

func (slidingWindowLog) Decide(p *Policy, s *State, cost, now int64, commit bool, d *Decision) {
	*d = Decision{Limit: p.capacity, Policy: p}
	l := s.log
	// Units admitted in (now-Window, now] count. Units recorded after now
	// by more than ClockTolerance, by a clock that has since stepped back,
	// count as admitted at now: they leave the window one Window from now,
	// so the key recovers within a Window and nothing is credited. A commit
	// moves them to now, keeping the log ordered.
	var k int
	var gone, valid, newest, shift int64
	future := false
	if l != nil && l.len > 0 {
		// Units recorded at most ClockTolerance after now are those of a
		// decision made first by a caller that read its clock later:
		// decided as at the newest's time (see settle).
		now, shift = settle(now, l.newest())
		k, gone = l.expired(now - p.window)
		valid = l.total - gone
		newest = l.newest()
		if newest > now {
			newest, future = now, true
		}
	}
	if valid+cost <= p.capacity {
		d.Allowed = true
		d.Remaining = p.capacity - valid - cost
		switch {
		case cost > 0:
			d.ResetAfter = time.Duration(p.window)
		case valid > 0:
			d.ResetAfter = time.Duration(newest + p.window - now)
		}
		if commit && (cost > 0 || future) {
			if l == nil {
				l = &timeLog{}
				s.log = l
			}
			l.drop(k, gone)
			if future {
				l.clampFuture(now, p.capacity)
			}
			if cost > 0 {
				l.push(now, cost, p.capacity)
			}
		}
		if shift > 0 {
			d.later(shift)
		}
		return
	}
	// Refused: wait until enough of the oldest units leave the window.
	need := valid + cost - p.capacity
	for i := k; i < l.len; i++ {
		e := l.at(i)
		need -= e.n
		if need <= 0 {
			d.RetryAfter = time.Duration(min(e.t, now) + p.window - now)
			break
		}
	}
	d.Remaining = max(p.capacity-valid, 0)
	d.ResetAfter = time.Duration(newest + p.window - now)
	if commit && future {
		l.drop(k, gone)
		l.clampFuture(now, p.capacity)
	}
	if shift > 0 {
		d.later(shift)
	}
}

func (slidingWindowLog) Expiry(p *Policy, s *State) int64 {
	if s.log == nil || s.log.len == 0 {
		return math.MinInt64
	}
	return s.log.newest() + p.window
}

// RefundCharge removes up to cost units from the entry of the charge made
// at at, if the log still holds it (entries recorded after now, by a clock
// that has since stepped back, keep their times until a charge moves them,
// so the charge's is found among them too; an entry that has left the
// window counts for nothing either way, and is dropped by the next charge).
func (slidingWindowLog) RefundCharge(p *Policy, s *State, cost, at, now int64) {
	l := s.log
	if l == nil || l.len == 0 {
		return
	}
	for i := l.len - 1; i >= 0; i-- {
		e := l.at(i)
		if e.t < at {
			return // no entry of that time: nothing of the charge is left
		}
		if e.t > at {
			continue
		}
		k := min(e.n, cost)
		e.n -= k
		l.total -= k
		if e.n == 0 {
			for j := i; j < l.len-1; j++ {
				*l.at(j) = *l.at(j + 1)
			}
			l.len--
			if l.len == 0 {
				l.head = 0
			}
		}
		return
	}
}

// Refund removes up to cost units from the most recent entries of the
// trailing window. Entries recorded after now (the clock stepped back) keep
// their times until a charge moves them, and expired entries are left as
// they are (a clock stepping back would count them again), as the Redis
// store leaves them: the next committed decision clamps the one and drops
// the other.
func (slidingWindowLog) Refund(p *Policy, s *State, cost, now int64) {
	l := s.log
	if l == nil || l.len == 0 {
		return
	}
	for cost > 0 && l.len > 0 {
		e := l.at(l.len - 1)
		if e.t <= now-p.window {
			break
		}
		k := min(e.n, cost)
		e.n -= k
		l.total -= k
		cost -= k
		if e.n == 0 {
			l.len--
		}
	}
	if l.len == 0 {
		l.head = 0
	}
}
