package core_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/limitry/ratelimit/core"
)

// A Limiter with a token bucket of 3 requests per second. The fake clock
// makes the output deterministic; production code leaves the clock out.
func Example() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	limiter, err := core.New(core.PerSecond(3).Named("api"), core.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 4; i++ {
		d, _ = limiter.Allow(ctx, "alice")
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	clock.Advance(d.RetryAfter)
	d, _ = limiter.Allow(ctx, "alice")
	fmt.Printf("after waiting RetryAfter: allowed=%v\n", d.Allowed)
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=333.333334ms
	// after waiting RetryAfter: allowed=true
}

// A layered batch: a request is charged to its IP's quota and its user's
// quota together, or to neither.
func ExampleLimiter_Take() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	perUser := core.MustPolicy(core.Rule{Name: "per-user", Limit: 2, Window: time.Minute})
	limiter := core.Must(core.NewWithPolicy(nil, core.WithClock(clock)))

	var out [2]core.Decision
	for i := 0; i < 3; i++ {
		ok, _ := limiter.Take(context.Background(), []core.Request{
			{Policy: perIP, Key: "203.0.113.7", Cost: 1},
			{Policy: perUser, Key: "alice", Cost: 1},
		}, out[:])
		fmt.Printf("admitted=%v per-ip remaining=%d per-user allowed=%v\n", ok, out[0].Remaining, out[1].Allowed)
	}
	// Output:
	// admitted=true per-ip remaining=9 per-user allowed=true
	// admitted=true per-ip remaining=8 per-user allowed=true
	// admitted=false per-ip remaining=8 per-user allowed=false
}

// Tiers through a Resolver: customers on the pro plan get a larger quota,
// everyone else the Limiter's default.
func ExampleTiers() {
	plans := map[string]string{"acme": "pro"}
	tiers, err := core.Tiers(func(_ context.Context, key string) string {
		return plans[key]
	}, map[string]core.Rule{
		"pro": {Name: "pro", Limit: 100, Window: time.Minute},
	})
	if err != nil {
		panic(err)
	}
	limiter := core.Must(core.New(core.Rule{Name: "free", Limit: 10, Window: time.Minute}, core.WithResolver(tiers)))
	for _, key := range []string{"acme", "bob"} {
		d, _ := limiter.Allow(context.Background(), key)
		fmt.Printf("%s: %s, remaining %d\n", key, d.Policy.Name(), d.Remaining)
	}
	// Output:
	// acme: pro, remaining 99
	// bob: free, remaining 9
}

// lifetime is a custom algorithm: a budget of Limit units that never
// refills (a trial account's allowance). It keeps the units used in
// register A of the State.
type lifetime struct{}

func (lifetime) Name() string                           { return "lifetime" }
func (lifetime) Validate(core.Rule) error               { return nil }
func (lifetime) Capacity(r core.Rule) int64             { return r.Limit }
func (lifetime) Expiry(*core.Policy, *core.State) int64 { return 1<<63 - 1 } // never forget

func (lifetime) Decide(p *core.Policy, s *core.State, cost, now int64, commit bool, d *core.Decision) {
	*d = core.Decision{Limit: p.Capacity(), Policy: p}
	if s.A+cost <= p.Capacity() {
		d.Allowed = true
		if commit {
			s.A += cost
		}
		d.Remaining = p.Capacity() - s.A
		if !commit {
			d.Remaining -= cost
		}
		return
	}
	d.Remaining = p.Capacity() - s.A
	d.RetryAfter = time.Duration(1<<63 - 1) // never, as far as a Duration can say
}

