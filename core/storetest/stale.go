package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// testStale checks takes and refunds at a time behind the key's state by
// at most core.ClockTolerance (a caller that read its clock before another
// whose decision went first): against the same history with the operation
// at the state's own time, the take is decided alike, and at every later
// time over the next two and a half windows the key has no more room (a
// Peek of one unit, every half second, finds no more Remaining and no
// earlier retry time).
func testStale(t *testing.T, newStore func(*testing.T) core.Store) {
	s := newStore(t)
	if _, ok := s.(core.Peeker); !ok {
		t.Skip("the store is not a core.Peeker")
	}
	_, refunds := s.(core.Refunder)
	h := Harness{t, s}
	ops := []string{"take"}
	if refunds {
		ops = append(ops, "refund")
	}
	for _, r := range suiteRules(10, 10*time.Second) {
		p := mustPolicy(t, r)
		for _, off := range []time.Duration{0, 5 * time.Second, 10*time.Second - ms} {
			for _, gap := range []time.Duration{ms, core.ClockTolerance} {
				for _, op := range ops {
					name := fmt.Sprintf("%s/%s/t2=%v/gap=%v", r.Algorithm.Name(), op, off, gap)
					// run plays the history with the operation gap behind
					// t2 (0: at t2), and returns the operation's decision
					// (a take's) and Peeks of one unit after it.
					t2 := time.Minute + off
					run := func(gap time.Duration) (core.Decision, []core.Decision) {
						key := uniqueKey(t, "stale")
						drain := func(at time.Duration) {
							for range 40 {
								if d, err := h.Take(p, key, 1, at); err != nil {
									t.Fatalf("%s: at %v: %v", name, at, err)
								} else if !d.Allowed {
									return
								}
							}
						}
						drain(-5 * time.Second) // T0 starts a window
						drain(t2)
						var own core.Decision
						var err error
						if op == "take" {
							own, err = h.Take(p, key, 1, t2-gap)
						} else {
							err = h.Refund([]core.Request{{Policy: p, Key: key, Cost: 1}}, t2-gap)
						}
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						return own, peekEvery(h, p, key, t2, name)
					}
					own, stale := run(gap)
					ctl, control := run(0)
					if own.Allowed != ctl.Allowed {
						t.Errorf("%s: the take %v behind the key's state: %+v; at its time: %+v", name, gap, own, ctl)
					}
					for i := range stale {
						at := t2 + time.Duration(i)*500*ms
						sd, cd := stale[i], control[i]
						if sd.Remaining > cd.Remaining || sd.Allowed && !cd.Allowed ||
							!sd.Allowed && !cd.Allowed && sd.RetryAfter < cd.RetryAfter {
							t.Errorf("%s: at %v, after the operation %v behind the key's state: %+v; after it at the state's time: %+v", name, at, gap, sd, cd)
							break
						}
					}
				}
			}
		}
	}
}

// testStaleRefundCharge: a charge decided behind the key's state (by at
// most core.ClockTolerance) is recorded at the state's time, and a refund
// naming it by Policy.ChargeStart gives all of it back: the key is then
// as if it had never been made.
func testStaleRefundCharge(t *testing.T, newStore func(*testing.T) core.Store) {
	s := newStore(t)
	if _, ok := s.(core.Peeker); !ok {
		t.Skip("the store is not a core.Peeker")
	}
	if _, ok := s.(core.Refunder); !ok {
		t.Skip("the store is not a core.Refunder")
	}
	h := Harness{t, s}
	for _, r := range suiteRules(10, 10*time.Second) {
		p := mustPolicy(t, r)
		for _, off := range []time.Duration{0, ms, 5 * time.Second} {
			for _, gap := range []time.Duration{ms, 300 * ms} {
				name := fmt.Sprintf("%s/t2=%v/gap=%v", r.Algorithm.Name(), off, gap)
				t2 := time.Minute + off
				run := func(stale bool) []core.Decision {
					key := uniqueKey(t, "stale-refund")
					for _, at := range []time.Duration{t2 - 2*time.Second, t2} {
						if d, err := h.Take(p, key, 3, at); err != nil || !d.Allowed {
							t.Fatalf("%s: 3 at %v: %+v %v", name, at, d, err)
						}
					}
					if stale {
						d, err := h.Take(p, key, 2, t2-gap)
						if err != nil || !d.Allowed {
							t.Fatalf("%s: 2 at %v: %+v %v", name, t2-gap, d, err)
						}
						charged := p.ChargeStart(T0.Add(t2-gap), 2, d)
						if err := h.Refund([]core.Request{{Policy: p, Key: key, Cost: 2, ChargedAt: charged}}, t2+ms); err != nil {
							t.Fatalf("%s: refund: %v", name, err)
						}
					}
					return peekEvery(h, p, key, t2+ms, name)
				}
				refunded, never := run(true), run(false)
				for i := range never {
					if refunded[i] != never[i] {
						t.Errorf("%s: at %v after the refund: %+v; without the charge: %+v", name, t2+ms+time.Duration(i)*500*ms, refunded[i], never[i])
						break
					}
				}
			}
		}
	}
}

