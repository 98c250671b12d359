package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

func TestLimiterAllow(t *testing.T) {
	clk := core.NewFakeClock(t0)
	rec := &recorder{}
	l := core.Must(core.New(core.Rule{Name: "a", Limit: 2, Window: time.Second}, core.WithClock(clk), core.WithObserver(rec)))
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := l.Allow(ctx, "k")
		if err != nil || d.Allowed != want {
			t.Fatalf("request %d: %+v %v, want allowed=%v", i, d, err, want)
		}
	}
	clk.Advance(500 * time.Millisecond)
	if d, _ := l.Allow(ctx, "k"); !d.Allowed {
		t.Fatal("half a second refills one token")
	}
	if _, err := l.AllowN(ctx, "k", 0); !errors.Is(err, core.ErrInvalidCost) {
		t.Fatalf("cost 0: %v", err)
	}
	d, err := l.AllowN(ctx, "k", 3)
	if !errors.Is(err, core.ErrCostExceedsCapacity) || d.Allowed || d.RetryAfter != 0 {
		t.Fatalf("cost 3: %+v %v", d, err)
	}
	if len(rec.decisions) != 5 {
		t.Fatalf("observer saw %d decisions, want 5", len(rec.decisions))
	}
	if e := rec.decisions[2]; e.Key != "k" || e.Decision.Allowed || e.Admitted || e.DryRun {
		t.Fatalf("third event: %+v", e)
	}
	if l.Policy().Name() != "a" || l.Clock() != core.Clock(clk) || l.Observer() != core.Observer(rec) || l.DryRun() {
		t.Fatal("accessors")
	}
}

func TestLimiterTiers(t *testing.T) {
	tiers, err := core.Tiers(func(_ context.Context, key string) string {
		if key == "acme" {
			return "pro"
		}
		return ""
	}, map[string]core.Rule{"pro": {Name: "pro", Limit: 3, Window: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	l := core.Must(core.New(core.Rule{Name: "free", Limit: 1, Window: time.Minute}, core.WithResolver(tiers), core.WithClock(core.NewFakeClock(t0))))
	count := func(key string) int {
		n := 0
		for i := 0; i < 5; i++ {
			if d, err := l.Allow(context.Background(), key); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				n++
			}
		}
		return n
	}
	if n := count("acme"); n != 3 {
		t.Errorf("pro tier admitted %d, want 3", n)
	}
	if n := count("someone"); n != 1 {
		t.Errorf("free tier admitted %d, want 1", n)
	}
	if _, err := core.Tiers(func(context.Context, string) string { return "" }, map[string]core.Rule{"bad": {}}); !errors.Is(err, core.ErrInvalidRule) {
		t.Errorf("invalid tier rule: %v", err)
	}
	if _, err := core.Tiers(nil, nil); err == nil {
		t.Error("nil tierOf accepted")
	}
	// The empty tier name means the default policy: a tier of that name
	// would contradict it.
	if _, err := core.Tiers(func(context.Context, string) string { return "" }, map[string]core.Rule{"": core.PerMinute(1).Named("anon")}); err == nil || !strings.Contains(err.Error(), `a tier named ""`) {
		t.Errorf("a tier named \"\": %v, want an error", err)
	}
}

func TestLimiterWithoutPolicy(t *testing.T) {
	l := core.Must(core.NewWithPolicy(nil))
	if _, err := l.Allow(context.Background(), "k"); !errors.Is(err, core.ErrNoPolicy) {
		t.Fatalf("err = %v", err)
	}
	boom := errors.New("boom")
	l = core.Must(core.New(core.PerSecond(1), core.WithResolver(core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return nil, boom }))))
	if _, err := l.Allow(context.Background(), "k"); !errors.Is(err, boom) {
		t.Fatalf("resolver error lost: %v", err)
	}
}

type failingStore struct{ err error }

func (f failingStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return f.err
}

func TestLimiterStoreErrorObserved(t *testing.T) {
	rec := &recorder{}
	boom := errors.New("backend down")
	l := core.Must(core.New(core.PerSecond(1), core.WithStore(failingStore{boom}), core.WithObserver(rec)))
	if _, err := l.Allow(context.Background(), "k"); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if len(rec.errs) != 1 || !errors.Is(rec.errs[0].Err, boom) || len(rec.errs[0].Policies) != 1 {
		t.Fatalf("error events: %+v", rec.errs)
	}
}

// ctxStore fails a Take with its context's error, as a store whose call
// the caller's context ended does.
type ctxStore struct{}