// A custom Algorithm plugs into the memory store like a built-in one.
func ExampleAlgorithm() {
	limiter := core.Must(core.New(core.Rule{Name: "trial", Algorithm: lifetime{}, Limit: 3, Window: time.Hour}))
	for i := 0; i < 4; i++ {
		d, _ := limiter.Allow(context.Background(), "new-customer")
		fmt.Printf("allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	}
	// Output:
	// allowed=true remaining=2
	// allowed=true remaining=1
	// allowed=true remaining=0
	// allowed=false remaining=0
}

// The memory store with an explicit capacity, and KeepActive so that a
// flood of new keys cannot release a client that is over its limit.
func ExampleNewMemoryStore() {
	store, err := core.NewMemoryStore(&core.MemoryConfig{Capacity: 50_000, KeepActive: true})
	if err != nil {
		panic(err)
	}
	limiter := core.Must(core.New(core.PerMinute(60), core.WithStore(store)))
	d, _ := limiter.Allow(context.Background(), "198.51.100.1")
	fmt.Println(d.Allowed, store.Len())
	// Output: true 1
}

// Rules for configuration files: algorithms by name, validated up front.
func ExampleParseAlgorithm() {
	alg, err := core.ParseAlgorithm("sliding_window_counter")
	if err != nil {
		panic(err)
	}
	_, err = core.NewPolicy(core.Rule{Name: "search", Algorithm: alg, Limit: 0, Window: time.Minute})
	fmt.Println(err)
	// Output: ratelimit: invalid rule "search": Limit must be positive, got 0
}

// Two rules that share a Name share a store's records; Identity says
// whether they read them alike. A change of algorithm or parameters
// carries the units in use over to the new rule.
func ExamplePolicy_Identity() {
	store := core.MustMemoryStore(nil)
	old := core.MustPolicy(core.Rule{Name: "api", Limit: 5, Window: 10 * time.Minute})
	bigger := core.MustPolicy(core.Rule{Name: "api", Limit: 10, Window: 10 * time.Minute, Algorithm: core.FixedWindow})
	fmt.Println(old.Identity())
	fmt.Println(bigger.Identity())

	now := time.Unix(1_800_000_000, 0)
	out := make([]core.Decision, 1)
	_ = store.Take(context.Background(), now, []core.Request{{Policy: old, Key: "alice", Cost: 3}}, out)
	fmt.Println("under the old rule:", out[0].Remaining, "of", out[0].Limit)
	_ = store.Take(context.Background(), now, []core.Request{{Policy: bigger, Key: "alice", Cost: 1}}, out)
	fmt.Println("under the new rule:", out[0].Remaining, "of", out[0].Limit)
	// Output:
	// token_bucket;l=5;w=600000000000;c=5
	// fixed_window;l=10;w=600000000000;c=10
	// under the old rule: 2 of 5
	// under the new rule: 6 of 10
}

// microsStore stands for a store that decides only windows of whole
// microseconds, as the Redis store does: it says so through
// core.PolicyChecker, so that Limiters refuse other rules when built.
type microsStore struct{ *core.MemoryStore }

func (microsStore) CheckPolicy(p *core.Policy) error {
	if p.Window()%time.Microsecond != 0 {
		return fmt.Errorf("micros store: policy %q: %w", p.Name(), core.ErrUnsupportedPolicy)
	}
	return nil
}

func ExamplePolicyChecker() {
	store := core.WithStore(microsStore{core.MustMemoryStore(nil)})
	_, err := core.New(core.Rule{Name: "api", Limit: 10, Window: time.Second / 3}, store)
	fmt.Println(err, errors.Is(err, core.ErrUnsupportedPolicy))
	_, err = core.New(core.Rule{Name: "api", Limit: 10, Window: time.Second}, store)
	fmt.Println(err)
	// Output:
	// micros store: policy "api": ratelimit: the store cannot decide this policy true
	// <nil>
}

// A request that read the clock just before a fixed window ended reaches
// the store after the next window's requests have used its quota: it is
// decided in that window, as at its start, so it finds no room, and the
// next window's count stays as it was. Its Retry-After counts from its own
// time.
func ExampleClockTolerance() {
	store := core.MustMemoryStore(nil)
	policy := core.MustPolicy(core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 2, Window: time.Second})
	ctx := context.Background()
	take := func(at time.Time) core.Decision {
		var out [1]core.Decision
		if err := store.Take(ctx, at, []core.Request{{Policy: policy, Key: "client", Cost: 1}}, out[:]); err != nil {
			panic(err)
		}
		return out[0]
	}
	next := time.Unix(1_700_000_001, 0) // a window starts
	take(next)
	take(next)
	late := take(next.Add(-10 * time.Millisecond)) // read before the window started
	fmt.Println("late request:", late.Allowed, late.RetryAfter)
	fmt.Println("then:", take(next.Add(time.Millisecond)).Allowed)
	// Output:
	// late request: false 1.01s
	// then: false
}
