package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// runOps runs the tests of the optional operations the store implements:
// core.Peeker, core.Resetter and core.Refunder.
func runOps(t *testing.T, newStore func(t *testing.T) core.Store) {
	t.Helper()
	probe := newStore(t)
	if _, ok := probe.(core.Peeker); ok {
		t.Run("Peek", func(t *testing.T) { testPeek(t, newStore) })
	}
	if _, ok := probe.(core.Resetter); ok {
		t.Run("Reset", func(t *testing.T) { testReset(t, newStore) })
	}
	if _, ok := probe.(core.Refunder); ok {
		t.Run("Refund", func(t *testing.T) { testRefund(t, newStore) })
		t.Run("RefundCharge", func(t *testing.T) { testRefundCharge(t, newStore) })
	}
}

// testRefundCharge: a refund naming its charge's time (ChargedAt) gives
// back only what that charge still holds at the refund's time, for every
// algorithm: all of it right away, nothing once it has recovered or its
// window is over, and none of the units of the charges made after it.
func testRefundCharge(t *testing.T, newStore func(*testing.T) core.Store) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	type step struct {
		at     float64 // seconds from T0
		refund float64 // >= 0: a refund at at of the charge made at refund; < 0: a take at at
	}
	take := func(at float64) step { return step{at, -1} }
	for _, tc := range []struct {
		name  string
		rule  core.Rule
		steps []step
		check float64 // then, at check, this many more are admitted
		want  int
	}{
		// Right after the charge, everything comes back, for every algorithm.
		{"bucket at once", core.Rule{Limit: 2, Window: 10 * time.Second}, []step{take(0), take(0), {0, 0}}, 0, 1},
		{"fixed window at once", core.Rule{Limit: 2, Window: time.Minute, Algorithm: core.FixedWindow}, []step{take(0), take(0), {0, 0}}, 0, 1},
		{"counter at once", core.Rule{Limit: 2, Window: time.Minute, Algorithm: core.SlidingWindowCounter}, []step{take(0), take(0), {0, 0}}, 0, 1},
		{"log at once", core.Rule{Limit: 2, Window: time.Minute, Algorithm: core.SlidingWindowLog}, []step{take(0), take(0), {0, 0}}, 0, 1},
		// A bucket of 2, one per 5 s: X at 0, Y at 2, X refunded at 3 (it
		// has given back 3 s of its 5 already): 2 s come back.
		{"bucket partly recovered", core.Rule{Limit: 2, Window: 10 * time.Second}, []step{take(0), take(2), {3, 0}}, 3, 1},
		// X at 0 has given back all it held by 5: its refund at 9 gives
		// nothing, and Y, charged at 8, keeps its place.
		{"leaky bucket recovered", core.Rule{Limit: 2, Window: 10 * time.Second, Algorithm: core.LeakyBucket, Burst: 2}, []step{take(0), take(8), {9, 0}}, 9, 1},
		{"bucket recovered", core.Rule{Limit: 2, Window: 10 * time.Second}, []step{take(0), take(8), {9, 0}}, 9, 1},
		// 2 a minute: charged at 59, refunded at 61, after a charge at 60:
		// the window of 60 keeps its charge.
		{"fixed window next window", core.Rule{Limit: 2, Window: time.Minute, Algorithm: core.FixedWindow}, []step{take(59), take(60), {61, 59}}, 61, 1},
		// The counter's charge at 59 sits in the previous window at 119: it
		// comes off that window's count (weighted 1/60 by then), not the
		// current one's (weighted whole).
		{"counter previous window", core.Rule{Limit: 4, Window: time.Minute, Algorithm: core.SlidingWindowCounter}, []step{take(59), take(59), take(60), take(60), {119, 59}}, 119, 1},
		{"counter older window", core.Rule{Limit: 2, Window: time.Minute, Algorithm: core.SlidingWindowCounter}, []step{take(0), take(130), {131, 0}}, 131, 1},
		// The log gives back the entry of the charge's time, not the newest.
		{"log in the window", core.Rule{Limit: 2, Window: 10 * time.Second, Algorithm: core.SlidingWindowLog}, []step{take(0), take(8), {9, 0}}, 10, 1},
		{"log left the window", core.Rule{Limit: 2, Window: 10 * time.Second, Algorithm: core.SlidingWindowLog}, []step{take(0), take(8), {10, 0}}, 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Harness{t, newStore(t)}
			tc.rule.Name = "charge"
			p := mustPolicy(t, tc.rule)
			key := uniqueKey(t, "charge")
			for _, st := range tc.steps {
				if st.refund < 0 {
					if d, err := h.Take(p, key, 1, sec(st.at)); err != nil || !d.Allowed {
						t.Fatalf("take at %vs: %+v %v", st.at, d, err)
					}
					continue
				}
				req := core.Request{Policy: p, Key: key, Cost: 1, ChargedAt: T0.Add(sec(st.refund))}
				if err := h.Refund([]core.Request{req}, sec(st.at)); err != nil {
					t.Fatalf("refund at %vs: %v", st.at, err)
				}
			}
			n := 0
			for ; n <= int(tc.rule.Limit); n++ {
				d, err := h.Take(p, key, 1, sec(tc.check))
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
			}
			if n != tc.want {
				t.Fatalf("then at %vs: %d admitted, want %d", tc.check, n, tc.want)
			}
		})
	}
	// A bucket that was not full gives a charge's units back only once the
	// units in use before it have come back: the refund names that time
	// (Policy.ChargeStart), and gets all of them back until then. 10 a
	// second (one per 100 ms), 9 charged at 0, then X at 0, refunded at
	// 100 ms: as if X had never been made, 2 are admitted at 100 ms.
	for _, a := range []core.Algorithm{core.TokenBucket, core.LeakyBucket} {
		t.Run("busy "+a.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, withBurst(core.Rule{Name: "busy", Algorithm: a, Limit: 10, Window: time.Second}))
			key := uniqueKey(t, "busy")
			for range 9 {
				if d, err := h.Take(p, key, 1, 0); err != nil || !d.Allowed {
					t.Fatalf("take: %+v %v", d, err)
				}
			}
			x, err := h.Take(p, key, 1, 0)
			if err != nil || !x.Allowed {
				t.Fatalf("X: %+v %v", x, err)
			}
			req := core.Request{Policy: p, Key: key, Cost: 1, ChargedAt: p.ChargeStart(T0, 1, x)}
			if err := h.Refund([]core.Request{req}, 100*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			n := 0
			for ; n <= 10; n++ {
				if d, err := h.Take(p, key, 1, 100*time.Millisecond); err != nil || !d.Allowed {
					break
				}
			}
			if n != 2 {
				t.Fatalf("after X's refund at 100ms: %d admitted, want 2", n)
			}
		})
	}
	// A charge that has recovered, whose key a later charge holds, gives
	// nothing back when it is refunded after the clock stepped back to
	// before it: the key then decides as one that never had the charge.
	for _, a := range core.Algorithms() {
		t.Run("clock back "+a.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, withBurst(core.Rule{Name: "back", Algorithm: a, Limit: 2, Window: time.Minute}))
			with, without := uniqueKey(t, "with"), uniqueKey(t, "without")
			if d, err := h.Take(p, with, 1, 10*time.Second); err != nil || !d.Allowed {
				t.Fatalf("X: %+v %v", d, err)
			}
			for _, k := range []string{with, without} {
				if d, err := h.Take(p, k, 2, 130*time.Second); err != nil || !d.Allowed {
					t.Fatalf("Y: %+v %v", d, err)
				}
			}
			req := core.Request{Policy: p, Key: with, Cost: 1, ChargedAt: T0.Add(10 * time.Second)}
			if err := h.Refund([]core.Request{req}, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			for at := 5 * time.Second; at <= 200*time.Second; at += time.Second {
				dw, err := h.Take(p, with, 1, at)
				if err != nil {
					t.Fatal(err)
				}
				do, err := h.Take(p, without, 1, at)
				if err != nil {
					t.Fatal(err)
				}
				if dw.Allowed != do.Allowed {
					t.Fatalf("at %v, after the clock stepped back and X's refund: %v with X refunded, %v without X", at, dw.Allowed, do.Allowed)
				}
			}
		})
	}
	t.Run("bucket whole again", func(t *testing.T) {
		// The only charge in use, refunded while it gives its units back:
		// the bucket is whole, to the nanosecond.
		h := Harness{t, newStore(t)}
		p := mustPolicy(t, core.Rule{Name: "whole", Limit: 10, Window: 10 * time.Second})
		key := uniqueKey(t, "whole")
		h.Take(p, key, 1, 0)
		x, err := h.Take(p, key, 1, 0)
		if err != nil || !x.Allowed {
			t.Fatalf("X: %+v %v", x, err)
		}
		req := core.Request{Policy: p, Key: key, Cost: 1, ChargedAt: p.ChargeStart(T0, 1, x)}
		if err := h.Refund([]core.Request{req}, 1500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if d, err := h.Take(p, key, 10, 1500*time.Millisecond); err != nil || !d.Allowed {
			t.Fatalf("a take of the whole capacity after the refund: %+v %v, want admitted", d, err)
		}
	})
	t.Run("another policy since", func(t *testing.T) {
		// A record another policy of the Name wrote since the charge
		// holds none of its history: the refund gives back nothing.
		h := Harness{t, newStore(t)}
		l := mustPolicy(t, core.Rule{Name: "since", Algorithm: core.SlidingWindowLog, Limit: 6, Window: time.Second})
		b := mustPolicy(t, core.Rule{Name: "since", Limit: 10, Window: time.Hour})
		key := uniqueKey(t, "since")
		c, err := h.Take(l, key, 2, 0)
		if err != nil || !c.Allowed {
			t.Fatalf("charge: %+v %v", c, err)
		}
		if d, err := h.Take(b, key, 5, 5*time.Second); err != nil || !d.Allowed {
			t.Fatalf("under the other policy: %+v %v", d, err)
		}
		req := core.Request{Policy: l, Key: key, Cost: 2, ChargedAt: l.ChargeStart(T0, 2, c)}
		if err := h.Refund([]core.Request{req}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, err := h.Take(b, key, 6, 5*time.Second); err != nil || d.Allowed {
			t.Fatalf("6 more of 10 with 5 in use: %+v %v, want refused", d, err)
		}
	})
	t.Run("another policy since, a bucket", func(t *testing.T) {
		// The same with a bucket refunded and a window's record.
		h := Harness{t, newStore(t)}
		a := mustPolicy(t, core.Rule{Name: "since2", Limit: 10, Window: 100 * time.Second})
		b := mustPolicy(t, core.Rule{Name: "since2", Algorithm: core.FixedWindow, Limit: 10, Window: time.Second})
		key := uniqueKey(t, "since2")
		at := 999 * time.Millisecond
		x, err := h.Take(a, key, 5, at)
		if err != nil || !x.Allowed {
			t.Fatalf("X: %+v %v", x, err)
		}
		h.Take(b, key, 5, 999500*time.Microsecond)
		if d, err := h.Take(b, key, 10, time.Second); err != nil || !d.Allowed {
			t.Fatalf("under the window, its next window: %+v %v", d, err)
		}
		req := core.Request{Policy: a, Key: key, Cost: 5, ChargedAt: a.ChargeStart(T0.Add(at), 5, x)}
		if err := h.Refund([]core.Request{req}, time.Second); err != nil {
			t.Fatal(err)
		}
		if d, err := h.Take(a, key, 4, time.Second); err != nil || d.Allowed {
			t.Fatalf("under the bucket after X's refund, with the window's 10 in use: %+v %v, want refused", d, err)
		}
	})
	t.Run("then the clock steps back", func(t *testing.T) {
		// What a refund leaves is read alike by every store after a step
		// back: a bucket given back whole is whole at every instant; a
		// log keeps the entries a refund by charge did not touch.
		h := Harness{t, newStore(t)}
		p := mustPolicy(t, core.Rule{Name: "wb", Limit: 1, Window: time.Second})
		key := uniqueKey(t, "wb")
		h.Take(p, key, 1, time.Hour)
		if err := h.Refund([]core.Request{{Policy: p, Key: key, Cost: 1}}, time.Hour+500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if d, err := h.Take(p, key, 1, time.Hour-10*time.Second); err != nil || !d.Allowed {
			t.Fatalf("a bucket refunded whole, then 10s before: %+v %v, want admitted", d, err)
		}
		l := mustPolicy(t, core.Rule{Name: "lb", Algorithm: core.SlidingWindowLog, Limit: 1, Window: 10 * time.Millisecond})
		key = uniqueKey(t, "lb")
		h.Take(l, key, 1, time.Hour)
		req := core.Request{Policy: l, Key: key, Cost: 1, ChargedAt: T0.Add(time.Hour + 15*time.Millisecond)}
		if err := h.Refund([]core.Request{req}, time.Hour+20*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if d, err := h.Take(l, key, 1, time.Hour-time.Second); err != nil || d.Allowed {
			t.Fatalf("a log whose entry no refund touched, a second before it: %+v %v, want refused", d, err)
		}
	})
	t.Run("lossy conversion not stored", func(t *testing.T) {
		// A refund under a smaller policy of a key the larger one holds
		// beyond it stores no conversion: the larger policy's units stay.
		h := Harness{t, newStore(t)}
		small := mustPolicy(t, core.Rule{Name: "rs", Limit: 10, Window: time.Hour})
		big := mustPolicy(t, core.Rule{Name: "rs", Limit: 100, Window: time.Hour})
		key := uniqueKey(t, "refund")
		if d, err := h.Take(big, key, 50, 0); err != nil || !d.Allowed {
			t.Fatalf("50 of 100: %+v %v", d, err)
		}
		for _, at := range []time.Time{{}, T0} { // with and without ChargedAt
			if err := h.Refund([]core.Request{{Policy: small, Key: key, Cost: 1, ChargedAt: at}}, 0); err != nil {
				t.Fatal(err)
			}
		}
		if d, err := h.Take(big, key, 51, 0); err != nil || d.Allowed {
			t.Fatalf("51 more of 100 after refunds under the smaller policy: %+v %v, want refused (50 in use)", d, err)
		}
	})
}

// Peek decides a batch at T0+at through core.Peeker.
func (h Harness) Peek(reqs []core.Request, at time.Duration) ([]core.Decision, error) {
	h.T.Helper()
	out := make([]core.Decision, len(reqs))
	err := h.Store.(core.Peeker).Peek(context.Background(), T0.Add(at), reqs, out)
	return out, err
}

// TakeBatch decides a batch at T0+at.
func (h Harness) TakeBatch(reqs []core.Request, at time.Duration) ([]core.Decision, error) {
	h.T.Helper()
	out := make([]core.Decision, len(reqs))
	err := h.Store.Take(context.Background(), T0.Add(at), reqs, out)
	return out, err
}

// Refund refunds a batch at T0+at through core.Refunder.
func (h Harness) Refund(reqs []core.Request, at time.Duration) error {
	h.T.Helper()
	return h.Store.(core.Refunder).Refund(context.Background(), T0.Add(at), reqs)
}

// sameErr reports whether two errors are both nil or wrap the same suite
// sentinel.
func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	for _, s := range []error{core.ErrInvalidCost, core.ErrCostExceedsCapacity, core.ErrDuplicateRequest, core.ErrBatchTooLarge, core.ErrShortOutput} {
		if errors.Is(a, s) {
			return errors.Is(b, s)
		}
	}
	return false
}

func sameDecisions(a, b []core.Decision) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// testPeek walks random layered traces: before every Take, Peek (twice)
// reports exactly Take's decisions and errors, and charges nothing.
func testPeek(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(5, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			gate := mustPolicy(t, core.Rule{Name: "peek-gate", Algorithm: core.FixedWindow, Limit: 12, Window: 20 * time.Second})
			rng := rand.New(rand.NewPCG(7, uint64(len(r.Name))))
			keys := []string{uniqueKey(t, "a"), uniqueKey(t, "b")}
			at := time.Duration(0)
			for i := 0; i < 300; i++ {
				at += time.Duration(rng.IntN(1200)) * ms
				k := keys[rng.IntN(2)]
				cost := int64(rng.IntN(7)) // 0 and 6 are errors
				var reqs []core.Request
				if rng.IntN(2) == 0 {
					reqs = []core.Request{{Policy: p, Key: k, Cost: cost}}
				} else {
					reqs = []core.Request{{Policy: gate, Key: "g" + k, Cost: 1}, {Policy: p, Key: k, Cost: cost}}
				}
				peek1, err1 := h.Peek(reqs, at)
				peek2, err2 := h.Peek(reqs, at)
				took, err := h.TakeBatch(reqs, at)
				if !sameErr(err1, err) || !sameErr(err2, err) {
					t.Fatalf("step %d (+%v cost %d): Peek err %v, %v; Take err %v", i, at, cost, err1, err2, err)
				}
				if errors.Is(err, core.ErrInvalidCost) {
					continue // no decision is written
				}
				if !sameDecisions(peek1, took) || !sameDecisions(peek2, took) {
					t.Fatalf("step %d (+%v cost %d):\npeek %+v\npeek %+v\ntake %+v", i, at, cost, peek1, peek2, took)
				}
			}
		})
	}
	t.Run("NewKeyStaysUnstored", func(t *testing.T) {
		// Peeking a never-seen key at a late instant leaves it whole at an
		// earlier one: nothing was written.
		h := Harness{t, newStore(t)}
		for _, r := range suiteRules(3, 10*time.Second) {
			p := mustPolicy(t, r)
			key := uniqueKey(t, "new")
			d, err := h.Peek([]core.Request{{Policy: p, Key: key, Cost: 3}}, time.Hour)
			if err != nil || !d[0].Allowed || d[0].Remaining != 0 {
				t.Fatalf("%s: peek of a new key: %+v %v", r.Name, d, err)
			}
			if d, err := h.Take(p, key, 3, 0); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%s: take after a peek: %+v %v, want the whole quota", r.Name, d, err)
			}
		}
	})
	t.Run("PolicyIdentity", func(t *testing.T) {
		// Under another Identity, Peek sees the carried-over units and
		// rewrites nothing: the old policy still reads its own record.
		for _, a := range core.Algorithms() {
			h := Harness{t, newStore(t)}
			small := mustPolicy(t, withBurst(core.Rule{Name: "pk-shared", Algorithm: a, Limit: 5, Window: 10 * time.Minute}))
			big := mustPolicy(t, withBurst(core.Rule{Name: "pk-shared", Algorithm: core.TokenBucket, Limit: 10, Window: 10 * time.Minute}))
			key := uniqueKey(t, "id")
			if _, err := h.Take(small, key, 3, 0); err != nil {
				t.Fatal(err)
			}
			d, err := h.Peek([]core.Request{{Policy: big, Key: key, Cost: 1}}, ms)
			if err != nil || !d[0].Allowed || d[0].Remaining != 6 {
				t.Fatalf("%s: peek under 10/10m with 3 used: %+v %v, want Remaining 6", a.Name(), d, err)
			}
			if d, err := h.Take(small, key, 2, ms); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%s: the old policy after a peek under another: %+v %v, want 2 left and admitted", a.Name(), d, err)
			}
		}
	})
	// After the clock steps back, a Peek's RetryAfter holds: the Take made
	// when it has passed is admitted (a record ahead of the clock is
	// clamped from the first decision after the step, a Peek included).
	t.Run("RetryAfterAfterClockStepsBack", func(t *testing.T) {
		for _, r := range suiteRules(1, time.Second) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			key := uniqueKey(t, "back")
			if d, err := h.Take(p, key, 1, 100*time.Second); err != nil || !d.Allowed {
				t.Fatalf("%s: first take %+v %v", r.Algorithm.Name(), d, err)
			}
			pk, err := h.Peek([]core.Request{{Policy: p, Key: key, Cost: 1}}, 0) // 100 s earlier
			if err != nil || pk[0].Allowed || pk[0].RetryAfter <= 0 {
				t.Fatalf("%s: peek after the step back %+v %v, want refused with a RetryAfter", r.Algorithm.Name(), pk, err)
			}
			if d, err := h.Take(p, key, 1, pk[0].RetryAfter); err != nil || !d.Allowed {
				t.Fatalf("%s: take after the peek's RetryAfter %v: %+v %v, want admitted", r.Algorithm.Name(), pk[0].RetryAfter, d, err)
			}
		}
	})

	t.Run("Errors", func(t *testing.T) {
		h := Harness{t, newStore(t)}
		p := mustPolicy(t, core.Rule{Name: "pk-err", Limit: 2, Window: time.Second})
		key := uniqueKey(t, "err")
		if _, err := h.Peek([]core.Request{{Policy: p, Key: key, Cost: 1}, {Policy: p, Key: key, Cost: 1}}, 0); !errors.Is(err, core.ErrDuplicateRequest) {
			t.Errorf("duplicate: %v", err)
		}
		d, err := h.Peek([]core.Request{{Policy: p, Key: key, Cost: 3}}, 0)
		if !errors.Is(err, core.ErrCostExceedsCapacity) || d[0].Allowed || d[0].RetryAfter != 0 {
			t.Errorf("over capacity: %+v %v", d, err)
		}
		reqs := make([]core.Request, core.MaxBatch+1)
		for i := range reqs {
			reqs[i] = core.Request{Policy: p, Key: uniqueKey(t, "many"), Cost: 1}
		}
		if _, err := h.Peek(reqs, 0); !errors.Is(err, core.ErrBatchTooLarge) {
			t.Errorf("too large: %v", err)
		}
	})
}

