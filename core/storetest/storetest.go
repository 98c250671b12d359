// Package storetest is a conformance suite for core.Store implementations,
// in the manner of testing/fstest: a store that passes it decides exactly
// like the in-memory store for the same inputs.
//
// A store's test calls Run with a function returning a fresh, empty store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) core.Store {
//			return mystore.New(...)
//		})
//	}
//
// The suite passes explicit times to Store.Take, all whole milliseconds, so
// a store with its own clock must be configured to use the time it is given.
// It checks, for every built-in algorithm, explicit traces (times and costs
// against expected Allowed, Remaining, RetryAfter and ResetAfter), that
// RetryAfter is never early, that Remaining stays within [0, Limit], that
// batches are all-or-nothing, that keys and policies are independent, that
// a clock stepping backwards credits nothing and refuses a key for no longer
// than its policy's full-recovery time, that a never-seen key is whole at
// any instant (before 1970 and the zero time.Time included), that a record
// written under one policy is never read under another policy of the same
// Name (the units in use carry over), huge and tiny windows, cost
// validation, and exact admitted counts under concurrency. For a store that
// implements core.Peeker, core.Resetter or core.Refunder, it also checks
// that Peek decides exactly as Take without charging, that Reset makes a
// key whole, and that Refund gives back exactly the refunded units per
// algorithm, never above capacity, atomically per batch.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// T0 is the suite's starting time: a Unix time aligned to every window the
// suite uses (a multiple of one hour).
var T0 = time.Unix(1_800_000_000-1_800_000_000%3600, 0)

// Run runs the conformance suite. newStore is called once per subtest and
// must return a fresh store holding no state; register its cleanup on t.
func Run(t *testing.T, newStore func(t *testing.T) core.Store) {
	t.Helper()
	t.Run("Traces", func(t *testing.T) { testTraces(t, newStore) })
	t.Run("RetryAfterNeverEarly", func(t *testing.T) { testRetryAfter(t, newStore) })
	t.Run("RemainingBounds", func(t *testing.T) { testBounds(t, newStore) })
	t.Run("BatchAllOrNothing", func(t *testing.T) { testBatch(t, newStore) })
	t.Run("IndependentKeys", func(t *testing.T) { testIndependent(t, newStore) })
	t.Run("ClockBackwards", func(t *testing.T) { testBackwards(t, newStore) })
	t.Run("ClockBackwardsBounded", func(t *testing.T) { testBackwardsBounded(t, newStore) })
	t.Run("StaleTimeNeverCredits", func(t *testing.T) { testStale(t, newStore) })
	t.Run("StaleChargeRefunded", func(t *testing.T) { testStaleRefundCharge(t, newStore) })
	t.Run("StaleConversion", func(t *testing.T) { testStaleConversion(t, newStore) })
	t.Run("NewKeyWholeAtAnyInstant", func(t *testing.T) { testAnyInstant(t, newStore) })
	t.Run("PolicyIdentity", func(t *testing.T) { testIdentity(t, newStore) })
	t.Run("HugeAndTinyWindows", func(t *testing.T) { testWindows(t, newStore) })
	t.Run("CostValidation", func(t *testing.T) { testCost(t, newStore) })
	t.Run("Concurrency", func(t *testing.T) { testConcurrency(t, newStore) })
	runOps(t, newStore)
}

// Step is one request of a trace and the decision expected for it.
type Step struct {
	At         time.Duration // since T0
	Cost       int64         // units the request asks for
	Allowed    bool          // expected Decision.Allowed
	Remaining  int64         // expected Decision.Remaining
	RetryAfter time.Duration // expected Decision.RetryAfter
	ResetAfter time.Duration // expected Decision.ResetAfter; not checked when Err is set
	Delay      time.Duration // expected Decision.Delay (a shaping LeakyBucket)
	Err        error         // expected error (errors.Is), if any
}

// Trace is a rule and the steps that exercise it on one key.
type Trace struct {
	Name  string    // the subtest's name
	Rule  core.Rule // the rule the steps are decided under, as one Policy
	Steps []Step    // the requests, in order, on one fresh key
}

const ms = time.Millisecond

