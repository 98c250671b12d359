package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
)

// sbBoth takes one request on both stores and returns their decisions.
func sbBoth(t *testing.T, ms, rs core.Store, at time.Time, p *core.Policy, key string, cost int64) (core.Decision, core.Decision) {
	t.Helper()
	var w, g [1]core.Decision
	req := []core.Request{{Policy: p, Key: key, Cost: cost}}
	werr := ms.Take(context.Background(), at, req, w[:])
	gerr := rs.Take(context.Background(), at, req, g[:])
	t.Logf("T%+v %s cost %d:\n  memory %s %v\n  redis  %s %v", at.Sub(storetest.T0), p.Identity(), cost, sbDec(w[0]), werr, sbDec(g[0]), gerr)
	return w[0], g[0]
}

func sbBothSame(t *testing.T, ms, rs core.Store, at time.Time, p *core.Policy, key string, cost int64) {
	t.Helper()
	w, g := sbBoth(t, ms, rs, at, p, key, cost)
	sbSame(t, w, g)
}

func sbStores(t *testing.T) (*core.MemoryStore, *Store) {
	client := newClient(t, redistest.Server(t))
	return core.MustMemoryStore(nil), newStore(t, client, &Config{ClientTime: true})
}

func sbSame(t *testing.T, w, g core.Decision) {
	t.Helper()
	w.RetryAfter, w.ResetAfter, w.Delay = ceilMicro(w.RetryAfter), ceilMicro(w.ResetAfter), ceilMicro(w.Delay)
	if w != g {
		t.Errorf("stores disagree:\n  memory %s\n  redis  %s", sbDec(w), sbDec(g))
	}
}

// A leaky bucket's record met by another policy after the clock stepped
// back: the memory store reads the old bucket's units in use from its
// arrival time clamped to now + refill time + MaxDelay, the Redis script,
// which does not store MaxDelay with a record, from the raw arrival time
// (records.lua load), as documented: it counts more units in use, never
// fewer. A token bucket's record, which has no MaxDelay, reads alike in
// both.
func TestStepBackConvertBucketRemaining(t *testing.T) {
	ms, rs := sbStores(t)
	lb := mustPolicy(t, core.Rule{Name: "mix1", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second})
	tb := mustPolicy(t, core.Rule{Name: "mix1", Algorithm: core.TokenBucket, Limit: 3, Window: time.Second, Burst: 7})
	t0 := storetest.T0.Add(22713877 * time.Microsecond)
	sbBothSame(t, ms, rs, t0, lb, "k1", 1) // TAT = t0 + 333.33ms, capacity 1
	w, g := sbBoth(t, ms, rs, t0.Add(-1532981*time.Microsecond), tb, "k1", 1)
	if g.Remaining > w.Remaining || g.Allowed && !w.Allowed {
		t.Errorf("Redis credits what memory does not:\n  memory %s\n  redis  %s", sbDec(w), sbDec(g))
	}
	tb1 := mustPolicy(t, core.Rule{Name: "mix1", Algorithm: core.TokenBucket, Limit: 3, Window: time.Second})
	sbBothSame(t, ms, rs, t0, tb1, "k2", 1)
	sbBothSame(t, ms, rs, t0.Add(-1532981*time.Microsecond), tb, "k2", 1)
}

// The same, where the converted request fits: both stores admit it (Redis
// refused it, reading the old bucket unclamped).
func TestStepBackConvertBucketRefused(t *testing.T) {
	ms, rs := sbStores(t)
	tb := mustPolicy(t, core.Rule{Name: "mix1", Algorithm: core.TokenBucket, Limit: 1, Window: 999 * time.Millisecond})
	fw := mustPolicy(t, core.Rule{Name: "mix1", Algorithm: core.FixedWindow, Limit: 3, Window: time.Second})
	t0 := storetest.T0.Add(3338806402 * time.Microsecond)
	sbBothSame(t, ms, rs, t0, tb, "k1", 1)
	sbBothSame(t, ms, rs, t0.Add(-1601076*time.Microsecond), fw, "k1", 1)
}

// The same with a long step back (an hour): both stores admit within the
// recovery time (the old bucket's refill time is 1s, the new window 1s), as
// doc.go and core.Store promise; Redis locked the key out for about the
// length of the step.
func TestStepBackConvertBucketLockout(t *testing.T) {
	ms, rs := sbStores(t)
	tb := mustPolicy(t, core.Rule{Name: "n", Algorithm: core.TokenBucket, Limit: 7, Window: time.Second})
	fw := mustPolicy(t, core.Rule{Name: "n", Algorithm: core.FixedWindow, Limit: 7, Window: time.Second})
	t0 := storetest.T0
	sbBothSame(t, ms, rs, t0, tb, "k", 7) // empty: TAT = t0 + 1s
	back := t0.Add(-time.Hour)
	w, g := sbBoth(t, ms, rs, back, fw, "k", 1)
	sbSame(t, w, g)
	// Two recovery times later (2s), a request under fw must be admitted.
	later := back.Add(2 * time.Second)
	w, g = sbBoth(t, ms, rs, later, fw, "k", 1)
	if !g.Allowed {
		t.Errorf("redis refuses the key %v after a 1h step back (old refill 1s, new window 1s): %s", later.Sub(back), sbDec(g))
	}
	if !w.Allowed {
		t.Errorf("memory refuses too: %s", sbDec(w))
	}
}

