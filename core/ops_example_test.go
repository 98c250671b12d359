package core_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/limitry/ratelimit/core"
)

// Peek tells what a request would get without charging it, for a quota
// page or a pre-flight check.
func ExampleLimiter_Peek() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	limiter := core.Must(core.New(core.PerMinute(3).Named("api"), core.WithClock(clock)))
	ctx := context.Background()
	limiter.AllowN(ctx, "alice", 2)
	reqs := []core.Request{{Policy: limiter.Policy(), Key: "alice", Cost: 1}}
	out := make([]core.Decision, 1)
	for i := 0; i < 2; i++ {
		ok, _ := limiter.Peek(ctx, reqs, out)
		fmt.Printf("would admit: %v, remaining after it: %d\n", ok, out[0].Remaining)
	}
	d, _ := limiter.Allow(ctx, "alice")
	fmt.Printf("allow: %v, remaining %d\n", d.Allowed, d.Remaining)
	// Output:
	// would admit: true, remaining after it: 0
	// would admit: true, remaining after it: 0
	// allow: true, remaining 0
}

// PeekAt peeks at a time read from the Limiter's clock once, for callers
// that need it again.
func ExampleLimiter_PeekAt() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	limiter := core.Must(core.New(core.PerSecond(1).Named("api"), core.WithClock(clock)))
	ctx := context.Background()
	limiter.Allow(ctx, "alice")
	now := limiter.Clock().Now()
	out := make([]core.Decision, 1)
	ok, _ := limiter.PeekAt(ctx, now, []core.Request{{Policy: limiter.Policy(), Key: "alice", Cost: 1}}, out)
	fmt.Println(ok, "retry at", now.Add(out[0].RetryAfter).Sub(now))
	// Output: false retry at 1s
}

// Refund gives back what a request was charged, here a request that the
// application decided not to count.
func ExampleLimiter_Refund() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	limiter := core.Must(core.New(core.PerMinute(3).Named("api"), core.WithClock(clock)))
	ctx := context.Background()
	d, _ := limiter.Allow(ctx, "alice")
	fmt.Println("charged, remaining", d.Remaining)
	reqs := []core.Request{{Policy: limiter.Policy(), Key: "alice", Cost: 1}}
	if err := limiter.Refund(ctx, reqs); err != nil {
		panic(err)
	}
	d, _ = limiter.Allow(ctx, "alice")
	fmt.Println("after the refund, charged again, remaining", d.Remaining)
	// Output:
	// charged, remaining 2
	// after the refund, charged again, remaining 2
}

// RefundAt refunds at a time read from the Limiter's clock.
func ExampleLimiter_RefundAt() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	limiter := core.Must(core.New(core.PerMinute(2).Named("api"), core.WithClock(clock)))
	ctx := context.Background()
	limiter.AllowN(ctx, "alice", 2)
	err := limiter.RefundAt(ctx, clock.Now(), []core.Request{{Policy: limiter.Policy(), Key: "alice", Cost: 5}})
	fmt.Println(errors.Is(err, core.ErrCostExceedsCapacity))
	// Output: true
}

// Reset forgets a key, as after a successful login.
func ExampleLimiter_Reset() {
	clock := core.NewFakeClock(time.Unix(1_700_000_000, 0))
	logins := core.Must(core.New(core.PerHour(3).Named("login"), core.WithClock(clock)))
	ctx := context.Background()
	logins.AllowN(ctx, "alice", 3)
	d, _ := logins.Allow(ctx, "alice")
	fmt.Println("before reset:", d.Allowed)
	logins.Reset(ctx, nil, "alice")
	d, _ = logins.Allow(ctx, "alice")
	fmt.Println("after reset:", d.Allowed, d.Remaining)
	// Output:
	// before reset: false
	// after reset: true 2
}