// Traces returns the explicit traces the suite checks, one or more per
// built-in algorithm. They are exported so that other tests (a reference
// model, documentation) can replay them.
func Traces() []Trace {
	return []Trace{
		{"TokenBucket", core.Rule{Name: "tb", Algorithm: core.TokenBucket, Limit: 4, Window: time.Second}, []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 3, ResetAfter: 250 * ms},
			{At: 0, Cost: 2, Allowed: true, Remaining: 1, ResetAfter: 750 * ms},
			{At: 0, Cost: 2, Remaining: 1, RetryAfter: 250 * ms, ResetAfter: 750 * ms},
			{At: 250 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 1000 * ms},
			{At: 250 * ms, Cost: 1, Remaining: 0, RetryAfter: 250 * ms, ResetAfter: 1000 * ms},
			{At: 2250 * ms, Cost: 4, Allowed: true, Remaining: 0, ResetAfter: 1000 * ms},
			{At: 2250 * ms, Cost: 5, Remaining: 0, ResetAfter: 1000 * ms, Err: core.ErrCostExceedsCapacity},
			{At: 3250 * ms, Cost: 1, Allowed: true, Remaining: 3, ResetAfter: 250 * ms},
		}},
		{"TokenBucketBurst", core.Rule{Name: "tbb", Algorithm: core.TokenBucket, Limit: 1, Window: time.Second, Burst: 3}, []Step{
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 3000 * ms},
			{At: 500 * ms, Cost: 1, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 2500 * ms},
			{At: 1000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 3000 * ms},
			{At: 4000 * ms, Cost: 2, Allowed: true, Remaining: 1, ResetAfter: 2000 * ms},
		}},
		{"LeakyBucket", core.Rule{Name: "lb", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second}, []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 500 * ms},
			{At: 100 * ms, Cost: 1, Remaining: 0, RetryAfter: 400 * ms, ResetAfter: 400 * ms},
			{At: 500 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 500 * ms},
			{At: 1000 * ms, Cost: 2, Remaining: 1, Err: core.ErrCostExceedsCapacity},
			{At: 1000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 500 * ms},
		}},
		{"LeakyBucketShaping", core.Rule{Name: "lbs", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second, MaxDelay: time.Second}, []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 500 * ms},
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 1000 * ms, Delay: 500 * ms},
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 1500 * ms, Delay: 1000 * ms},
			{At: 0, Cost: 1, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 1500 * ms},
			{At: 600 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 1400 * ms, Delay: 900 * ms},
		}},
		{"FixedWindow", core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 3, Window: 10 * time.Second}, []Step{
			{At: 1000 * ms, Cost: 2, Allowed: true, Remaining: 1, ResetAfter: 9000 * ms},
			{At: 2000 * ms, Cost: 2, Remaining: 1, RetryAfter: 8000 * ms, ResetAfter: 8000 * ms},
			{At: 2000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 8000 * ms},
			{At: 9999 * ms, Cost: 1, Remaining: 0, RetryAfter: 1 * ms, ResetAfter: 1 * ms},
			{At: 10000 * ms, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 10000 * ms},
			{At: 10000 * ms, Cost: 1, Remaining: 0, RetryAfter: 10000 * ms, ResetAfter: 10000 * ms},
			{At: 25000 * ms, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 5000 * ms},
		}},
		{"SlidingWindowLog", core.Rule{Name: "swl", Algorithm: core.SlidingWindowLog, Limit: 3, Window: 10 * time.Second}, []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 10000 * ms},
			{At: 4000 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 10000 * ms},
			{At: 5000 * ms, Cost: 1, Remaining: 0, RetryAfter: 5000 * ms, ResetAfter: 9000 * ms},
			{At: 10000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 10000 * ms},
			{At: 12000 * ms, Cost: 2, Remaining: 0, RetryAfter: 2000 * ms, ResetAfter: 8000 * ms},
			{At: 14000 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 10000 * ms},
			{At: 30000 * ms, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 10000 * ms},
		}},
		{"SlidingWindowCounter", core.Rule{Name: "swc", Algorithm: core.SlidingWindowCounter, Limit: 4, Window: 10 * time.Second}, []Step{
			{At: 0, Cost: 4, Allowed: true, Remaining: 0, ResetAfter: 20000 * ms},
			{At: 5000 * ms, Cost: 1, Remaining: 0, RetryAfter: 7500 * ms, ResetAfter: 15000 * ms},
			{At: 12500 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 17500 * ms},
			{At: 12500 * ms, Cost: 1, Remaining: 0, RetryAfter: 2500 * ms, ResetAfter: 17500 * ms},
			{At: 15000 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 15000 * ms},
			{At: 45000 * ms, Cost: 2, Allowed: true, Remaining: 2, ResetAfter: 15000 * ms},
		}},
	}
}

// Harness wraps a store with the suite's conventions: a fixed T0, one
// policy per rule, and errors reported through t.
type Harness struct {
	T     testing.TB // the running test (Take calls its Helper)
	Store core.Store // the store under test
}

// Take decides a single request at T0+at.
func (h Harness) Take(p *core.Policy, key string, cost int64, at time.Duration) (core.Decision, error) {
	h.T.Helper()
	var out [1]core.Decision
	err := h.Store.Take(context.Background(), T0.Add(at), []core.Request{{Policy: p, Key: key, Cost: cost}}, out[:])
	return out[0], err
}

func mustPolicy(t testing.TB, r core.Rule) *core.Policy {
	t.Helper()
	p, err := core.NewPolicy(r)
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

func uniqueKey(t testing.TB, base string) string {
	return fmt.Sprintf("%s:%s:%d", t.Name(), base, keySeq.Add(1))
}

var keySeq atomic.Int64

func testTraces(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, tr := range Traces() {
		t.Run(tr.Name, func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, tr.Rule)
			key := uniqueKey(t, "trace")
			for i, s := range tr.Steps {
				d, err := h.Take(p, key, s.Cost, s.At)
				if s.Err != nil {
					if !errors.Is(err, s.Err) {
						t.Fatalf("step %d (+%v cost %d): err = %v, want %v", i, s.At, s.Cost, err, s.Err)
					}
				} else if err != nil {
					t.Fatalf("step %d (+%v cost %d): %v", i, s.At, s.Cost, err)
				}
				got := Step{At: s.At, Cost: s.Cost, Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter, Delay: d.Delay, Err: s.Err}
				if s.Err != nil {
					// Over capacity: only the refusal, the absent retry
					// promise and the untouched remaining are specified.
					got.ResetAfter, s.ResetAfter = 0, 0
				}
				if got != s {
					t.Errorf("step %d (+%v cost %d):\n got allowed=%v remaining=%d retry=%v reset=%v delay=%v\nwant allowed=%v remaining=%d retry=%v reset=%v delay=%v",
						i, s.At, s.Cost, got.Allowed, got.Remaining, got.RetryAfter, got.ResetAfter, got.Delay,
						s.Allowed, s.Remaining, s.RetryAfter, s.ResetAfter, s.Delay)
				}
				if d.Limit != p.Capacity() {
					t.Errorf("step %d: Limit = %d, want capacity %d", i, d.Limit, p.Capacity())
				}
				if d.Policy != p {
					t.Errorf("step %d: Policy = %v, want %v", i, d.Policy, p)
				}
			}
		})
	}
}

// suiteRules returns one rule per algorithm with capacity c, for the
// property tests.
func suiteRules(c int64, w time.Duration) []core.Rule {
	var rs []core.Rule
	for _, a := range core.Algorithms() {
		r := core.Rule{Name: "p-" + a.Name(), Algorithm: a, Limit: c, Window: w}
		if a == core.LeakyBucket {
			r.Burst = c
		}
		rs = append(rs, r)
	}
	return rs
}

