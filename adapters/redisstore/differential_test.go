package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// differentialConfig, if set, configures the stores of runDifferential.
var differentialConfig *Config

func tagOf(s *Store, name, key string) string {
	if s.hashTag == nil {
		return ""
	}
	return s.hashTag(name, key)
}

// ceilMicro rounds d up to a whole number of microseconds: the Redis store
// computes in microseconds and rounds every duration up, never early.
func ceilMicro(d time.Duration) time.Duration {
	if r := d % time.Microsecond; r > 0 {
		d += time.Microsecond - r
	}
	return d
}

// differentialRules are rules of every algorithm whose Window and MaxDelay
// are whole microseconds, so the Redis store must decide exactly like the
// memory store. They include emission intervals that are not whole
// microseconds (W/L with a remainder), shaping, bursts, and parameters
// whose products exceed 2^53, exercising the wide arithmetic of the script.
func differentialRules() []core.Rule {
	day := 24 * time.Hour
	year := 365 * day
	return []core.Rule{
		{Name: "tb", Algorithm: core.TokenBucket, Limit: 3, Window: 7 * time.Second},
		{Name: "tb-burst", Algorithm: core.TokenBucket, Limit: 7, Window: 1500 * time.Millisecond, Burst: 11},
		{Name: "tb-odd", Algorithm: core.TokenBucket, Limit: 1_000_003, Window: time.Second + 7*time.Microsecond},
		{Name: "tb-wide", Algorithm: core.TokenBucket, Limit: 1_000_000, Window: day},
		{Name: "tb-huge", Algorithm: core.TokenBucket, Limit: 1 << 50, Window: core.MaxWindow},
		{Name: "tb-slow", Algorithm: core.TokenBucket, Limit: 5, Window: 49 * year, Burst: 5},
		{Name: "lb", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second},
		{Name: "lb-shape", Algorithm: core.LeakyBucket, Limit: 5, Window: 3 * time.Second, Burst: 2, MaxDelay: 1700 * time.Millisecond},
		{Name: "lb-wide", Algorithm: core.LeakyBucket, Limit: 1_000_000_000, Window: time.Hour, Burst: 1_000_000_000, MaxDelay: time.Hour},
		{Name: "fw", Algorithm: core.FixedWindow, Limit: 5, Window: 10 * time.Second},
		{Name: "fw-odd", Algorithm: core.FixedWindow, Limit: 4, Window: 2333 * time.Millisecond},
		{Name: "fw-huge", Algorithm: core.FixedWindow, Limit: 1 << 50, Window: core.MaxWindow},
		{Name: "swl", Algorithm: core.SlidingWindowLog, Limit: 6, Window: 5 * time.Second},
		{Name: "swl-tight", Algorithm: core.SlidingWindowLog, Limit: 3, Window: 20 * time.Second},
		{Name: "swl-many", Algorithm: core.SlidingWindowLog, Limit: 100, Window: time.Minute},
		{Name: "swl-big", Algorithm: core.SlidingWindowLog, Limit: 1_000_000, Window: time.Hour},
		{Name: "swc", Algorithm: core.SlidingWindowCounter, Limit: 4, Window: 10 * time.Second},
		{Name: "swc-odd", Algorithm: core.SlidingWindowCounter, Limit: 7, Window: 3001 * time.Millisecond},
		// The largest limit the sliding window counter accepts.
		{Name: "swc-wide", Algorithm: core.SlidingWindowCounter, Limit: 1<<32 - 1, Window: 10 * year},
	}
}

// memoryBoundsClockBack reports whether core.MemoryStore bounds a clock
// stepped back by the refill time, as the Redis store does (a token
// bucket of capacity 1 refilled in 1s, emptied at T0 and asked again an
// hour earlier, must admit within the refill time). Until it does, the
// differential traces never step back (a step back stays at the latest
// time so far), since the reference would decide those steps by another
// rule; TestClockBack checks the Redis store's rule directly.
var memoryBoundsClockBack = func() bool {
	p := core.MustPolicy(core.Rule{Name: "probe", Limit: 1, Window: time.Second})
	ms := core.MustMemoryStore(nil)
	var out [1]core.Decision
	req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	if ms.Take(context.Background(), storetest.T0, req, out[:]) != nil {
		return false
	}
	if ms.Take(context.Background(), storetest.T0.Add(-time.Hour), req, out[:]) != nil {
		return false
	}
	return out[0].RetryAfter <= time.Second
}()

// TestDifferential replays random traces (times in whole milliseconds,
// stepping forwards by various amounts and sometimes backwards; costs up to
// and beyond capacity; single requests and batches mixing algorithms and
// keys) against the Redis store and a core.MemoryStore, and demands the
// same decisions: Allowed, Remaining, Limit and errors equal, and
// RetryAfter, ResetAfter and Delay equal once the memory store's are
// rounded up to whole microseconds.
func TestDifferential(t *testing.T) {
	runDifferential(t, newClient(t, redistest.Server(t)), []uint64{1, 2, 3, 4, 5})
}