// testReset empties keys, under their own and other policies of the Name.
func testReset(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(4, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			rs := h.Store.(core.Resetter)
			p := mustPolicy(t, r)
			key, other := uniqueKey(t, "reset"), uniqueKey(t, "other")
			for _, k := range []string{key, other} {
				if d, err := h.Take(p, k, 4, 0); err != nil || !d.Allowed {
					t.Fatalf("drain: %+v %v", d, err)
				}
			}
			if err := rs.Reset(context.Background(), p, key); err != nil {
				t.Fatal(err)
			}
			if d, err := h.Take(p, key, 4, ms); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("after Reset: %+v %v, want the whole quota of 4", d, err)
			}
			if d, err := h.Take(p, other, 1, ms); err != nil || d.Allowed {
				t.Fatalf("another key after Reset: %+v %v, want still refused", d, err)
			}
			// Another policy of the same Name resets the shared record.
			q := mustPolicy(t, core.Rule{Name: r.Name, Limit: 9, Window: time.Hour})
			if err := rs.Reset(context.Background(), q, other); err != nil {
				t.Fatal(err)
			}
			if d, err := h.Take(p, other, 4, ms); err != nil || !d.Allowed {
				t.Fatalf("after Reset under another policy of the Name: %+v %v, want whole", d, err)
			}
			// A key never seen: nothing to do, no error.
			if err := rs.Reset(context.Background(), p, uniqueKey(t, "never")); err != nil {
				t.Fatalf("Reset of an unknown key: %v", err)
			}
		})
	}
}