// Refunds give back exactly what each algorithm charged, never more than
// the key has in use.
func ExampleMemoryStore_Refund() {
	store := core.MustMemoryStore(nil)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	for _, a := range core.Algorithms() {
		r := core.Rule{Name: a.Name(), Algorithm: a, Limit: 4, Window: time.Minute}
		if a == core.LeakyBucket {
			r.Burst = 4
		}
		p := core.MustPolicy(r)
		out := make([]core.Decision, 1)
		store.Take(ctx, now, []core.Request{{Policy: p, Key: "k", Cost: 3}}, out)
		store.Refund(ctx, now, []core.Request{{Policy: p, Key: "k", Cost: 2}})
		store.Peek(ctx, now, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
		fmt.Printf("%s: %d left after one more\n", a.Name(), out[0].Remaining)
	}
	// Output:
	// token_bucket: 2 left after one more
	// leaky_bucket: 2 left after one more
	// fixed_window: 2 left after one more
	// sliding_window_log: 2 left after one more
	// sliding_window_counter: 2 left after one more
}

// A refund that names the time of its charge (ChargedAt) gives back only
// what that charge still holds: here a charge made in the last second of a
// fixed window, refunded in the next one, gives back nothing, and the new
// window keeps the charge made in it meanwhile.
func ExampleRequest_chargedAt() {
	store := core.MustMemoryStore(nil)
	ctx := context.Background()
	p := core.MustPolicy(core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 2, Window: time.Minute})
	start := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	charged := start.Add(59 * time.Second) // a slow request, charged at 0:59
	out := make([]core.Decision, 1)
	store.Take(ctx, charged, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
	store.Take(ctx, start.Add(61*time.Second), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out) // 1:01
	// The slow request fails at 1:02 and is refunded.
	store.Refund(ctx, start.Add(62*time.Second), []core.Request{{Policy: p, Key: "k", Cost: 1, ChargedAt: charged}})
	store.Peek(ctx, start.Add(62*time.Second), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
	fmt.Println("left in the window of 1:00 after one more:", out[0].Remaining)
	// Output:
	// left in the window of 1:00 after one more: 0
}

// ChargeStart names, for a refund, when a charge began to give its units
// back: a bucket that was not full gives back the units charged before it
// first. Here a bucket of 10 a second (one unit per 100 ms) holds 9 units
// when X is charged; refunded 100 ms later, X still holds its whole unit.
func ExamplePolicy_ChargeStart() {
	store := core.MustMemoryStore(nil)
	ctx := context.Background()
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 10, Window: time.Second})
	at := time.Unix(1_800_000_000, 0)
	out := make([]core.Decision, 1)
	for range 9 {
		store.Take(ctx, at, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
	}
	store.Take(ctx, at, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out) // X
	start := p.ChargeStart(at, 1, out[0])
	fmt.Println("X gives its unit back from:", start.Sub(at))
	later := at.Add(100 * time.Millisecond)
	store.Refund(ctx, later, []core.Request{{Policy: p, Key: "k", Cost: 1, ChargedAt: start}})
	store.Peek(ctx, later, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
	fmt.Println("remaining after one more at 100ms:", out[0].Remaining)
	// Output:
	// X gives its unit back from: 900ms
	// remaining after one more at 100ms: 1
}

// Peek on a store decides a layered batch without charging it.
func ExampleMemoryStore_Peek() {
	store := core.MustMemoryStore(nil)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	perUser := core.MustPolicy(core.Rule{Name: "per-user", Limit: 1, Window: time.Minute})
	reqs := []core.Request{{Policy: perIP, Key: "192.0.2.1", Cost: 1}, {Policy: perUser, Key: "alice", Cost: 1}}
	out := make([]core.Decision, 2)
	store.Peek(ctx, now, reqs, out)
	fmt.Println("peek:", out[0].Allowed, out[1].Allowed)
	store.Take(ctx, now, reqs, out)
	store.Peek(ctx, now, reqs, out)
	fmt.Println("after a take:", out[0].Allowed, out[0].Remaining, out[1].Allowed)
	// Output:
	// peek: true true
	// after a take: true 9 false
}

// Reset on a store forgets one key under a policy's Name.
func ExampleMemoryStore_Reset() {
	store := core.MustMemoryStore(nil)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	p := core.MustPolicy(core.PerMinute(5).Named("api"))
	out := make([]core.Decision, 1)
	store.Take(ctx, now, []core.Request{{Policy: p, Key: "alice", Cost: 5}}, out)
	fmt.Println("keys:", store.Len())
	store.Reset(ctx, p, "alice")
	fmt.Println("keys after reset:", store.Len())
	// Output:
	// keys: 1
	// keys after reset: 0
}

// CheckRefund validates a refund batch for a Store implementation.
func ExampleCheckRefund() {
	p := core.MustPolicy(core.PerMinute(5).Named("api"))
	fmt.Println(core.CheckRefund([]core.Request{{Policy: p, Key: "a", Cost: 1}}))
	err := core.CheckRefund([]core.Request{{Policy: p, Key: "a", Cost: 1}, {Policy: p, Key: "a", Cost: 2}})
	fmt.Println(errors.Is(err, core.ErrDuplicateRequest))
	// Output:
	// <nil>
	// true
}