// runDifferential runs the differential traces of the given seeds (1 to 5)
// against a store over client.
func runDifferential(t *testing.T, client redis.UniversalClient, seeds []uint64) {
	var all, logs []*core.Policy
	for _, r := range differentialRules() {
		p := mustPolicy(t, r)
		all = append(all, p)
		if r.Algorithm == core.SlidingWindowLog {
			logs = append(logs, p)
		}
	}
	keys := []string{"alpha", "beta", "γ:{x}"}
	refusedBy := map[string]int{}
	var maxLog int64 // longest swl-many list seen (1 + entries)
	// Seeds 1 and 2 spread over every rule; seeds 3 and 4 concentrate on
	// five; seed 5 on the logs, whose entries then outgrow a chunk.
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			policies := all
			switch seed {
			case 3, 4:
				r := rand.New(rand.NewPCG(seed, 1))
				perm := r.Perm(len(all))
				policies = nil
				for _, i := range perm[:5] {
					policies = append(policies, all[i])
				}
			case 5:
				policies = logs
			}
			cfg := Config{ClientTime: true}
			if differentialConfig != nil {
				cfg = *differentialConfig
			}
			rs := newStore(t, client, &cfg)
			ms := core.MustMemoryStore(nil)
			rng := rand.New(rand.NewPCG(seed, 99))
			at := storetest.T0
			maxAt := at
			steps := 2500
			if testing.Short() {
				steps = 500
			}
			var compared, refused, delayed, partial, over int
			for step := 0; step < steps; step++ {
				switch x := rng.IntN(1000); {
				case seed == 5 && x < 960: // the logs: many instants per window
					at = at.Add(time.Duration(rng.IntN(100)) * time.Millisecond)
				case seed == 5 && x < 995:
					at = at.Add(-time.Duration(rng.IntN(300)) * time.Millisecond)
				case seed == 5:
					at = at.Add(time.Duration(rng.IntN(120_000)) * time.Millisecond)
				case x < 500:
				case x < 750:
					at = at.Add(time.Duration(rng.IntN(500)) * time.Millisecond)
				case x < 870:
					at = at.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
				case x < 920:
					at = at.Add(time.Duration(rng.IntN(3_600_000)) * time.Millisecond)
				case x < 950:
					at = at.Add(time.Duration(rng.Int64N(int64(400*24*time.Hour/time.Millisecond))) * time.Millisecond)
				default:
					at = at.Add(-time.Duration(rng.IntN(5000)) * time.Millisecond)
				}
				if !memoryBoundsClockBack && at.Before(maxAt) {
					at = maxAt // see memoryBoundsClockBack
				}
				if at.After(maxAt) {
					maxAt = at
				}
				n := 1
				if rng.IntN(3) == 0 {
					n = 2 + rng.IntN(3)
				}
				reqs := make([]core.Request, 0, n)
				for len(reqs) < n {
					p := policies[rng.IntN(len(policies))]
					k := keys[rng.IntN(len(keys))]
					dup := false
					for _, r := range reqs {
						dup = dup || (r.Policy == p && r.Key == k)
					}
					if dup {
						continue
					}
					cost := randomCost(rng, p.Capacity())
					if seed == 5 && rng.IntN(10) > 0 {
						cost = 1
					}
					reqs = append(reqs, core.Request{Policy: p, Key: k, Cost: cost})
				}
				want := make([]core.Decision, n)
				got := make([]core.Decision, n)
				werr := ms.Take(context.Background(), at, reqs, want)
				gerr := rs.Take(context.Background(), at, reqs, got)
				if (werr == nil) != (gerr == nil) || (werr != nil && !errors.Is(gerr, core.ErrCostExceedsCapacity)) {
					t.Fatalf("step %d: memory err %v, redis err %v", step, werr, gerr)
				}
				if werr != nil {
					over++
				}
				nAllowed := 0
				for i := range reqs {
					w, g := want[i], got[i]
					if w.Allowed {
						nAllowed++
					} else {
						refused++
						refusedBy[reqs[i].Policy.Algorithm().Name()]++
					}
					if w.Delay > 0 {
						delayed++
					}
					w.RetryAfter, w.ResetAfter, w.Delay = ceilMicro(w.RetryAfter), ceilMicro(w.ResetAfter), ceilMicro(w.Delay)
					if w != g {
						t.Fatalf("step %d at T0%+v, request %d of %d (%s key %q cost %d):\nmemory %+v\nredis  %+v",
							step, at.Sub(storetest.T0), i, n, reqs[i].Policy, reqs[i].Key, reqs[i].Cost, w, g)
					}
					compared++
				}
				if nAllowed > 0 && nAllowed < n {
					partial++
				}
				if seed == 5 && step%50 == 0 {
					for _, k := range keys {
						key := redisKey(rs.prefix, "swl-many", tagOf(rs, "swl-many", k), &core.Request{Key: k})
						maxLog = max(maxLog, client.LLen(context.Background(), key).Val())
					}
				}
			}
			t.Logf("%d decisions compared: %d refused, %d delayed, %d batches refused by some layers only, %d over capacity",
				compared, refused, delayed, partial, over)
			if refused == 0 || partial == 0 || over == 0 {
				t.Fatal("the trace is too gentle to compare the stores")
			}
		})
	}
	if len(seeds) < 5 {
		return
	}
	for _, a := range core.Algorithms() {
		if refusedBy[a.Name()] < 50 {
			t.Errorf("only %d refusals by %s: the traces are too gentle", refusedBy[a.Name()], a.Name())
		}
	}
	t.Logf("refusals by algorithm: %v; longest log: %d entries", refusedBy, maxLog-1)
	if maxLog-1 <= 2*32 {
		t.Errorf("the logs never outgrew two chunks (%d entries)", maxLog-1)
	}
}

// randomCost returns a cost in [1, capacity], mostly small, occasionally
// large or just above the capacity.
func randomCost(rng *rand.Rand, capacity int64) int64 {
	switch x := rng.IntN(100); {
	case x < 60:
		return 1
	case x < 85:
		return 1 + rng.Int64N(min(capacity, 4))
	case x < 97:
		return 1 + rng.Int64N(capacity)
	case x < 99:
		return capacity
	default:
		return capacity + 1
	}
}