func testRetryAfter(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(5, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			rng := rand.New(rand.NewPCG(1, uint64(len(r.Name))))
			key := uniqueKey(t, "retry")
			at := time.Duration(0)
			checked := 0
			for i := 0; i < 200; i++ {
				at += time.Duration(rng.IntN(1500)) * ms
				cost := int64(1 + rng.IntN(3))
				d, err := h.Take(p, key, cost, at)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					if d.RetryAfter != 0 {
						t.Fatalf("+%v: allowed with RetryAfter %v", at, d.RetryAfter)
					}
					continue
				}
				if d.RetryAfter <= 0 {
					t.Fatalf("+%v cost %d: refused with RetryAfter %v", at, cost, d.RetryAfter)
				}
				if d.RetryAfter > ms {
					// Tight: one millisecond earlier is still refused.
					early, err := h.Take(p, key, cost, at+d.RetryAfter-ms)
					if err != nil {
						t.Fatal(err)
					}
					if early.Allowed {
						t.Fatalf("+%v cost %d: admitted %v before RetryAfter %v", at, cost, ms, d.RetryAfter)
					}
				}
				at += d.RetryAfter
				d2, err := h.Take(p, key, cost, at)
				if err != nil {
					t.Fatal(err)
				}
				if !d2.Allowed {
					t.Fatalf("retry after exactly RetryAfter refused: +%v cost %d: %+v", at, cost, d2)
				}
				checked++
			}
			if checked < 10 {
				t.Fatalf("only %d refusals exercised; the trace is too gentle", checked)
			}
		})
	}
}

func testBounds(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(7, 3*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			rng := rand.New(rand.NewPCG(2, uint64(len(r.Name))))
			key := uniqueKey(t, "bounds")
			at := time.Duration(0)
			for i := 0; i < 300; i++ {
				at += time.Duration(rng.IntN(700)) * ms
				d, err := h.Take(p, key, int64(1+rng.IntN(7)), at)
				if err != nil {
					t.Fatal(err)
				}
				if d.Remaining < 0 || d.Remaining > d.Limit || d.Limit != 7 {
					t.Fatalf("+%v: Remaining %d outside [0, %d]", at, d.Remaining, d.Limit)
				}
				if d.ResetAfter < 0 || d.RetryAfter < 0 {
					t.Fatalf("+%v: negative duration %+v", at, d)
				}
			}
		})
	}
}

func testBatch(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, a := range core.Algorithms() {
		t.Run(a.Name(), func(t *testing.T) {
			s := newStore(t)
			ip := mustPolicy(t, withBurst(core.Rule{Name: "ip-" + a.Name(), Algorithm: a, Limit: 5, Window: time.Hour}))
			user := mustPolicy(t, withBurst(core.Rule{Name: "user-" + a.Name(), Algorithm: a, Limit: 2, Window: time.Hour}))
			ipKey, userKey := uniqueKey(t, "ip"), uniqueKey(t, "user")
			take := func(uk string) [2]core.Decision {
				t.Helper()
				var out [2]core.Decision
				err := s.Take(context.Background(), T0, []core.Request{
					{Policy: ip, Key: ipKey, Cost: 1},
					{Policy: user, Key: uk, Cost: 1},
				}, out[:])
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			for i := 0; i < 2; i++ {
				d := take(userKey)
				if !d[0].Allowed || !d[1].Allowed {
					t.Fatalf("batch %d refused: %+v", i, d)
				}
			}
			d := take(userKey)
			if !d[0].Allowed || d[1].Allowed {
				t.Fatalf("third batch: ip allowed=%v user allowed=%v, want true/false", d[0].Allowed, d[1].Allowed)
			}
			if d[0].Remaining != 3 {
				t.Fatalf("refused batch reports ip Remaining %d, want 3 (uncharged)", d[0].Remaining)
			}
			if d[1].RetryAfter <= 0 {
				t.Fatalf("refusing layer has RetryAfter %v", d[1].RetryAfter)
			}
			// The refused batch charged nothing: another user behind the
			// same ip sees 3 left before its charge, 2 after.
			d = take(uniqueKey(t, "user2"))
			if !d[0].Allowed || d[0].Remaining != 2 {
				t.Fatalf("after a refused batch, ip Remaining = %d (allowed %v), want 2", d[0].Remaining, d[0].Allowed)
			}
			// The ip layer refusing leaves the user layer uncharged.
			for i := 0; i < 2; i++ {
				take(uniqueKey(t, "drain"))
			}
			fresh := uniqueKey(t, "fresh")
			d = take(fresh)
			if d[0].Allowed || !d[1].Allowed || d[1].Remaining != 2 {
				t.Fatalf("ip exhausted: %+v / %+v, want ip refused, user allowed with Remaining 2", d[0], d[1])
			}
			h := Harness{t, s}
			d1, err := h.Take(user, fresh, 1, 0)
			if err != nil || !d1.Allowed || d1.Remaining != 1 {
				t.Fatalf("user key charged by a refused batch: %+v %v", d1, err)
			}
			// Duplicates are rejected.
			var out [2]core.Decision
			err = s.Take(context.Background(), T0, []core.Request{{Policy: ip, Key: "dup", Cost: 1}, {Policy: ip, Key: "dup", Cost: 1}}, out[:])
			if !errors.Is(err, core.ErrDuplicateRequest) {
				t.Fatalf("duplicate batch: err = %v, want ErrDuplicateRequest", err)
			}
		})
	}
}

func withBurst(r core.Rule) core.Rule {
	if r.Algorithm == core.LeakyBucket {
		r.Burst = r.Limit
	}
	return r
}

func testIndependent(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(3, time.Minute) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			other := r
			other.Name = r.Name + "-other"
			q := mustPolicy(t, other)
			a, b := uniqueKey(t, "a"), uniqueKey(t, "b")
			for i := 0; i < 3; i++ {
				if d, err := h.Take(p, a, 1, 0); err != nil || !d.Allowed {
					t.Fatalf("a #%d: %+v %v", i, d, err)
				}
			}
			if d, _ := h.Take(p, a, 1, 0); d.Allowed {
				t.Fatal("a admitted beyond its limit")
			}
			if d, err := h.Take(p, b, 1, 0); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("b affected by a: %+v %v", d, err)
			}
			if d, err := h.Take(q, a, 1, 0); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("same key under another policy affected: %+v %v", d, err)
			}
		})
	}
}

