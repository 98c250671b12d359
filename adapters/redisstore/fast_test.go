package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// scriptVariant composes the take script from parts, plus tail.
func scriptVariant(parts []string, tail string) *boxedScript {
	src := composeScript(parts) + tail
	return newBoxedScript(src)
}

func without(parts []string, name string) []string {
	var out []string
	for _, p := range parts {
		if p != name {
			out = append(out, p)
		}
	}
	return out
}

var (
	// fullPathScript is the take script without fast.lua: every request
	// goes through main.lua and the algorithm modules.
	fullPathScript = scriptVariant(without(luaParts, "lua/fast.lua"), "")
	// fastOnlyScript is the take script up to the end of fast.lua: what
	// the fast path does not decide is answered with an error.
	fastOnlyScript = scriptVariant([]string{"lua/prelude.lua", "lua/fast.lua"}, "return redis.error_reply('ERR fell through')\n")
)

// testTakeScript, if set, is the take script of the stores newStore makes.
var testTakeScript *boxedScript

// TestFullPath runs the differential, identity and clock tests with every
// request decided by main.lua's batch path (no fast path): the reference
// TestFastPathMatchesFullPath compares the fast path against.
func TestFullPath(t *testing.T) {
	testTakeScript = fullPathScript
	defer func() { testTakeScript = nil }()
	t.Run("Differential", TestDifferential)
	t.Run("IdentityCarryOver", TestIdentityCarryOver)
	t.Run("IdentityNeverCredits", TestIdentityNeverCredits)
	t.Run("IdentityTwoStores", TestIdentityTwoStores)
	t.Run("IdentityUntagged", TestIdentityUntagged)
	t.Run("ClockBack", TestClockBack)
	t.Run("NeverSeenKeyWhole", TestNeverSeenKeyWhole)
	t.Run("ExpiryExact", TestExpiryExact)
	t.Run("WindowKeepsExpiry", TestWindowKeepsExpiry)
}

// TestFastPathMatchesFullPath replays a random trace of single requests
// (token and leaky buckets and fixed windows, several policies sharing a
// name so records change policy, clocks stepping back, records without an
// identity tag and foreign values) against two stores on one server:
// one deciding on the fast path alone (falling back to the full script,
// as the take script does, only when the fast path declines), the other
// on the full path alone. Decisions and the records written must be
// equal, and the fast path must have decided most requests of each
// algorithm, refusals, stepped-back clocks and untagged records
// included, while declining every record of another policy, and the
// requests of a wide quota whose arithmetic reaches 2^53 without a whole
// emission interval (left to muldiv).
func TestFastPathMatchesFullPath(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	st := replayFastVsFull(t, client, storetest.T0, 7, 4000)
	t.Logf("decided by the fast path: %v (%d refused, %d with the clock stepped back, %d on untagged records); declined: %v, and %d of the wide buckets", st.decided, st.refused, st.back, st.untagged, st.declined, st.wide)
	for _, a := range []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow} {
		if st.decided[a.Name()] < st.declined[a.Name()] || st.decided[a.Name()] < 100 {
			t.Errorf("the fast path decided %d %s requests and declined %d", st.decided[a.Name()], a.Name(), st.declined[a.Name()])
		}
		if st.declined[a.Name()] == 0 {
			t.Errorf("the fast path never declined a %s request (records of another policy)", a.Name())
		}
	}
	if st.decided[core.SlidingWindowCounter.Name()] != 0 {
		t.Errorf("the fast path decided %d sliding window counter requests", st.decided[core.SlidingWindowCounter.Name()])
	}
	if st.refused < 50 || st.back < 50 || st.foreign != 0 {
		t.Errorf("fast path: %d refusals, %d with the clock stepped back (want 50 or more each), %d foreign values (want 0)", st.refused, st.back, st.foreign)
	}
	if st.untagged < 10 {
		t.Errorf("the fast path decided %d requests on untagged records, want 10 or more", st.untagged)
	}
	if st.wide < 10 {
		t.Errorf("the fast path declined %d requests of the wide buckets, want 10 or more (their arithmetic reaching 2^53)", st.wide)
	}
}