// testStaleConversion: a request under a policy of another identity (same
// Name) decided behind the key's record by at most core.ClockTolerance
// converts the record's units in use where the record says they are (a
// window's start, a log's newest entry, a bucket's arrival time), never in
// a window or at an instant before: right after the record's time, the
// key has no more room under the new policy than after the same request
// at the record's time, but for what recovers under it in the request's
// lag (a window's record does not say when within its window it was
// charged: their recovery may start at the request's time, as for any
// conversion).
func testStaleConversion(t *testing.T, newStore func(*testing.T) core.Store) {
	s := newStore(t)
	if _, ok := s.(core.Peeker); !ok {
		t.Skip("the store is not a core.Peeker")
	}
	h := Harness{t, s}
	for _, ra := range suiteRules(10, 10*time.Second) {
		if ra.Algorithm == core.TokenBucket || ra.Algorithm == core.LeakyBucket {
			// Converted at the request's time: a bucket's arrival time
			// does not say when its last decision was made.
			continue
		}
		for _, rb := range suiteRules(20, 10*time.Second) {
			ra.Name, rb.Name = "conv", "conv"
			a, b := mustPolicy(t, ra), mustPolicy(t, rb)
			for _, off := range []time.Duration{0, 5 * time.Second} {
				name := fmt.Sprintf("%s to %s/t2=%v", ra.Algorithm.Name(), rb.Algorithm.Name(), off)
				t2 := time.Minute + off
				run := func(gap time.Duration) (core.Decision, core.Decision) {
					key := uniqueKey(t, "stale-conv")
					if d, err := h.Take(a, key, 10, t2); err != nil || !d.Allowed {
						t.Fatalf("%s: 10 at %v: %+v %v", name, t2, d, err)
					}
					own, err := h.Take(b, key, 1, t2-gap)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					out, err := h.Peek([]core.Request{{Policy: b, Key: key, Cost: 1}}, t2+ms)
					if err != nil {
						t.Fatalf("%s: peek: %v", name, err)
					}
					return own, out[0]
				}
				own, sd := run(500 * ms)
				ctl, cd := run(0)
				// What recovers under b in the request's lag: a window's
				// record does not say when within its window it was
				// charged, and a bucket's recovery starts at the request.
				lag := (500*ms*time.Duration(b.Limit()) + b.Window() - 1) / b.Window()
				if own.Allowed != ctl.Allowed || sd.Remaining > cd.Remaining+int64(lag) {
					t.Errorf("%s: the request 500ms behind the record: %+v, then %+v; at the record's time: %+v, then %+v", name, own, sd, ctl, cd)
				}
			}
		}
	}
}

// peekEvery returns the decisions of Peeks of one unit of key under p every
// half second over the 25 seconds from T0+from.
func peekEvery(h Harness, p *core.Policy, key string, from time.Duration, name string) []core.Decision {
	h.T.Helper()
	var after []core.Decision
	for at := from; at <= from+25*time.Second; at += 500 * ms {
		out, err := h.Peek([]core.Request{{Policy: p, Key: key, Cost: 1}}, at)
		if err != nil {
			h.T.Fatalf("%s: peek at %v: %v", name, at, err)
		}
		after = append(after, out[0])
	}
	return after
}