func testBackwards(t *testing.T, newStore func(*testing.T) core.Store) {
	t.Run("counter window ahead", func(t *testing.T) {
		// A sliding counter whose record is a window ahead (charged at 5 s
		// and 15 s, then the clock is back at 9.9 s) counts all of that
		// window's units as now's: nothing is credited.
		h := Harness{t, newStore(t)}
		p := mustPolicy(t, core.Rule{Name: "ahead", Algorithm: core.SlidingWindowCounter, Limit: 10, Window: 10 * time.Second})
		key := uniqueKey(t, "ahead")
		if d, err := h.Take(p, key, 10, 5*time.Second); err != nil || !d.Allowed {
			t.Fatalf("10 at 5s: %+v %v", d, err)
		}
		if d, err := h.Take(p, key, 5, 15*time.Second); err != nil || !d.Allowed {
			t.Fatalf("5 at 15s: %+v %v", d, err)
		}
		if d, err := h.Take(p, key, 1, 9900*time.Millisecond); err != nil || d.Allowed {
			t.Fatalf("back at 9.9s: %+v %v, want refused", d, err)
		}
	})
	for _, r := range suiteRules(4, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			p := mustPolicy(t, r)
			key := uniqueKey(t, "back")
			base := time.Hour
			admitted := 0
			for i := 0; i < 4; i++ {
				if d, _ := h.Take(p, key, 1, base+time.Duration(i)*ms); d.Allowed {
					admitted++
				}
			}
			if admitted != 4 {
				t.Fatalf("admitted %d of 4", admitted)
			}
			// The clock steps back by up to an hour: nothing is credited.
			for _, back := range []time.Duration{-ms, -5 * time.Second, -10 * time.Second, -11 * time.Second, -time.Hour + 1} {
				if d, err := h.Take(p, key, 1, base+back); err != nil || d.Allowed {
					t.Fatalf("clock stepped back %v: admitted (%+v, %v)", back, d, err)
				} else if d.RetryAfter <= 0 {
					t.Fatalf("clock stepped back %v: RetryAfter %v", back, d.RetryAfter)
				}
			}
			// And time moving on again restores the quota.
			if d, err := h.Take(p, key, 4, base+time.Minute); err != nil || !d.Allowed {
				t.Fatalf("a minute later: %+v %v", d, err)
			}
		})
	}
}

func testWindows(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, a := range core.Algorithms() {
		t.Run(a.Name(), func(t *testing.T) {
			h := Harness{t, newStore(t)}
			year := 365 * 24 * time.Hour
			huge := mustPolicy(t, withBurst(core.Rule{Name: "huge", Algorithm: a, Limit: 1000, Window: year}))
			key := uniqueKey(t, "huge")
			if d, err := h.Take(huge, key, 1000, 0); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("huge window: %+v %v", d, err)
			}
			d, err := h.Take(huge, key, 1, time.Hour)
			if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 2*year {
				t.Fatalf("huge window, second request: %+v %v", d, err)
			}
			tiny := mustPolicy(t, withBurst(core.Rule{Name: "tiny", Algorithm: a, Limit: 1, Window: ms}))
			key = uniqueKey(t, "tiny")
			n := 0
			for i := 0; i < 100; i++ {
				if d, err := h.Take(tiny, key, 1, time.Duration(i)*ms); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					n++
				}
			}
			if n < 50 || n > 100 {
				t.Fatalf("tiny window (1 per ms) admitted %d of 100 spaced 1 ms apart", n)
			}
			if d, err := h.Take(tiny, key, 1, 99*ms); err != nil || d.Allowed {
				t.Fatalf("tiny window admitted twice in one ms: %+v %v", d, err)
			}
		})
	}
}

func testCost(t *testing.T, newStore func(*testing.T) core.Store) {
	h := Harness{t, newStore(t)}
	p := mustPolicy(t, core.Rule{Name: "cost", Limit: 3, Window: time.Minute})
	key := uniqueKey(t, "cost")
	for _, c := range []int64{0, -1, -1 << 62} {
		if _, err := h.Take(p, key, c, 0); !errors.Is(err, core.ErrInvalidCost) {
			t.Fatalf("cost %d: err = %v, want ErrInvalidCost", c, err)
		}
	}
	d, err := h.Take(p, key, 4, 0)
	if !errors.Is(err, core.ErrCostExceedsCapacity) || d.Allowed || d.RetryAfter != 0 {
		t.Fatalf("cost 4 > capacity 3: %+v %v, want refused, RetryAfter 0, ErrCostExceedsCapacity", d, err)
	}
	if d, err := h.Take(p, key, 3, 0); err != nil || !d.Allowed {
		t.Fatalf("invalid costs charged something: %+v %v", d, err)
	}
	// A batch with several requests over their capacities (the cost of a
	// request given to every layer), on new keys and on held ones, for
	// every algorithm: each is refused with no RetryAfter, and nothing is
	// charged.
	for _, r := range suiteRules(3, time.Minute) {
		for _, c := range []int64{4, 1 << 62} {
			q := mustPolicy(t, r)
			ka, kb := uniqueKey(t, "over-a"), uniqueKey(t, "over-b")
			for _, held := range []bool{false, true} {
				if held {
					if _, err := h.TakeBatch([]core.Request{{Policy: p, Key: ka, Cost: 1}, {Policy: q, Key: kb, Cost: 1}}, 0); err != nil {
						t.Fatal(err)
					}
				}
				reqs := []core.Request{{Policy: p, Key: ka, Cost: c}, {Policy: q, Key: kb, Cost: c}}
				out, err := h.TakeBatch(reqs, 0)
				if !errors.Is(err, core.ErrCostExceedsCapacity) {
					t.Fatalf("%s, cost %d on both, held %v: err %v, want ErrCostExceedsCapacity", r.Algorithm.Name(), c, held, err)
				}
				for i, d := range out {
					if d.Allowed || d.RetryAfter != 0 {
						t.Fatalf("%s, cost %d on both, held %v: request %d %+v, want refused with RetryAfter 0", r.Algorithm.Name(), c, held, i, d)
					}
				}
				if pk, ok := h.Store.(core.Peeker); ok {
					var pout [2]core.Decision
					if err := pk.Peek(context.Background(), T0, reqs, pout[:]); !errors.Is(err, core.ErrCostExceedsCapacity) || pout[1].Allowed || pout[1].RetryAfter != 0 {
						t.Fatalf("%s, cost %d on both, held %v: Peek %+v %v", r.Algorithm.Name(), c, held, pout, err)
					}
				}
			}
			// Only the two single units above were charged.
			d, err := h.TakeBatch([]core.Request{{Policy: p, Key: ka, Cost: 2}, {Policy: q, Key: kb, Cost: 2}}, 0)
			if err != nil || !d[0].Allowed || !d[1].Allowed || d[0].Remaining != 0 || d[1].Remaining != 0 {
				t.Fatalf("%s, cost %d: the refused batches charged something: %+v %v", r.Algorithm.Name(), c, d, err)
			}
		}
	}
}