// testRefund gives back exact units per algorithm, never above capacity,
// atomically per batch.
func testRefund(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(6, 12*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			refund := func(key string, cost int64, at time.Duration) {
				t.Helper()
				if err := h.Refund([]core.Request{{Policy: p, Key: key, Cost: cost}}, at); err != nil {
					t.Fatalf("refund %d: %v", cost, err)
				}
			}
			// Exactly the refunded units come back: k charged, j refunded,
			// then one more leaves 6-k+j-1.
			for k := int64(1); k <= 6; k++ {
				for j := int64(1); j <= k; j++ {
					key := uniqueKey(t, "exact")
					if d, err := h.Take(p, key, k, 0); err != nil || !d.Allowed {
						t.Fatalf("charge %d: %+v %v", k, d, err)
					}
					refund(key, j, 0)
					if d, err := h.Take(p, key, 1, 0); err != nil || !d.Allowed || d.Remaining != 6-k+j-1 {
						t.Fatalf("charged %d, refunded %d, one more: %+v %v, want Remaining %d", k, j, d, err, 6-k+j-1)
					}
				}
			}
			// Never above capacity: a refund larger than the use makes the
			// key whole, no more.
			for k := int64(1); k <= 5; k++ {
				for _, extra := range []int64{1, 6 - k} {
					key := uniqueKey(t, "cap")
					h.Take(p, key, k, 0)
					refund(key, k+extra, ms)
					if d, err := h.Take(p, key, 6, ms); err != nil || !d.Allowed || d.Remaining != 0 {
						t.Fatalf("%d charged, %d refunded: %+v %v, want exactly the capacity of 6", k, k+extra, d, err)
					}
					if d, err := h.Take(p, key, 1, ms); err != nil || d.Allowed {
						t.Fatalf("%d charged, %d refunded, a 7th unit: %+v %v, want refused", k, k+extra, d, err)
					}
				}
			}
			// A never-seen key stays whole.
			key := uniqueKey(t, "new")
			refund(key, 3, 0)
			if d, err := h.Take(p, key, 6, 0); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("refund of a new key: %+v %v", d, err)
			}
			if d, err := h.Take(p, key, 1, 0); err != nil || d.Allowed {
				t.Fatalf("refund of a new key credited: %+v %v", d, err)
			}
			// A refused request's key, refunded, lets the same request in.
			key = uniqueKey(t, "full")
			h.Take(p, key, 6, 0)
			if d, _ := h.Take(p, key, 2, ms); d.Allowed {
				t.Fatalf("full key admitted: %+v", d)
			}
			refund(key, 2, ms)
			if d, err := h.Take(p, key, 2, ms); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("after refunding 2 of a full key: %+v %v", d, err)
			}
		})
	}
	t.Run("Windows", func(t *testing.T) {
		// A fixed window's charge from an earlier window gives nothing back;
		// a sliding counter takes a refund from the previous window's count
		// once the current one is empty; a log, from its newest entries.
		h := Harness{t, newStore(t)}
		fw := mustPolicy(t, core.Rule{Name: "rf-fw", Algorithm: core.FixedWindow, Limit: 4, Window: 10 * time.Second})
		key := uniqueKey(t, "fw")
		h.Take(fw, key, 4, 9*time.Second)
		h.Take(fw, key, 3, 10*time.Second)
		if err := h.Refund([]core.Request{{Policy: fw, Key: key, Cost: 4}}, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, _ := h.Take(fw, key, 4, 10*time.Second); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("fixed window: %+v, want the refund of 3 from this window, 4 left", d)
		}
		sw := mustPolicy(t, core.Rule{Name: "rf-sw", Algorithm: core.SlidingWindowCounter, Limit: 4, Window: 10 * time.Second})
		key = uniqueKey(t, "sw")
		h.Take(sw, key, 4, 0)
		// At +15s the previous window's 4 weigh ceil(4 x 5/10) = 2.
		if err := h.Refund([]core.Request{{Policy: sw, Key: key, Cost: 2}}, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		// 2 left in the previous window weigh 1: 3 units fit, not 4.
		if d, _ := h.Take(sw, key, 4, 15*time.Second); d.Allowed {
			t.Fatalf("sliding counter: %+v, want 4 refused", d)
		}
		if d, _ := h.Take(sw, key, 3, 15*time.Second); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("sliding counter: %+v, want 3 admitted", d)
		}
		// A refund larger than the current window's count takes the rest
		// from the previous window's: 4 then, at +15s, 1 in this window;
		// a refund of 2 leaves 3 before, weighing 2.
		key = uniqueKey(t, "sw2")
		h.Take(sw, key, 4, 0)
		h.Take(sw, key, 1, 15*time.Second)
		if err := h.Refund([]core.Request{{Policy: sw, Key: key, Cost: 2}}, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, _ := h.Take(sw, key, 3, 15*time.Second); d.Allowed {
			t.Fatalf("sliding counter, refund across windows: %+v, want 3 refused", d)
		}
		if d, _ := h.Take(sw, key, 2, 15*time.Second); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("sliding counter, refund across windows: %+v, want 2 admitted", d)
		}
		sl := mustPolicy(t, core.Rule{Name: "rf-sl", Algorithm: core.SlidingWindowLog, Limit: 4, Window: 10 * time.Second})
		key = uniqueKey(t, "sl")
		h.Take(sl, key, 2, 0)
		h.Take(sl, key, 2, 5*time.Second)
		// Refund 3: the newest 2 (at +5s) and 1 of the oldest (at 0).
		if err := h.Refund([]core.Request{{Policy: sl, Key: key, Cost: 3}}, 6*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, _ := h.Take(sl, key, 3, 6*time.Second); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("log: %+v, want 3 admitted", d)
		}
		// The one unit left from +0s expires at +10s: one unit comes back.
		if d, _ := h.Take(sl, key, 1, 10*time.Second); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("log at +10s: %+v, want 1 admitted, none left", d)
		}
	})
	t.Run("BatchAtomic", func(t *testing.T) {
		h := Harness{t, newStore(t)}
		a := mustPolicy(t, core.Rule{Name: "rf-a", Limit: 3, Window: time.Hour})
		b := mustPolicy(t, core.Rule{Name: "rf-b", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour})
		ka, kb := uniqueKey(t, "a"), uniqueKey(t, "b")
		h.Take(a, ka, 3, 0)
		h.Take(b, kb, 3, 0)
		for _, bad := range []struct {
			reqs []core.Request
			err  error
		}{
			{[]core.Request{{Policy: a, Key: ka, Cost: 1}, {Policy: b, Key: kb, Cost: 4}}, core.ErrCostExceedsCapacity},
			{[]core.Request{{Policy: a, Key: ka, Cost: 1}, {Policy: b, Key: kb, Cost: 0}}, core.ErrInvalidCost},
			{[]core.Request{{Policy: a, Key: ka, Cost: 1}, {Policy: b, Key: kb, Cost: 1}, {Policy: a, Key: ka, Cost: 1}}, core.ErrDuplicateRequest},
		} {
			if err := h.Refund(bad.reqs, 0); !errors.Is(err, bad.err) {
				t.Fatalf("refund %+v: err %v, want %v", bad.reqs, err, bad.err)
			}
		}
		for _, c := range []struct {
			p *core.Policy
			k string
		}{{a, ka}, {b, kb}} {
			if d, _ := h.Take(c.p, c.k, 1, 0); d.Allowed {
				t.Fatalf("%s refunded by a failed batch: %+v", c.p.Name(), d)
			}
		}
		if err := h.Refund([]core.Request{{Policy: a, Key: ka, Cost: 1}, {Policy: b, Key: kb, Cost: 2}}, 0); err != nil {
			t.Fatal(err)
		}
		if d, _ := h.Take(a, ka, 1, 0); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("a after the batch refund: %+v", d)
		}
		if d, _ := h.Take(b, kb, 2, 0); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("b after the batch refund: %+v", d)
		}
	})
	t.Run("PolicyIdentity", func(t *testing.T) {
		// A refund under another Identity carries the record over first:
		// 3 of 5 used, then a refund of 1 under 10/10m leaves 2 in use.
		for _, a := range core.Algorithms() {
			h := Harness{t, newStore(t)}
			small := mustPolicy(t, withBurst(core.Rule{Name: "rf-shared", Algorithm: a, Limit: 5, Window: 10 * time.Minute}))
			big := mustPolicy(t, core.Rule{Name: "rf-shared", Algorithm: core.FixedWindow, Limit: 10, Window: 10 * time.Minute})
			key := uniqueKey(t, "id")
			h.Take(small, key, 3, 0)
			if err := h.Refund([]core.Request{{Policy: big, Key: key, Cost: 1}}, ms); err != nil {
				t.Fatal(err)
			}
			if d, err := h.Take(big, key, 1, ms); err != nil || !d.Allowed || d.Remaining != 7 {
				t.Fatalf("%s: after the refund under 10/10m: %+v %v, want Remaining 7", a.Name(), d, err)
			}
		}
	})
	t.Run("Concurrency", func(t *testing.T) {
		// More goroutines than the limit, released together, take and
		// refund every admitted unit: the units held at once (admitted,
		// not yet refunded) never pass the limit, and the key ends whole.
		h := Harness{t, newStore(t)}
		const limit, workers = 8, 16
		for _, r := range suiteRules(limit, time.Hour) {
			p := mustPolicy(t, r)
			key := uniqueKey(t, "conc")
			var (
				wg            sync.WaitGroup
				held, maxHeld atomic.Int64
			)
			start := make(chan struct{})
			for g := 0; g < workers; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for i := 0; i < 25; i++ {
						var out [1]core.Decision
						reqs := []core.Request{{Policy: p, Key: key, Cost: 1}}
						if err := h.Store.Take(context.Background(), T0, reqs, out[:]); err != nil {
							t.Error(err)
							return
						}
						if out[0].Allowed {
							n := held.Add(1)
							for m := maxHeld.Load(); n > m && !maxHeld.CompareAndSwap(m, n); m = maxHeld.Load() {
							}
							runtime.Gosched()
							held.Add(-1)
							if err := h.Store.(core.Refunder).Refund(context.Background(), T0, reqs); err != nil {
								t.Error(err)
								return
							}
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			if m := maxHeld.Load(); m > limit {
				t.Fatalf("%s: %d units held at once under a limit of %d", r.Name, m, limit)
			}
			if d, err := h.Take(p, key, limit, 0); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%s: after %d takes, each refunded: %+v %v, want whole", r.Name, workers*25, d, err)
			}
		}
	})
}