// TestFastPathMatchesFullPathAtExtremes replays shorter traces from
// times before 1970 and near the ends of the range the stores decide in,
// where window indexes are negative or large.
func TestFastPathMatchesFullPathAtExtremes(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	for i, base := range []time.Time{
		time.Unix(0, 0),
		time.Unix(-3_000_000_000, 123_456_000),
		time.Unix(0, core.MinTime).Add(time.Hour),
		time.Unix(0, core.MaxTime).Add(-4 * 24 * time.Hour),
	} {
		t.Run(base.UTC().Format(time.RFC3339), func(t *testing.T) {
			replayFastVsFull(t, client, base, uint64(i+1), 1000)
		})
	}
}

// fastStats counts what the fast path did in a replay.
type fastStats struct {
	decided, declined                map[string]int // per algorithm
	refused, back, foreign, untagged int
	// wide counts the requests of the buckets of wide quotas (tb-huge,
	// tb-wide) declined, which declined counts not: tb-huge's whose
	// arithmetic reaches 2^53 (its emission interval is not whole, so
	// fast.lua leaves them to muldiv), and foreign values.
	wide int
}

// replayFastVsFull replays steps random single requests from base (seeded
// with seed) against a fast-path-only store and a full-path-only store,
// failing t at the first decision or record that differs.
func replayFastVsFull(t *testing.T, client *redis.Client, base time.Time, seed uint64, steps int) fastStats {
	t.Helper()
	ctx := context.Background()
	fast := newStore(t, client, &Config{ClientTime: true})
	full := newStore(t, client, &Config{ClientTime: true})
	fast.script, full.script = fastOnlyScript, fullPathScript

	day := 24 * time.Hour
	rules := []core.Rule{
		{Name: "a", Algorithm: core.TokenBucket, Limit: 5, Window: 10 * time.Second},
		{Name: "a", Algorithm: core.FixedWindow, Limit: 5, Window: 10 * time.Second},
		{Name: "a", Algorithm: core.FixedWindow, Limit: 7, Window: 3001 * time.Millisecond},
		{Name: "a", Algorithm: core.LeakyBucket, Limit: 5, Window: 3 * time.Second, Burst: 2, MaxDelay: 1700 * time.Millisecond},
		{Name: "a", Algorithm: core.SlidingWindowCounter, Limit: 4, Window: 10 * time.Second},
		{Name: "fw", Algorithm: core.FixedWindow, Limit: 4, Window: 2333 * time.Millisecond},
		{Name: "fw-huge", Algorithm: core.FixedWindow, Limit: 1 << 50, Window: core.MaxWindow},
		{Name: "fw-day", Algorithm: core.FixedWindow, Limit: 1_000_000, Window: day},
		{Name: "lb", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second},
		{Name: "lb-shape", Algorithm: core.LeakyBucket, Limit: 5, Window: 3 * time.Second, Burst: 2, MaxDelay: 1700 * time.Millisecond},
		{Name: "tb", Algorithm: core.TokenBucket, Limit: 3, Window: 7 * time.Second},
		{Name: "tb-huge", Algorithm: core.TokenBucket, Limit: 1 << 50, Window: core.MaxWindow},
		{Name: "tb-wide", Algorithm: core.TokenBucket, Limit: 1_000_000, Window: day},
	}
	var policies []*core.Policy
	for _, r := range rules {
		policies = append(policies, mustPolicy(t, r))
	}
	keys := []string{"k1", "k2", "{k3}"}
	keyOf := func(s *Store, p *core.Policy, k string) string {
		return redisKey(s.prefix, p.Name(), tagOf(s, p.Name(), k), &core.Request{Key: k})
	}
	// record returns what key holds, in a comparable form.
	record := func(key string) string {
		switch typ := client.Type(ctx, key).Val(); typ {
		case "none":
			return "none"
		case "string":
			if client.PTTL(ctx, key).Val() <= 0 {
				return "string without expiry: " + client.Get(ctx, key).Val()
			}
			return client.Get(ctx, key).Val()
		default:
			return typ
		}
	}

	rng := rand.New(rand.NewPCG(seed, 13))
	at, maxAt := base, base
	decided := map[string]int{}  // by the fast path, per algorithm
	declined := map[string]int{} // by the fast path, per algorithm
	var fastRefused, fastBack, fastForeign, fastUntagged, fastWide int
	for step := range steps {
		switch x := rng.IntN(100); {
		case x < 45:
		case x < 75:
			at = at.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		case x < 85:
			at = at.Add(time.Duration(rng.IntN(60_000)) * time.Millisecond)
		case x < 88:
			at = at.Add(time.Duration(rng.Int64N(int64(3 * day))))
		case x < 97:
			at = at.Add(-time.Duration(rng.IntN(25_000)) * time.Millisecond)
		default:
			at = at.Add(-time.Duration(rng.Int64N(int64(2 * day))))
		}
		back := at.Before(maxAt)
		if at.After(maxAt) {
			maxAt = at
		}
		p := policies[rng.IntN(len(policies))]
		k := keys[rng.IntN(len(keys))]
		// Now and then, the same record without an identity tag, or a
		// foreign value, under both stores.
		foreign, untagged := false, false
		if x := rng.IntN(100); x < 3 {
			var v string
			us := at.UnixMicro()
			switch x {
			case 0:
				w := p.Window().Microseconds()
				// the current window, the one before, or one ahead
				idx := us / w
				if us%w < 0 {
					idx--
				}
				v = fmt.Sprintf("f:%d:%d", idx+1-int64(rng.IntN(3)), rng.IntN(9))
			case 1:
				v = fmt.Sprintf("g:%d:0", us+int64(rng.IntN(5_000_000)))
			default:
				v, foreign = "not a record", true
			}
			untagged = !foreign
			for _, s := range []*Store{fast, full} {
				client.Set(ctx, keyOf(s, p, k), v, time.Hour)
			}
		}
		cost := randomCost(rng, p.Capacity())
		req := []core.Request{{Policy: p, Key: k, Cost: cost}}
		var got, want [1]core.Decision
		alg := p.Algorithm().Name()
		gerr := fast.Take(ctx, at, req, got[:])
		if gerr != nil && strings.Contains(gerr.Error(), "fell through") {
			if name := p.Name(); name == "tb-huge" || name == "tb-wide" {
				fastWide++
			} else {
				declined[alg]++
			}
			fast.script = takeLua
			gerr = fast.Take(ctx, at, req, got[:])
			fast.script = fastOnlyScript
		} else if gerr == nil {
			decided[alg]++
			if !got[0].Allowed {
				fastRefused++
			}
			if back {
				fastBack++
			}
			if foreign {
				fastForeign++
			}
			if untagged {
				fastUntagged++
			}
		}
		werr := full.Take(ctx, at, req, want[:])
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("step %d: fast path err %v, full path err %v", step, gerr, werr)
		}
		if got != want {
			t.Fatalf("step %d at %v (%s key %q cost %d):\nfast %+v\nfull %+v", step, at.UTC(), p, k, cost, got[0], want[0])
		}
		if g, w := record(keyOf(fast, p, k)), record(keyOf(full, p, k)); g != w {
			t.Fatalf("step %d at %v (%s key %q cost %d): fast path wrote %q, full path %q", step, at.UTC(), p, k, cost, g, w)
		}
	}
	return fastStats{decided: decided, declined: declined, refused: fastRefused, back: fastBack, foreign: fastForeign, untagged: fastUntagged, wide: fastWide}
}