// A sliding log record met by another sliding log policy of the same Name
// after the clock stepped back, refused: both stores refuse alike. (Redis
// failed with a Lua error, which a fail-open Limiter serves unlimited:
// convrefuse decided again on the log it had just clamped, from a stale
// cache of its entries.)
func TestStepBackConvertSlidingLog(t *testing.T) {
	ms, rs := sbStores(t)
	a := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowLog, Limit: 7, Window: time.Second})
	b := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowLog, Limit: 1, Window: 999 * time.Millisecond})
	t0 := storetest.T0
	sbBothSame(t, ms, rs, t0, a, "k", 3)
	sbBothSame(t, ms, rs, t0.Add(800*time.Millisecond), a, "k", 1) // an entry the step back puts in the future
	var w, g [1]core.Decision
	req := []core.Request{{Policy: b, Key: "k", Cost: 1}}
	back := t0.Add(-100 * time.Millisecond)
	werr := ms.Take(context.Background(), back, req, w[:])
	gerr := rs.Take(context.Background(), back, req, g[:])
	t.Logf("memory %s %v\nredis  %s %v", sbDec(w[0]), werr, sbDec(g[0]), gerr)
	if gerr != nil || werr != nil {
		t.Fatalf("redis: %v, memory: %v", gerr, werr)
	}
	sbSame(t, w[0], g[0])
}

// A refund (nothing to give back: the charge has left the window) at a
// later time, then the clock steps back: both stores leave the expired
// entry in the log, so that after the step back it counts again (the
// memory store's refund dropped it, and admitted a full-capacity request
// Redis refused).
func TestStepBackAfterRefundSlidingLog(t *testing.T) {
	ms, rs := sbStores(t)
	swl := mustPolicy(t, core.Rule{Name: "n", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Second})
	t0 := storetest.T0
	sbBothSame(t, ms, rs, t0, swl, "k", 1)
	req := []core.Request{{Policy: swl, Key: "k", Cost: 1}}
	at := t0.Add(1345 * time.Millisecond)
	sbRefund(t, ms, rs, at, req)
	sbBothSame(t, ms, rs, t0.Add(300*time.Millisecond), swl, "k", 3)
}

// A sliding window counter refunded with a ChargedAt of a later window
// (nothing to give back), at a time when the key is whole, then the clock
// steps back and another counter policy of the same Name peeks: both
// stores still read the unit of the previous window (Redis's refund
// deleted the record).
func TestStepBackAfterRefundSlidingCounter(t *testing.T) {
	ms, rs := sbStores(t)
	a := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowCounter, Limit: 7, Window: time.Second})
	b := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowCounter, Limit: 3, Window: 999 * time.Millisecond})
	sbBothSame(t, ms, rs, sbAt(46316291686), a, "k1", 1)
	req := []core.Request{{Policy: a, Key: "k1", Cost: 1, ChargedAt: storetest.T0.Add(46317887497000)}}
	at := sbAt(46318253512)
	sbRefund(t, ms, rs, at, req)
	var w, g [1]core.Decision
	preq := []core.Request{{Policy: b, Key: "k1", Cost: 1}}
	werr := ms.Peek(context.Background(), sbAt(46317467380), preq, w[:])
	gerr := rs.Peek(context.Background(), sbAt(46317467380), preq, g[:])
	t.Logf("peek: memory %s %v\n redis %s %v", sbDec(w[0]), werr, sbDec(g[0]), gerr)
	sbSame(t, w[0], g[0])
}

