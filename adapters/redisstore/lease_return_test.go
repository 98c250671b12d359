package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLeaseReturnsLeftovers: units left in a lease when it ends go back to
// a backend that can refund, so they are not lost to the quota.
func TestLeaseReturnsLeftovers(t *testing.T) {
	backend := core.MustMemoryStore(nil)
	ls, err := NewLeaseStore(backend, &LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 20, Window: time.Minute})
	t0 := time.Unix(1_800_000_000, 0)
	take := func(at time.Time) core.Decision {
		var out [1]core.Decision
		if err := ls.Take(context.Background(), at, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for i := range 3 {
		if d := take(t0.Add(time.Duration(i) * time.Millisecond)); !d.Allowed {
			t.Fatalf("request %d refused", i)
		}
	}
	// The lease of 10 ends with 7 units left; the next decision returns
	// them, then leases 10 again.
	after := t0.Add(time.Second + time.Millisecond)
	take(after)
	if st := ls.Stats(); st.ReturnedUnits != 7 || st.ExpiredUnits != 0 {
		t.Fatalf("stats %+v, want 7 units returned and none lost", st)
	}
	var out [1]core.Decision
	if err := backend.Peek(context.Background(), after, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	// 20 - 10 (first lease) + 7 (returned) - 10 (second lease), with the
	// third of a unit the bucket refilled in a second rounded down, is 7;
	// a peek reports Remaining after its own cost of 1.
	if out[0].Remaining != 6 {
		t.Fatalf("backend remaining %d, want 6 (without the return the peek would be refused)", out[0].Remaining)
	}
}

// TestLeaseReturnsOnlyWhatTheQuotaHolds: a lease's leftover units go back
// only while the backend still holds the lease's charge, with MaxAge to
// spare: under a fixed window, early in the window of the grant, not near
// its end; under other algorithms than the buckets and the fixed window,
// never (their refunds give back the most recent units, not the lease's).
func TestLeaseReturnsOnlyWhatTheQuotaHolds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0) // a multiple of a minute: a fixed window starts
	cases := []struct {
		alg                core.Algorithm
		at                 time.Duration // the grant, from t0
		returned, expired  uint64
		remainingAfterPeek int64
	}{
		// 20 - 10 (lease) + 7 (returned) - 10 (next lease) = 7, 6 after the peek's unit.
		{core.FixedWindow, 0, 7, 0, 6},
		// The lease ends 1 s after the grant, at 59.5 s: within MaxAge of
		// the window's end, so its 7 units are not returned (the window's
		// count keeps them until it ends): 20 - 10 - 10 = 0, and the peek
		// is refused.
		{core.FixedWindow, 58500 * time.Millisecond, 0, 7, -1},
		{core.SlidingWindowCounter, 0, 0, 7, -1},
		{core.SlidingWindowLog, 0, 0, 7, -1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/%v", tc.alg.Name(), tc.at), func(t *testing.T) {
			backend := core.MustMemoryStore(nil)
			ls := mustLease(t, backend, LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
			p := mustPolicy(t, core.Rule{Name: "api", Algorithm: tc.alg, Limit: 20, Window: time.Minute})
			grant := t0.Add(tc.at)
			for i := range 3 {
				if d := take(t, ls, grant.Add(time.Duration(i)*time.Millisecond), p, "k", 1); !d.Allowed {
					t.Fatalf("request %d refused", i)
				}
			}
			after := grant.Add(time.Second + time.Millisecond) // the lease has ended
			take(t, ls, after, p, "k", 1)
			if st := ls.Stats(); st.ReturnedUnits != tc.returned || st.ExpiredUnits != tc.expired {
				t.Fatalf("stats %+v, want %d units returned and %d lost", st, tc.returned, tc.expired)
			}
			var out [1]core.Decision
			if err := backend.Peek(context.Background(), after, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
			if tc.remainingAfterPeek < 0 {
				if out[0].Allowed {
					t.Fatalf("backend peek %+v, want refused", out[0])
				}
			} else if !out[0].Allowed || out[0].Remaining != tc.remainingAfterPeek {
				t.Fatalf("backend peek %+v, want %d remaining", out[0], tc.remainingAfterPeek)
			}
		})
	}
}

// TestLeaseLeftoversNeverCreditLaterCharges: two processes share a Redis
// quota, one leasing; the leaser's lease ends with units left, and the
// quota recovers and is spent again by the other process before the
// leaser's next decision. Returning the leftovers then would take them
// from the other process's charges and admit more than the quota.
func TestLeaseLeftoversNeverCreditLaterCharges(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	cases := []struct {
		alg       core.Algorithm
		lease     time.Duration // the leaser's first decision, from t0
		other, at time.Duration // the other process's burst, the leaser's next decisions
		want      int           // at most admitted in the burst and after it
	}{
		// Window [2 s, 3 s) holds 10: the other process takes them all.
		{core.FixedWindow, 900 * time.Millisecond, 2100 * time.Millisecond, 2500 * time.Millisecond, 10},
		// 10 per second: the bucket is whole again long before 4.9 s; the
		// other process empties it, and 0.1 s refills one.
		{core.TokenBucket, 0, 4900 * time.Millisecond, 5000 * time.Millisecond, 11},
	}
	for _, tc := range cases {
		t.Run(tc.alg.Name(), func(t *testing.T) {
			p := mustPolicy(t, core.Rule{Name: "q", Algorithm: tc.alg, Limit: 10, Window: time.Second})
			procs := processes(t, 2)
			x := mustLease(t, procs[0].Store, LeaseConfig{Size: 5, MaxAge: time.Second, HotThreshold: 1})
			z := procs[1]
			if d := take(t, x, t0.Add(tc.lease), p, "k", 1); !d.Allowed {
				t.Fatalf("leaser's first decision refused: %+v", d)
			}
			admitted := 0
			for range 20 {
				if take(t, z, t0.Add(tc.other), p, "k", 1).Allowed {
					admitted++
				}
			}
			if admitted != 10 {
				t.Fatalf("the other process admitted %d of a whole quota of 10", admitted)
			}
			for range 20 {
				if take(t, x, t0.Add(tc.at), p, "k", 1).Allowed {
					admitted++
				}
				if take(t, z, t0.Add(tc.at), p, "k", 1).Allowed {
					admitted++
				}
			}
			if st := x.Stats(); admitted > tc.want || st.ReturnedUnits != 0 || st.ExpiredUnits != 4 {
				t.Fatalf("admitted %d (at most %d), leaser's stats %+v (want 4 units lost, none returned)", admitted, tc.want, st)
			}
		})
	}
}

// TestLeaseFromFallbackNeverReturnedToRedis: a lease the Fallback granted
// while Redis was down was charged only in the Fallback; its leftovers
// must not be refunded to Redis once it is back, which would credit Redis
// with units it never charged and admit more than its quota.
func TestLeaseFromFallbackNeverReturnedToRedis(t *testing.T) {
	srv := redistest.Start(t)
	t0 := time.Unix(1_800_000_000, 0)
	p := mustPolicy(t, core.Rule{Name: "q", Limit: 10, Window: time.Minute})
	prefix := uniquePrefix(t)
	dialOnce := func(o *redis.Options) { o.DialerRetries = 1 }
	st := newStore(t, newClient(t, srv.Addr(), dialOnce), &Config{
		Prefix:     prefix,
		ClientTime: true,
		Fallback:   core.MustMemoryStore(nil),
		Breaker:    &BreakerConfig{Disabled: true},
	})
	ls := mustLease(t, st, LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
	fallback := st.fallback.(*core.MemoryStore)

	srv.Stop()
	if d := take(t, ls, t0, p, "k", 1); !d.Allowed { // the Fallback leases 10
		t.Fatalf("decision with Redis down and a Fallback: %+v", d)
	}
	srv.Restart(t)

	other := newStore(t, newClient(t, srv.Addr()), &Config{Prefix: prefix, ClientTime: true})
	admitted := 0
	for range 10 {
		if take(t, other, t0.Add(time.Millisecond), p, "k", 1).Allowed {
			admitted++
		}
	}
	// The Fallback's lease has ended with 9 units left; Redis's quota is
	// spent and refills one unit per 6 s.
	for range 10 {
		if take(t, ls, t0.Add(time.Second+2*time.Millisecond), p, "k", 1).Allowed {
			admitted++
		}
	}
	for range 10 {
		if take(t, other, t0.Add(time.Second+3*time.Millisecond), p, "k", 1).Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("Redis admitted %d within a second, want its quota of 10 (lease stats %+v)", admitted, ls.Stats())
	}
	// The leftovers went back to the Fallback, which charged them: 10 - 10
	// + 9, and a sixth of a unit refilled, rounded down; a peek reports
	// Remaining after its own unit.
	var out [1]core.Decision
	if err := fallback.Peek(context.Background(), t0.Add(time.Second+3*time.Millisecond), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if st := ls.Stats(); st.ReturnedUnits != 9 || !out[0].Allowed || out[0].Remaining != 8 {
		t.Fatalf("lease stats %+v, Fallback peek %+v: want the 9 leftovers returned to the Fallback", st, out[0])
	}
}

// TestLeaseLeftoversNotReturnedOnceRefilled: a bucket refills its oldest
// units in use first, the lease's among them; leftovers go back only
// while every one of them is still owed to the bucket beyond what has
// refilled since the grant. Here the lease of 20 (4 s of refill) ends
// with 19 left when 1.5 s have refilled 7.5 units: returning 19 would
// credit units the bucket had already refilled.
func TestLeaseLeftoversNotReturnedOnceRefilled(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	for _, alg := range []core.Algorithm{core.TokenBucket, core.LeakyBucket} {
		t.Run(alg.Name(), func(t *testing.T) {
			// One unit per 200 ms, capacity 300.
			p := mustPolicy(t, core.Rule{Name: "q", Algorithm: alg, Limit: 300, Window: time.Minute, Burst: 300})
			procs := processes(t, 2)
			x := mustLease(t, procs[0].Store, LeaseConfig{Size: 20, MaxAge: time.Second, HotThreshold: 1})
			z := procs[1]
			if d := take(t, x, t0, p, "k", 1); !d.Allowed {
				t.Fatalf("leaser's first decision refused: %+v", d)
			}
			at := t0.Add(1500 * time.Millisecond)
			admitted := 0
			drain := func(s core.Store) {
				for range 400 {
					if take(t, s, at, p, "k", 1).Allowed {
						admitted++
					}
				}
			}
			drain(z)
			drain(x)
			drain(z)
			// The unit spent at t0 refilled by t0+200ms: the bucket can
			// hold at most its capacity at t0+1.5s.
			if st := x.Stats(); admitted > 300 || st.ReturnedUnits != 0 {
				t.Fatalf("admitted %d at one instant with a capacity of 300, leaser's stats %+v", admitted, st)
			}
		})
	}
}

// TestLeaseReturnBoundedByTimeout: the refund of a lease's leftovers runs
// on a decision's path, so it is bounded by the store's Timeout like the
// decision itself, also for a client without ContextTimeoutEnabled (whose
// reads would otherwise wait for its ReadTimeout), and it is not made
// while the breaker is open: the leftovers are then lost, never waited
// for.
func TestLeaseReturnBoundedByTimeout(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0) // a fixed window of an hour starts
	p := mustPolicy(t, core.Rule{Name: "q", Algorithm: core.FixedWindow, Limit: 100, Window: time.Hour})
	t.Run("RedisStalled", func(t *testing.T) {
		srv := redistest.Start(t)
		c := newClient(t, srv.Addr()) // ContextTimeoutEnabled unset
		st := newStore(t, c, &Config{ClientTime: true, Timeout: 100 * time.Millisecond})
		ls := mustLease(t, st, LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
		if d := take(t, ls, t0, p, "k", 1); !d.Allowed {
			t.Fatalf("first decision refused: %+v", d)
		}
		redistest.Do(t, srv.Addr(), "CLIENT", "PAUSE", "2500", "ALL")
		start := time.Now()
		var out [1]core.Decision
		err := ls.Take(context.Background(), t0.Add(1001*time.Millisecond), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
		if el := time.Since(start); err == nil || el > time.Second {
			t.Fatalf("decision with the lease ended and Redis stalled, Timeout 100ms: %v after %v, want an error within the Timeouts of the refund and the lease", err, el)
		}
		if s := ls.Stats(); s.ReturnedUnits != 0 || s.ExpiredUnits != 9 {
			t.Fatalf("lease stats %+v, want the 9 leftovers lost", s)
		}
		eventually(t, 5*time.Second, "the abandoned calls to end with the pause", func() bool { return st.gate.running() == 0 })
	})
	t.Run("BreakerOpen", func(t *testing.T) {
		srv := redistest.Start(t)
		c := newClient(t, srv.Addr(), func(o *redis.Options) { o.DialerRetries = 1 })
		st := newStore(t, c, &Config{ClientTime: true, Timeout: 100 * time.Millisecond, Breaker: &BreakerConfig{Failures: 1, OpenFor: time.Hour}})
		ls := mustLease(t, st, LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
		if d := take(t, ls, t0, p, "k", 1); !d.Allowed {
			t.Fatalf("first decision refused: %+v", d)
		}
		srv.Stop()
		var out [1]core.Decision
		if err := st.Take(context.Background(), t0, []core.Request{{Policy: p, Key: "other", Cost: 1}}, out[:]); err == nil {
			t.Fatal("decision with Redis stopped succeeded")
		}
		if s := st.State(); s != BreakerOpen {
			t.Fatalf("breaker %v after a failure with Failures 1, want open", s)
		}
		srv.Restart(t) // healthy, but the breaker stays open
		err := ls.Take(context.Background(), t0.Add(1001*time.Millisecond), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("decision with the breaker open: %v, want ErrUnavailable", err)
		}
		if s := ls.Stats(); s.ReturnedUnits != 0 || s.ExpiredUnits != 9 {
			t.Fatalf("lease stats %+v, want the 9 leftovers lost, not refunded through an open breaker", s)
		}
	})
}

// TestLeaseFixedWindowLateReturnGivesNothing: a lease of a fixed window
// granted 300 ms before its window ends, whose leftovers are returned by a
// decision timed within the window (so the lease judges them returnable)
// that reaches Redis after another process filled the next window: the
// refund names its charge, so Redis, already in the next window, gives
// nothing back, and that window admits exactly its quota.
func TestLeaseFixedWindowLateReturnGivesNothing(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0) // a window of a second starts
	p := mustPolicy(t, core.Rule{Name: "q", Algorithm: core.FixedWindow, Limit: 10, Window: time.Second})
	procs := processes(t, 2)
	x := mustLease(t, procs[0].Store, LeaseConfig{Size: 5, MaxAge: 100 * time.Millisecond, HotThreshold: 1})
	z := procs[1]
	if d := take(t, x, t0.Add(700*time.Millisecond), p, "k", 1); !d.Allowed {
		t.Fatalf("x's first decision refused: %+v", d)
	}
	next := 0 // admitted in the window [1 s, 2 s)
	for range 20 {
		if take(t, z, t0.Add(1000*time.Millisecond), p, "k", 1).Allowed {
			next++
		}
	}
	for range 5 { // timed at 800 ms, reaching Redis after z's decisions
		if take(t, x, t0.Add(800*time.Millisecond), p, "k", 1).Allowed {
			next++ // Redis decides them in its record's window, [1 s, 2 s)
		}
	}
	for range 20 {
		if take(t, z, t0.Add(1500*time.Millisecond), p, "k", 1).Allowed {
			next++
		}
	}
	if next != 10 {
		t.Fatalf("window [1 s, 2 s) admitted %d, quota 10; x's stats %+v", next, x.Stats())
	}
}