func testConcurrency(t *testing.T, newStore func(*testing.T) core.Store) {
	const workers, each, capacity = 64, 8, 100
	for _, r := range suiteRules(capacity, time.Hour) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			s := newStore(t)
			p := mustPolicy(t, r)
			key := uniqueKey(t, "hot")
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			start := make(chan struct{}) // released together, so that they overlap
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					var out [1]core.Decision
					for i := 0; i < each; i++ {
						if err := s.Take(context.Background(), T0, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil {
							errs <- err
							return
						}
						if out[0].Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != capacity {
				t.Fatalf("%d goroutines x %d requests on a frozen clock admitted %d, want exactly %d", workers, each, got, capacity)
			}
		})
	}
	t.Run("Batches", func(t *testing.T) {
		s := newStore(t)
		ip := mustPolicy(t, core.Rule{Name: "cip", Limit: 50, Window: time.Hour})
		user := mustPolicy(t, core.Rule{Name: "cuser", Limit: 30, Window: time.Hour})
		ipKey := uniqueKey(t, "ip")
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				uk := fmt.Sprintf("%s-u%d", ipKey, w%2)
				var out [2]core.Decision
				for i := 0; i < each; i++ {
					err := s.Take(context.Background(), T0, []core.Request{{Policy: ip, Key: ipKey, Cost: 1}, {Policy: user, Key: uk, Cost: 1}}, out[:])
					if err == nil && out[0].Allowed && out[1].Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// Two users of 30 each behind one ip of 50: exactly 50 admitted, and
		// the ip layer was charged exactly for them.
		if got := admitted.Load(); got != 50 {
			t.Fatalf("admitted %d, want 50", got)
		}
		h := Harness{t, s}
		if d, _ := h.Take(ip, ipKey, 1, 0); d.Allowed {
			t.Fatalf("ip layer not exhausted after 50 admissions: %+v", d)
		}
	})
}

// Recovery returns the longest a key of p can be refused after the clock
// steps back, from the first decision after the step: the refill time
// Burst x Window / Limit (plus MaxDelay) for the buckets, one Window for
// the fixed window and the sliding log, two Windows for the sliding window
// counter.
func Recovery(p *core.Policy) time.Duration {
	switch p.Algorithm() {
	case core.TokenBucket, core.LeakyBucket:
		tau := time.Duration(p.Capacity()) * p.Window() / time.Duration(p.Limit())
		if tau*time.Duration(p.Limit()) < time.Duration(p.Capacity())*p.Window() {
			tau++
		}
		return tau + p.MaxDelay()
	case core.SlidingWindowCounter:
		return 2 * p.Window()
	}
	return p.Window()
}

// testBackwardsBounded steps the clock back by an hour, to the Unix epoch
// and to before it, after a key has used part of its quota: nothing is
// credited, and the key is whole again one recovery time (see Recovery)
// after the first decision at the earlier time.
func testBackwardsBounded(t *testing.T, newStore func(*testing.T) core.Store) {
	for _, r := range suiteRules(4, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			s := newStore(t)
			p := mustPolicy(t, r)
			rec := Recovery(p)
			for _, to := range []time.Time{T0.Add(-time.Hour), time.Unix(0, 0), time.Unix(-86400*365*3, 0)} {
				key := uniqueKey(t, "bounded")
				take := func(at time.Time, cost int64) core.Decision {
					t.Helper()
					var out [1]core.Decision
					if err := s.Take(context.Background(), at, []core.Request{{Policy: p, Key: key, Cost: cost}}, out[:]); err != nil {
						t.Fatalf("at %v: %v", at, err)
					}
					return out[0]
				}
				if d := take(T0, 3); !d.Allowed || d.Remaining != 1 {
					t.Fatalf("3 of 4 at T0: %+v", d)
				}
				// One unit was left: stepping back admits at most one.
				admitted := 0
				for i := 0; i < 3; i++ {
					d := take(to, 1)
					if d.Allowed {
						admitted++
						continue
					}
					if d.RetryAfter <= 0 || d.RetryAfter > rec {
						t.Fatalf("stepped back to %v: RetryAfter %v, want in (0, %v]", to, d.RetryAfter, rec)
					}
				}
				if admitted > 1 {
					t.Fatalf("stepped back to %v: admitted %d with 1 unit left", to, admitted)
				}
				if d := take(to.Add(rec), 4); !d.Allowed {
					t.Fatalf("stepped back to %v: refused the whole quota one recovery time (%v) later: %+v", to, rec, d)
				}
			}
			// The same in batches that another layer refuses: the first
			// refused batch after the step starts the recovery time.
			gate := mustPolicy(t, core.Rule{Name: "gate-" + r.Algorithm.Name(), Limit: 1, Window: gateWindow})
			for _, to := range []time.Time{T0.Add(-time.Hour), time.Unix(0, 0)} {
				key, gk := uniqueKey(t, "bounded-batch"), uniqueKey(t, "gate")
				var out [2]core.Decision
				if err := s.Take(context.Background(), T0, []core.Request{{Policy: p, Key: key, Cost: 4}, {Policy: gate, Key: gk, Cost: 1}}, out[:]); err != nil || !out[0].Allowed || !out[1].Allowed {
					t.Fatalf("at T0: %+v %v", out, err)
				}
				// The gate is exhausted: this batch is refused by it.
				if err := s.Take(context.Background(), to, []core.Request{{Policy: p, Key: key, Cost: 1}, {Policy: gate, Key: gk, Cost: 1}}, out[:]); err != nil || out[1].Allowed {
					t.Fatalf("stepped back to %v, gated batch: %+v %v", to, out, err)
				}
				if d := take2(t, s, p, key, to.Add(rec), 4); !d.Allowed {
					t.Fatalf("stepped back to %v: refused the whole quota one recovery time (%v) later: %+v", to, rec, d)
				}
			}
		})
	}
}