func (ctxStore) Take(ctx context.Context, _ time.Time, _ []core.Request, _ []core.Decision) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestLimiterCallerGoneNotObserved: a store error met once the caller's
// context has ended (its client went away) is no store failure: the
// Observer does not hear of it.
func TestLimiterCallerGoneNotObserved(t *testing.T) {
	rec := &recorder{}
	l := core.Must(core.New(core.PerSecond(1), core.WithStore(ctxStore{}), core.WithObserver(rec)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if len(rec.errs) != 0 {
		t.Fatalf("error events for a caller gone: %+v", rec.errs)
	}
	// Errors the context did not cause are reported as ever, a refusal
	// for a cost above the capacity as a decision.
	l2 := core.Must(core.New(core.PerSecond(1), core.WithObserver(rec)))
	if _, err := l2.AllowN(ctx, "k", 5); !errors.Is(err, core.ErrCostExceedsCapacity) {
		t.Fatalf("err = %v", err)
	}
	if len(rec.decisions) != 1 || rec.decisions[0].Decision.Allowed {
		t.Fatalf("a refusal for a cost above the capacity, the context ended: decisions %+v", rec.decisions)
	}
}

func TestLimiterDryRunAndBatch(t *testing.T) {
	rec := &recorder{}
	l := core.Must(core.NewWithPolicy(nil, core.WithDryRun(), core.WithObserver(rec), core.WithClock(core.NewFakeClock(t0))))
	a := core.MustPolicy(core.Rule{Name: "a", Limit: 5, Window: time.Minute})
	b := core.MustPolicy(core.Rule{Name: "b", Limit: 1, Window: time.Minute})
	reqs := []core.Request{{Policy: a, Key: "ip", Cost: 1}, {Policy: b, Key: "user", Cost: 1}}
	out := make([]core.Decision, 2)
	for i, want := range []bool{true, false} {
		ok, err := l.Take(context.Background(), reqs, out)
		if err != nil || ok != want {
			t.Fatalf("batch %d: ok=%v err=%v", i, ok, err)
		}
	}
	last := rec.decisions[len(rec.decisions)-2:]
	if !last[0].DryRun || last[0].Admitted || !last[0].Decision.Allowed || last[1].Decision.Allowed {
		t.Fatalf("dry-run events: %+v", last)
	}
	if out[0].Remaining != 4 {
		t.Fatalf("refused batch charged layer a: Remaining %d, want 4", out[0].Remaining)
	}
}

// wrappedStore is a Store other than the MemoryStore (as a Redis store or
// a decorator is), with Peek.
type wrappedStore struct{ m *core.MemoryStore }

func (w wrappedStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return w.m.Take(ctx, now, reqs, out)
}

func (w wrappedStore) Peek(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return w.m.Peek(ctx, now, reqs, out)
}

// TestLimiterShortOutput: an out shorter than reqs is ErrShortOutput from
// Take and Peek, whatever the store, and charges nothing.
func TestLimiterShortOutput(t *testing.T) {
	ctx := context.Background()
	p := core.MustPolicy(core.PerMinute(10))
	reqs := []core.Request{{Policy: p, Key: "a", Cost: 1}, {Policy: p, Key: "b", Cost: 1}}
	for _, s := range []core.Store{core.MustMemoryStore(nil), wrappedStore{core.MustMemoryStore(nil)}} {
		l := core.Must(core.New(core.PerMinute(10), core.WithStore(s), core.WithClock(core.NewFakeClock(time.Unix(1_800_000_000, 0)))))
		short := make([]core.Decision, 1)
		if _, err := l.Take(ctx, reqs, short); !errors.Is(err, core.ErrShortOutput) {
			t.Fatalf("%T: Take: %v, want ErrShortOutput", s, err)
		}
		if _, err := l.Peek(ctx, reqs, short); !errors.Is(err, core.ErrShortOutput) {
			t.Fatalf("%T: Peek: %v, want ErrShortOutput", s, err)
		}
		out := make([]core.Decision, 2)
		if ok, err := l.Take(ctx, reqs, out); !ok || err != nil || out[0].Remaining != 9 || out[1].Remaining != 9 {
			t.Fatalf("%T: after the short calls: %v %v %+v, want nothing charged before", s, ok, err, out)
		}
	}
}

// pickyStore is a MemoryStore that cannot decide policies of Limit 13.
type pickyStore struct{ *core.MemoryStore }

func (pickyStore) CheckPolicy(p *core.Policy) error {
	if p.Limit() == 13 {
		return fmt.Errorf("picky store: %q: %w", p.Name(), core.ErrUnsupportedPolicy)
	}
	return nil
}

// TestLimiterPolicyTheStoreCannotDecide checks that New refuses a rule
// the store cannot decide (PolicyChecker), and NewWithPolicy one its
// Resolver lists, while CheckPolicies skips stores that cannot tell.
func TestLimiterPolicyTheStoreCannotDecide(t *testing.T) {
	store := core.WithStore(pickyStore{core.MustMemoryStore(nil)})
	if _, err := core.New(core.PerMinute(13), store); !errors.Is(err, core.ErrUnsupportedPolicy) {
		t.Fatalf("New: %v", err)
	}
	if _, err := core.New(core.PerMinute(12), store); err != nil {
		t.Fatalf("New of a rule the store decides: %v", err)
	}
	tiers, err := core.Tiers(func(context.Context, string) string { return "pro" }, map[string]core.Rule{"pro": core.PerMinute(13).Named("pro")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.NewWithPolicy(nil, store, core.WithResolver(tiers)); !errors.Is(err, core.ErrUnsupportedPolicy) {
		t.Fatalf("NewWithPolicy with a Resolver listing it: %v", err)
	}
	p13 := core.MustPolicy(core.PerMinute(13))
	if err := core.CheckPolicies(core.MustMemoryStore(nil), p13); err != nil {
		t.Fatalf("CheckPolicies on a store that decides every policy: %v", err)
	}
	if err := core.CheckPolicies(pickyStore{}, nil, core.MustPolicy(core.PerMinute(1)), p13); !errors.Is(err, core.ErrUnsupportedPolicy) {
		t.Fatalf("CheckPolicies: %v", err)
	}
}

// TestLimiterRefundFallbackCharge: a Limiter over a MemoryStore refuses a
// refund of a charge marked as a fallback's, as the MemoryStore does: it
// made no such charge.
func TestLimiterRefundFallbackCharge(t *testing.T) {
	clk := core.NewFakeClock(t0)
	l := core.Must(core.New(core.Rule{Name: "r", Algorithm: core.FixedWindow, Limit: 2, Window: time.Minute}, core.WithClock(clk)))
	for range 2 {
		if d, _ := l.Allow(context.Background(), "k"); !d.Allowed {
			t.Fatal("refused")
		}
	}
	if err := l.Refund(context.Background(), []core.Request{{Policy: l.Policy(), Key: "k", Cost: 1, Fallback: true}}); !errors.Is(err, core.ErrFallbackCharge) {
		t.Fatalf("Refund of a fallback's charge: %v", err)
	}
	if d, _ := l.Allow(context.Background(), "k"); d.Allowed {
		t.Fatal("a unit was given back")
	}
}

// TestLimiterObserverReports: a Limiter's Observer hears what the Limiter
// and its default store do: the store's evictions of keys that still held
// state, a Resolver's failure (a store failure to the caller), and a
// latency measured on the decision's clamped scale, 0 on a clock that does
// not move even when it reads outside [MinTime, MaxTime].
func TestLimiterObserverReports(t *testing.T) {
	ctx := context.Background()
	t.Run("default store evictions", func(t *testing.T) {
		rec := &recorder{}
		l := core.Must(core.New(core.Rule{Limit: 10, Window: time.Hour}, core.WithClock(core.NewFakeClock(t0)), core.WithObserver(rec)))
		st := l.Store().(*core.MemoryStore)
		for i := range st.Capacity() + 1000 {
			if _, err := l.Allow(ctx, fmt.Sprint("k", i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := st.Evictions(); n == 0 || uint64(len(rec.evictions)) != n {
			t.Fatalf("the default store evicted %d keys that held state; the Observer heard of %d", n, len(rec.evictions))
		}
	})
	t.Run("resolver failure", func(t *testing.T) {
		rec := &recorder{}
		boom := errors.New("tenant database down")
		res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return nil, boom })
		for _, p := range []*core.Policy{core.MustPolicy(core.PerSecond(10)), nil} {
			l := core.Must(core.NewWithPolicy(p, core.WithResolver(res), core.WithObserver(rec), core.WithClock(core.NewFakeClock(t0))))
			if _, err := l.Allow(ctx, "k"); !errors.Is(err, boom) {
				t.Fatalf("Allow: %v, want the Resolver's error", err)
			}
		}
		if len(rec.errs) != 2 || !errors.Is(rec.errs[0].Err, boom) || len(rec.errs[0].Policies) != 1 || len(rec.errs[1].Policies) != 0 {
			t.Fatalf("Observer heard %+v, want the Resolver's error twice, under the default policy and under none", rec.errs)
		}
		gone, cancel := context.WithCancel(ctx)
		cancel()
		caller := core.ResolverFunc(func(ctx context.Context, _ string) (*core.Policy, error) { return nil, ctx.Err() })
		l := core.Must(core.New(core.PerSecond(10), core.WithResolver(caller), core.WithObserver(rec)))
		if _, err := l.Allow(gone, "k"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Allow with a canceled context: %v", err)
		}
		if len(rec.errs) != 2 {
			t.Fatalf("a Resolver failing because its caller left was reported: %+v", rec.errs[2:])
		}
	})
	t.Run("latency on the clamped scale", func(t *testing.T) {
		for _, start := range []time.Time{{}, time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), t0} {
			rec := &recorder{}
			l := core.Must(core.New(core.PerSecond(10), core.WithClock(core.NewFakeClock(start)), core.WithObserver(rec)))
			if _, err := l.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if len(rec.decisions) != 1 || rec.decisions[0].Latency != 0 {
				t.Errorf("clock standing at %v: %+v, want one decision of Latency 0", start, rec.decisions)
			}
		}
	})
}