// Two leaky buckets of one Name and Identity, one shaping (MaxDelay 1s),
// one not: the shaping one builds a queue; a Peek under the other reports
// a RetryAfter read from the queue clamped to its own now + tau (as the
// README says the one with less MaxDelay clamps the queue), and writes
// that clamp, so that at now + RetryAfter the same request is admitted, in
// both stores, by a Peek as by a Take (the memory store clamped under the
// record's policy, and its RetryAfter was early).
func TestPeekSharedIdentityRetryAfter(t *testing.T) {
	for _, viaTake := range []bool{false, true} {
		ms, rs := sbStores(t)
		shape := mustPolicy(t, core.Rule{Name: "n", Algorithm: core.LeakyBucket, Limit: 3, Window: 999 * time.Millisecond, Burst: 3, MaxDelay: time.Second})
		meter := mustPolicy(t, core.Rule{Name: "n", Algorithm: core.LeakyBucket, Limit: 3, Window: 999 * time.Millisecond, Burst: 3})
		t0 := storetest.T0
		sbBothSame(t, ms, rs, t0, shape, "k", 3)
		sbBothSame(t, ms, rs, t0, shape, "k", 3) // delayed 999ms: TAT = t0 + 1.998s
		at := t0.Add(637867 * time.Microsecond)
		req := []core.Request{{Policy: meter, Key: "k", Cost: 3}}
		for i, st := range []interface {
			core.Store
			core.Peeker
		}{ms, rs} {
			var d [1]core.Decision
			var err error
			if viaTake {
				err = st.Take(context.Background(), at, req, d[:])
			} else {
				err = st.Peek(context.Background(), at, req, d[:])
			}
			if err != nil || d[0].Allowed {
				t.Fatalf("store %d: %s %v", i, sbDec(d[0]), err)
			}
			var p [1]core.Decision
			st.Peek(context.Background(), at.Add(d[0].RetryAfter), req, p[:])
			t.Logf("viaTake=%v store %d: refused %s; at +RetryAfter: %s", viaTake, i, sbDec(d[0]), sbDec(p[0]))
			if !p[0].Allowed {
				t.Errorf("viaTake=%v store %d (0 memory, 1 redis): RetryAfter %v early: at +RetryAfter %s", viaTake, i, d[0].RetryAfter, sbDec(p[0]))
			}
		}
	}
}

func sbDec(d core.Decision) string {
	return fmt.Sprintf("{ok=%v lim=%d rem=%d retry=%v reset=%v delay=%v}", d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Delay)
}

// sbRefund refunds reqs at at in both stores.
func sbRefund(t *testing.T, ms, rs core.Refunder, at time.Time, reqs []core.Request) {
	t.Helper()
	for _, s := range []core.Refunder{ms, rs} {
		if err := s.Refund(context.Background(), at, reqs); err != nil {
			t.Fatal(err)
		}
	}
}

// sbAt is storetest.T0 plus us microseconds.
func sbAt(us int64) time.Time { return storetest.T0.Add(time.Duration(us) * time.Microsecond) }

// A sliding counter refunded by charge at a time when it is whole (its
// counts all from past windows): the Redis record is kept for the
// ClientTime slack, as one that became whole with time is, so that after
// the clock steps back its counts are read again, as the memory store
// reads them (deleting it credited them).
func TestStepBackAfterRefundWholeCounter(t *testing.T) {
	ms, rs := sbStores(t)
	a := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowCounter, Limit: 7, Window: time.Second})
	b := mustPolicy(t, core.Rule{Name: "mix3", Algorithm: core.SlidingWindowCounter, Limit: 3, Window: 999 * time.Millisecond})
	sbBothSame(t, ms, rs, sbAt(46316291686), a, "k1", 1)
	sbBothSame(t, ms, rs, sbAt(46317887497), a, "k1", 1)
	req := []core.Request{{Policy: a, Key: "k1", Cost: 1, ChargedAt: sbAt(46317887497)}}
	at := sbAt(46318253512) // the key is whole then
	sbRefund(t, ms, rs, at, req)
	var w, g [1]core.Decision
	preq := []core.Request{{Policy: b, Key: "k1", Cost: 1}}
	werr := ms.Peek(context.Background(), sbAt(46317467380), preq, w[:])
	gerr := rs.Peek(context.Background(), sbAt(46317467380), preq, g[:])
	if werr != nil || gerr != nil {
		t.Fatal(werr, gerr)
	}
	sbSame(t, w[0], g[0])
}

// A sliding log refunded by a clock that stepped back behind its entries
// leaves them where they are in both stores, so that later decisions agree
// (the memory store moved them to the refund's time).
func TestStepBackRefundSlidingLogFuture(t *testing.T) {
	ms, rs := sbStores(t)
	p := mustPolicy(t, core.Rule{Name: "swl", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Second})
	t0 := storetest.T0
	sbBothSame(t, ms, rs, t0, p, "k", 3)
	back := t0.Add(-time.Hour)
	req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	sbRefund(t, ms, rs, back, req)
	sbBothSame(t, ms, rs, back.Add(1500*time.Millisecond), p, "k", 1)
}

// A refund under a sliding log of another policy's record that holds
// nothing at the refund replaces it with nothing in both stores (Redis
// kept the old record), so that after a clock step back neither reads it.
func TestStepBackAfterConvertedEmptyRefund(t *testing.T) {
	ms, rs := sbStores(t)
	tb := mustPolicy(t, core.Rule{Name: "mix2", Algorithm: core.TokenBucket, Limit: 7, Window: time.Millisecond, Burst: 1})
	swl := mustPolicy(t, core.Rule{Name: "mix2", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Hour})
	sbBothSame(t, ms, rs, sbAt(254607470), tb, "k1", 1)
	req := []core.Request{{Policy: swl, Key: "k1", Cost: 1}}
	sbRefund(t, ms, rs, sbAt(256201405), req)
	sbBothSame(t, ms, rs, sbAt(-989008582), swl, "k1", 1)
}