// gateWindow is the window of the suite's gate policies, which refuse
// every batch after their first.
const gateWindow = 24 * time.Hour

func take2(t *testing.T, s core.Store, p *core.Policy, key string, at time.Time, cost int64) core.Decision {
	t.Helper()
	var out [1]core.Decision
	if err := s.Take(context.Background(), at, []core.Request{{Policy: p, Key: key, Cost: cost}}, out[:]); err != nil {
		t.Fatalf("at %v: %v", at, err)
	}
	return out[0]
}

// testAnyInstant decides a never-seen key at instants before 1970, at the
// epoch and at the zero time.Time: it is whole at each.
func testAnyInstant(t *testing.T, newStore func(*testing.T) core.Store) {
	instants := []time.Time{
		time.Unix(0, 0), time.Unix(0, -1), time.Unix(-1, 0), time.Unix(-86400*365*30, 0), {},
	}
	for _, r := range suiteRules(4, 10*time.Second) {
		t.Run(r.Algorithm.Name(), func(t *testing.T) {
			s := newStore(t)
			p := mustPolicy(t, r)
			accepted := 0
			for _, at := range instants {
				key := uniqueKey(t, "instant")
				var out [1]core.Decision
				err := s.Take(context.Background(), at, []core.Request{{Policy: p, Key: key, Cost: 4}}, out[:])
				if errors.Is(err, core.ErrTimeOutOfRange) {
					// The store does not accept this instant, which the
					// contract allows; every instant it accepts must decide
					// a new key as whole.
					t.Logf("new key at %v: %v", at, err)
					continue
				}
				accepted++
				if err != nil || !out[0].Allowed || out[0].Remaining != 0 {
					t.Fatalf("new key at %v: %+v %v, want its whole quota of 4 admitted", at, out[0], err)
				}
				err = s.Take(context.Background(), at, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:])
				if err != nil || out[0].Allowed || out[0].RetryAfter <= 0 || out[0].RetryAfter > Recovery(p) {
					t.Fatalf("fifth unit at %v: %+v %v, want refused with RetryAfter in (0, %v]", at, out[0], err, Recovery(p))
				}
			}
			if accepted == 0 {
				t.Fatalf("the store accepted none of the instants %v", instants)
			}
		})
	}
}