// TestFastPathWideBuckets decides buckets whose arithmetic reaches 2^53
// (cap x Window near 2^53 microseconds) with random costs and times, with
// the take script, the full path alone and core.MemoryStore: the same
// decisions and records. A bucket whose emission interval Window/Limit is
// whole (a million a day) stays on the fast path whatever its products;
// the others fall through to muldiv's wide arithmetic when a product
// reaches 2^53.
func TestFastPathWideBuckets(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	ctx := context.Background()
	const w53 = 1 << 33 // microseconds: cap 2^20 x w53 = 2^53
	type wideRule struct {
		core.Rule
		whole bool // Window/Limit is a whole number of microseconds: never falls through
		falls bool // some requests of the trace reach muldiv's wide arithmetic
	}
	rules := []wideRule{
		{core.Rule{Name: "pow2", Algorithm: core.TokenBucket, Limit: 1 << 20, Window: w53 * time.Microsecond}, true, false},
		{core.Rule{Name: "daily", Algorithm: core.TokenBucket, Limit: 1_000_000, Window: 24 * time.Hour}, true, false},
		{core.Rule{Name: "monthly", Algorithm: core.LeakyBucket, Limit: 100_000, Window: 30 * 24 * time.Hour, Burst: 50_000, MaxDelay: time.Hour}, true, false},
		{core.Rule{Name: "below", Algorithm: core.TokenBucket, Limit: 1<<20 + 3, Window: (w53 - 1) * time.Microsecond}, false, true},
		{core.Rule{Name: "above", Algorithm: core.TokenBucket, Limit: 1<<20 - 3, Window: (w53 + 17) * time.Microsecond}, false, false},
		{core.Rule{Name: "shaping", Algorithm: core.LeakyBucket, Limit: 1<<20 + 1, Window: (w53 + 1) * time.Microsecond, Burst: 1 << 20, MaxDelay: 3 * time.Second}, false, true},
	}
	fell := map[string]int{}
	for bi, base := range []time.Time{storetest.T0, time.Unix(-3_000_000_000, 123_456_000)} {
		for _, r := range rules {
			p := mustPolicy(t, r.Rule)
			take := newStore(t, client, &Config{ClientTime: true})
			full := newStore(t, client, &Config{ClientTime: true})
			full.script = fullPathScript
			ms := core.MustMemoryStore(nil)
			rng := rand.New(rand.NewPCG(uint64(bi), 5))
			at, c := base, p.Capacity()
			for step := range 150 {
				switch x := rng.IntN(10); {
				case x < 4:
				case x < 7:
					at = at.Add(time.Duration(rng.Int64N(int64(time.Hour))).Truncate(time.Microsecond))
				default:
					at = at.Add(time.Duration(rng.Int64N(int64(200 * time.Hour))).Truncate(time.Microsecond))
				}
				cost := []int64{1, c, c - rng.Int64N(4), 1 + rng.Int64N(c), 1 + rng.Int64N(8)}[rng.IntN(5)]
				req := []core.Request{{Policy: p, Key: "k", Cost: cost}}
				var got, want, mem [1]core.Decision
				take.script = fastOnlyScript
				err := take.Take(ctx, at, req, got[:])
				if err != nil && strings.Contains(err.Error(), "fell through") {
					fell[r.Name]++
					take.script = takeLua
					err = take.Take(ctx, at, req, got[:])
				}
				if err != nil {
					t.Fatalf("%s step %d: %v", r.Name, step, err)
				}
				if err := full.Take(ctx, at, req, want[:]); err != nil {
					t.Fatal(err)
				}
				if err := ms.Take(ctx, at, req, mem[:]); err != nil {
					t.Fatal(err)
				}
				m := mem[0]
				m.RetryAfter, m.ResetAfter, m.Delay = ceilMicro(m.RetryAfter), ceilMicro(m.ResetAfter), ceilMicro(m.Delay)
				if got[0] != want[0] || got[0] != m {
					t.Fatalf("%s step %d at %v cost %d:\ntake   %+v\nfull   %+v\nmemory %+v", r.Name, step, at.UTC(), cost, got[0], want[0], m)
				}
				kt := redisKey(take.prefix, p.Name(), tagOf(take, p.Name(), "k"), &core.Request{Key: "k"})
				kf := redisKey(full.prefix, p.Name(), tagOf(full, p.Name(), "k"), &core.Request{Key: "k"})
				if vt, vf := client.Get(ctx, kt).Val(), client.Get(ctx, kf).Val(); vt != vf {
					t.Fatalf("%s step %d: the take script wrote %q, the full path %q", r.Name, step, vt, vf)
				}
			}
		}
	}
	for _, r := range rules {
		if r.whole && fell[r.Name] > 0 {
			t.Errorf("%s: a whole emission interval, yet %d requests fell through", r.Name, fell[r.Name])
		}
		if r.falls && fell[r.Name] == 0 {
			t.Errorf("%s: no request reached muldiv's wide arithmetic", r.Name)
		}
	}
	t.Logf("fell through: %v", fell)
}
