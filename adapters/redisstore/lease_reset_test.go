package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestLeaseReset checks LeaseStore.Reset: the process's own lease is
// dropped (counted expired, never returned into the fresh quota), the key
// is whole in Redis, and after that the fleet admits exactly the quota;
// a reset made by another process is held to the documented margin of
// Size - 1 per lease held.
func TestLeaseReset(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	for _, alg := range []core.Algorithm{core.FixedWindow, core.TokenBucket} {
		t.Run(alg.Name(), func(t *testing.T) {
			prefix := uniquePrefix(t)
			p := mustPolicy(t, core.Rule{Name: "api", Limit: 10, Window: time.Hour, Algorithm: alg})
			t0 := time.Unix(1_800_000_000, 0)
			// admitted runs the scenario: a holds a lease of 5 and spends
			// 1; reset resets the key; b spends what Redis admits; a's
			// lease ends; a then b decide 20 times each.
			admitted := func(viaLease bool) (int, LeaseStats) {
				a := newStore(t, client, &Config{Prefix: prefix + alg.Name() + "-" + map[bool]string{true: "own", false: "other"}[viaLease] + ":", ClientTime: true})
				b := newStore(t, client, &Config{Prefix: a.prefix, ClientTime: true})
				ls, err := NewLeaseStore(a, &LeaseConfig{Size: 5, MaxAge: time.Second, HotThreshold: 1})
				if err != nil {
					t.Fatal(err)
				}
				if d := take(t, ls, t0, p, "k", 1); !d.Allowed {
					t.Fatal("first request refused")
				}
				var reset core.Resetter = b
				if viaLease {
					reset = ls
				}
				if err := reset.Reset(context.Background(), p, "k"); err != nil {
					t.Fatal(err)
				}
				n := 0
				for i := range 20 {
					if take(t, b, t0.Add(10*time.Millisecond+time.Duration(i)), p, "k", 1).Allowed {
						n++
					}
				}
				for i := range 20 {
					if take(t, ls, t0.Add(2*time.Second+time.Duration(i)), p, "k", 1).Allowed {
						n++
					}
				}
				for i := range 20 {
					if take(t, b, t0.Add(3*time.Second+time.Duration(i)), p, "k", 1).Allowed {
						n++
					}
				}
				return n, ls.Stats()
			}
			if n, st := admitted(true); n != 10 || st.ReturnedUnits != 0 || st.ExpiredUnits != 4 {
				t.Errorf("reset through the LeaseStore: %d admitted after it (quota 10), stats %+v; want 10, 4 units expired, none returned", n, st)
			}
			if n, _ := admitted(false); n < 10 || n > 10+4 {
				t.Errorf("reset by another process: %d admitted after it, want the quota (10) plus at most Size - 1 (4)", n)
			}
		})
	}
	// A backend that cannot reset.
	ls, err := NewLeaseStore(takeOnly{core.MustMemoryStore(nil)}, &LeaseConfig{Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Reset(context.Background(), mustPolicy(t, core.PerMinute(1)), "k"); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("Reset over a backend that cannot: %v", err)
	}
}

// TestLeaseFallbackDecisionsMarked: with Redis down, a lease the Fallback
// granted is spent on the Fallback's state: every decision spent from it
// says so (core.Decision.Fallback), as the grant's does; a lease Redis
// granted does not.
func TestLeaseFallbackDecisionsMarked(t *testing.T) {
	p := mustPolicy(t, core.Rule{Name: "per-ip", Limit: 20, Window: time.Hour})
	down, err := NewLeaseStore(newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: core.MustMemoryStore(nil)}), &LeaseConfig{Size: 5, HotThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	up, err := NewLeaseStore(newStore(t, newClient(t, redistest.Server(t)), &Config{Prefix: uniquePrefix(t), ClientTime: true}), &LeaseConfig{Size: 5, HotThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_800_000_000, 0)
	for i := range 12 {
		if d := take(t, down, at, p, "k", 1); !d.Allowed || !d.Fallback {
			t.Fatalf("decision %d with Redis down: %+v, want allowed by the Fallback", i, d)
		}
		if d := take(t, up, at, p, "k", 1); !d.Allowed || d.Fallback {
			t.Fatalf("decision %d with Redis up: %+v, want allowed by Redis", i, d)
		}
	}
	if st := down.Stats(); st.Local == 0 {
		t.Fatalf("no decision spent from a lease: %+v", st)
	}
}