// testIdentity shares one Name and one key between policies of every pair
// of algorithms and parameters: a record is never read under a policy with
// another Identity; the units in use carry over in absolute numbers.
func testIdentity(t *testing.T, newStore func(*testing.T) core.Store) {
	rule := func(a core.Algorithm, limit int64) core.Rule {
		return withBurst(core.Rule{Name: "shared", Algorithm: a, Limit: limit, Window: 10 * time.Minute})
	}
	for _, a := range core.Algorithms() {
		for _, b := range core.Algorithms() {
			t.Run(a.Name()+"/"+b.Name(), func(t *testing.T) {
				h := Harness{t, newStore(t)}
				small, big := mustPolicy(t, rule(a, 5)), mustPolicy(t, rule(b, 10))
				// 3 used of 5, then 10 per 10m: 10-3-1 = 6 left.
				key := uniqueKey(t, "grow")
				if d, err := h.Take(small, key, 3, 0); err != nil || !d.Allowed || d.Remaining != 2 {
					t.Fatalf("3 of 5: %+v %v", d, err)
				}
				if d, err := h.Take(big, key, 1, ms); err != nil || !d.Allowed || d.Remaining != 6 {
					t.Fatalf("after 3 of 5 used, 1 under 10/10m: %+v %v, want admitted with Remaining 6", d, err)
				}
				if d, err := h.Take(big, key, 7, ms); err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > Recovery(big) {
					t.Fatalf("7 more of 10 with 4 used: %+v %v, want refused with RetryAfter in (0, %v]", d, err, Recovery(big))
				}
				// Back to the small policy: 4 used, 1 left.
				if d, err := h.Take(small, key, 1, 2*ms); err != nil || !d.Allowed || d.Remaining != 0 {
					t.Fatalf("back to 5/10m with 4 used: %+v %v, want admitted with Remaining 0", d, err)
				}
				// A smaller policy never credits: 8 used of 10 leaves a
				// 5-unit policy empty. That conversion drops 3 units, so it
				// is not stored (the 10/10m state stays, to be found whole
				// by its own policy's requests): the key has room under
				// 5/10m once the 10/10m state's units in use fall to 4,
				// within the larger policy's recovery time.
				key = uniqueKey(t, "shrink")
				if d, err := h.Take(big, key, 8, 0); err != nil || !d.Allowed {
					t.Fatalf("8 of 10: %+v %v", d, err)
				}
				d, err := h.Take(small, key, 1, ms)
				if err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > Recovery(big) {
					t.Fatalf("8 of 10 used, then 5/10m: %+v %v, want refused, Remaining 0, RetryAfter in (0, %v]", d, err, Recovery(big))
				}
				at := ms + d.RetryAfter
				if e, err := h.Take(small, key, 1, at); err != nil || !e.Allowed {
					t.Fatalf("5/10m at RetryAfter %v: %+v %v, want admitted", d.RetryAfter, e, err)
				}
				if e, err := h.Take(small, key, 5, at+Recovery(small)); err != nil || !e.Allowed {
					t.Fatalf("5/10m one recovery time after its first charge: %+v %v, want whole", e, err)
				}
			})
		}
	}
	t.Run("Batch", func(t *testing.T) {
		// In a batch, too: the changed layer carries its units over, and a
		// batch refused by another layer charges nothing.
		s := newStore(t)
		h := Harness{t, s}
		small, big := mustPolicy(t, rule(core.TokenBucket, 5)), mustPolicy(t, rule(core.FixedWindow, 10))
		gate := mustPolicy(t, core.Rule{Name: "gate", Limit: 1, Window: time.Hour})
		key := uniqueKey(t, "batch")
		if d, err := h.Take(small, key, 3, 0); err != nil || !d.Allowed {
			t.Fatalf("3 of 5: %+v %v", d, err)
		}
		var out [2]core.Decision
		batch := []core.Request{{Policy: big, Key: key, Cost: 1}, {Policy: gate, Key: key, Cost: 1}}
		if err := s.Take(context.Background(), T0.Add(ms), batch, out[:]); err != nil || !out[0].Allowed || out[0].Remaining != 6 || !out[1].Allowed {
			t.Fatalf("batch after the change: %+v %v, want admitted with Remaining 6", out, err)
		}
		if err := s.Take(context.Background(), T0.Add(ms), batch, out[:]); err != nil || !out[0].Allowed || out[0].Remaining != 6 || out[1].Allowed {
			t.Fatalf("batch refused by the gate: %+v %v, want big uncharged, reporting Remaining 6", out, err)
		}
		if d, err := h.Take(big, key, 1, ms); err != nil || !d.Allowed || d.Remaining != 5 {
			t.Fatalf("after a refused batch: %+v %v, want Remaining 5", d, err)
		}
	})
	t.Run("Alternating", func(t *testing.T) {
		// Requests under two policies of one Name that alternate (equally
		// named tiers, a request still holding the rules a reload
		// replaced) never credit quota: a refused request under the
		// smaller policy leaves the larger one's record as it was, alone
		// and in a batch, for every pair of algorithms.
		for _, a := range core.Algorithms() {
			for _, b := range core.Algorithms() {
				t.Run(a.Name()+"/"+b.Name(), func(t *testing.T) {
					s := newStore(t)
					h := Harness{t, s}
					big, small := mustPolicy(t, rule(a, 10)), mustPolicy(t, rule(b, 2))
					gate := mustPolicy(t, core.Rule{Name: "gate", Limit: 100, Window: time.Hour})
					key := uniqueKey(t, "alt")
					if d, err := h.Take(big, key, 10, 0); err != nil || !d.Allowed {
						t.Fatalf("10 of 10: %+v %v", d, err)
					}
					for round := 0; round < 3; round++ {
						if d, err := h.Take(small, key, 1, ms); err != nil || d.Allowed {
							t.Fatalf("round %d: under the policy of 2, with 10 in use: %+v %v, want refused", round, d, err)
						}
						var out [2]core.Decision
						batch := []core.Request{{Policy: small, Key: key, Cost: 1}, {Policy: gate, Key: key, Cost: 1}}
						if err := s.Take(context.Background(), T0.Add(ms), batch, out[:]); err != nil || out[0].Allowed {
							t.Fatalf("round %d: a batch under the policy of 2: %+v %v, want refused", round, out, err)
						}
						if d, err := h.Take(big, key, 1, ms); err != nil || d.Allowed {
							t.Fatalf("round %d: back under the policy of 10, 10 in use: %+v %v, want refused (no credit)", round, d, err)
						}
					}
				})
			}
		}
	})
	t.Run("LossyConversion", func(t *testing.T) {
		full := func(t *testing.T, h Harness, p *core.Policy, key string, n int, at time.Duration) {
			t.Helper()
			for range n {
				if d, err := h.Take(p, key, 1, at); err != nil || !d.Allowed {
					t.Fatalf("fill: %+v %v", d, err)
				}
			}
		}
		t.Run("ShapingRefuses", func(t *testing.T) {
			// A shaping bucket admits a full bucket with a delay, but not
			// on a conversion that dropped units: that is refused, and the
			// larger policy keeps its units.
			h := Harness{t, newStore(t)}
			a := mustPolicy(t, core.Rule{Name: "lossy", Limit: 10, Window: time.Second})
			b := mustPolicy(t, core.Rule{Name: "lossy", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Second, Burst: 5, MaxDelay: time.Second})
			key := uniqueKey(t, "shaping")
			full(t, h, a, key, 10, 0)
			for i := range 30 {
				if d, err := h.Take(b, key, 1, 0); err != nil || d.Allowed || d.RetryAfter <= 0 {
					t.Fatalf("request %d under the shaping policy, 10 in use of its 5: %+v %v, want refused with a RetryAfter", i, d, err)
				}
			}
			if d, err := h.Take(a, key, 1, 0); err != nil || d.Allowed {
				t.Fatalf("back under 10/s, 10 in use: %+v %v, want refused", d, err)
			}
		})
		t.Run("QueuedUnitsInUse", func(t *testing.T) {
			// A shaping bucket's queue beyond its capacity is in use: a
			// conversion counts it, so that alternating requests do not
			// forget it.
			h := Harness{t, newStore(t)}
			a := mustPolicy(t, core.Rule{Name: "queued", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Second, Burst: 10, MaxDelay: time.Second})
			b := mustPolicy(t, core.Rule{Name: "queued", Limit: 10, Window: time.Second})
			key := uniqueKey(t, "queued")
			n := 0
			for range 40 {
				if d, err := h.Take(a, key, 1, 0); err == nil && d.Allowed {
					n++
				}
			}
			if n != 20 {
				t.Fatalf("the shaping bucket alone admitted %d, want 20", n)
			}
			for range 5 {
				h.Take(b, key, 1, 0)
				if d, err := h.Take(a, key, 1, 0); err == nil && d.Allowed {
					n++
				}
			}
			if n != 20 {
				t.Fatalf("alternating with 10/s, the shaping bucket admitted %d at one instant, want its 20", n)
			}
		})
		t.Run("RetryAfterNotEarly", func(t *testing.T) {
			for _, tc := range []struct {
				name       string
				a, b       core.Rule
				fill       int
				fillAt, at time.Duration
			}{
				// The larger policy shapes: its queue is in use, and the
				// wait is until it is back to the smaller capacity.
				{"shaping", core.Rule{Name: "w1", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Second, Burst: 10, MaxDelay: time.Second},
					core.Rule{Name: "w1", Limit: 10, Window: time.Second, Burst: 5}, 20, 0, 0},
				// The larger policy's record is ahead of a clock that
				// stepped back: the wait counts from its clamp.
				{"clock back", core.Rule{Name: "w2", Algorithm: core.FixedWindow, Limit: 10, Window: time.Second},
					core.Rule{Name: "w2", Limit: 5, Window: time.Second}, 10, 1500 * time.Millisecond, 500 * time.Millisecond},
			} {
				t.Run(tc.name, func(t *testing.T) {
					h := Harness{t, newStore(t)}
					a, b := mustPolicy(t, tc.a), mustPolicy(t, withBurst(tc.b))
					key := uniqueKey(t, "wait")
					for range tc.fill {
						h.Take(a, key, 1, tc.fillAt)
					}
					d, err := h.Take(b, key, 1, tc.at)
					if err != nil || d.Allowed || d.RetryAfter <= 0 {
						t.Fatalf("under the smaller policy: %+v %v, want refused with a RetryAfter", d, err)
					}
					if e, err := h.Take(b, key, 1, tc.at+d.RetryAfter); err != nil || !e.Allowed {
						t.Fatalf("at its RetryAfter %v: %+v %v, want admitted", d.RetryAfter, e, err)
					}
				})
			}
		})
		t.Run("ShapingQueueExact", func(t *testing.T) {
			// A shaping bucket's queue counts from its arrival time: 12
			// units of a 10/s bucket (2 in its capacity, 10 queued) leave
			// room for one under 5 once 4 are left (800 ms), and are all
			// back at 1.2 s; 2 units of 3/s leave room for one under 3.
			h := Harness{t, newStore(t)}
			a := mustPolicy(t, core.Rule{Name: "sq", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Second, Burst: 2, MaxDelay: time.Second})
			b := mustPolicy(t, core.Rule{Name: "sq", Limit: 10, Window: time.Second, Burst: 5})
			key := uniqueKey(t, "sq")
			n := 0
			for range 20 {
				if d, err := h.Take(a, key, 1, 0); err == nil && d.Allowed {
					n++
				}
			}
			if n != 12 {
				t.Fatalf("the shaping bucket admitted %d, want 12", n)
			}
			d, err := h.Take(b, key, 1, 0)
			if err != nil || d.Allowed || d.RetryAfter != 800*time.Millisecond || d.ResetAfter != 1200*time.Millisecond {
				t.Fatalf("under 5: %+v %v, want refused, RetryAfter 800ms, ResetAfter 1.2s", d, err)
			}
			a3 := mustPolicy(t, core.Rule{Name: "q3", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second, Burst: 1, MaxDelay: time.Second})
			b3 := mustPolicy(t, core.Rule{Name: "q3", Algorithm: core.FixedWindow, Limit: 3, Window: time.Second})
			key = uniqueKey(t, "q3")
			for range 2 {
				if d, err := h.Take(a3, key, 1, 0); err != nil || !d.Allowed {
					t.Fatalf("3/s shaping: %+v %v", d, err)
				}
			}
			if d, err := h.Take(b3, key, 1, 0); err != nil || !d.Allowed {
				t.Fatalf("under 3/s with 2 units in use: %+v %v, want admitted", d, err)
			}
		})
		t.Run("RefusedNotStored", func(t *testing.T) {
			// A refused request under B stores no conversion, also one
			// that drops nothing: a fixed window of 10 per 10 s would
			// forget at its window's end the 10 units a bucket of 10 per
			// 10 s holds for 10 s, and the bucket would find them gone.
			h := Harness{t, newStore(t)}
			a := mustPolicy(t, core.Rule{Name: "rn", Limit: 10, Window: 10 * time.Second})
			b := mustPolicy(t, core.Rule{Name: "rn", Algorithm: core.FixedWindow, Limit: 10, Window: 10 * time.Second})
			key := uniqueKey(t, "rn")
			if d, err := h.Take(a, key, 10, 9*time.Second); err != nil || !d.Allowed {
				t.Fatalf("10 of 10: %+v %v", d, err)
			}
			d, err := h.Take(b, key, 1, 9*time.Second)
			if err != nil || d.Allowed || d.RetryAfter != time.Second {
				t.Fatalf("under the window: %+v %v, want refused with RetryAfter 1s (one of the bucket's units back)", d, err)
			}
			if d, err := h.Take(a, key, 2, 10*time.Second); err != nil || d.Allowed {
				t.Fatalf("2 under the bucket 1s later, one unit back: %+v %v, want refused", d, err)
			}
			if d, err := h.Take(b, key, 1, 10*time.Second); err != nil || !d.Allowed {
				t.Fatalf("under the window at its RetryAfter: %+v %v, want admitted", d, err)
			}
		})
	})
	t.Run("SameIdentity", func(t *testing.T) {
		// Two policies built from one rule are one policy to the store:
		// recovery in progress is kept, not restarted.
		h := Harness{t, newStore(t)}
		r := core.Rule{Name: "same", Limit: 4, Window: 4 * time.Second}
		p1, p2 := mustPolicy(t, r), mustPolicy(t, r)
		key := uniqueKey(t, "same")
		if d, err := h.Take(p1, key, 4, 0); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		if d, err := h.Take(p2, key, 3, 2*time.Second); err != nil || d.Allowed || d.Remaining != 2 || d.RetryAfter != time.Second {
			t.Fatalf("same rule, another *Policy, 2s later: %+v %v, want Remaining 2, RetryAfter 1s", d, err)
		}
	})
}
