package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// plainStore hides the MemoryStore's optional interfaces.
type plainStore struct{ s core.Store }

func (p plainStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return p.s.Take(ctx, now, reqs, out)
}

// noRefund is a custom algorithm without AlgorithmRefunder.
type noRefund struct{ core.Algorithm }

func (noRefund) Name() string { return "no_refund" }

func TestLimiterOpsUnsupported(t *testing.T) {
	l := core.Must(core.New(core.PerMinute(2), core.WithStore(plainStore{core.MustMemoryStore(nil)})))
	ctx := context.Background()
	reqs := []core.Request{{Policy: l.Policy(), Key: "k", Cost: 1}}
	if _, err := l.Peek(ctx, reqs, make([]core.Decision, 1)); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("Peek: %v, want ErrUnsupported", err)
	}
	if err := l.Refund(ctx, reqs); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("Refund: %v, want ErrUnsupported", err)
	}
	if err := l.Reset(ctx, nil, "k"); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("Reset: %v, want ErrUnsupported", err)
	}
	if err := core.Must(core.NewWithPolicy(nil)).Reset(ctx, nil, "k"); !errors.Is(err, core.ErrNoPolicy) {
		t.Errorf("Reset without a policy: %v, want ErrNoPolicy", err)
	}
}

// TestLimiterOpsThroughInterfaces runs the Limiter's operations on a store
// that is not the MemoryStore but implements every interface.
func TestLimiterOpsThroughInterfaces(t *testing.T) {
	type full struct {
		core.Store
		core.Peeker
		core.Resetter
		core.Refunder
	}
	m := core.MustMemoryStore(nil)
	clock := core.NewFakeClock(t0)
	l := core.Must(core.New(core.PerMinute(3), core.WithClock(clock), core.WithStore(full{m, m, m, m})))
	ctx := context.Background()
	p := l.Policy()
	reqs := []core.Request{{Policy: p, Key: "k", Cost: 2}}
	out := make([]core.Decision, 1)
	if ok, err := l.Take(ctx, reqs, out); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := l.Peek(ctx, reqs, out); ok || err != nil || out[0].Remaining != 1 {
		t.Fatalf("Peek of 2 with 1 left: %v %+v %v", ok, out[0], err)
	}
	if err := l.Refund(ctx, []core.Request{{Policy: p, Key: "k", Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Peek(ctx, reqs, out); !ok || err != nil || out[0].Remaining != 0 {
		t.Fatalf("Peek of 2 with 2 left: %v %+v %v", ok, out[0], err)
	}
	if err := l.Reset(ctx, nil, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowN(ctx, "k", 3); err != nil || !d.Allowed {
		t.Fatalf("after Reset: %+v %v", d, err)
	}
}

func TestRefundUnsupportedAlgorithm(t *testing.T) {
	m := core.MustMemoryStore(nil)
	custom := core.MustPolicy(core.Rule{Name: "custom", Algorithm: noRefund{core.FixedWindow}, Limit: 2, Window: time.Minute})
	std := core.MustPolicy(core.Rule{Name: "std", Algorithm: core.FixedWindow, Limit: 2, Window: time.Minute})
	ctx := context.Background()
	out := make([]core.Decision, 2)
	reqs := []core.Request{{Policy: std, Key: "k", Cost: 2}, {Policy: custom, Key: "k", Cost: 2}}
	if err := m.Take(ctx, t0, reqs, out); err != nil || !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("%+v %v", out, err)
	}
	if err := m.Refund(ctx, t0, reqs); !errors.Is(err, core.ErrRefundUnsupported) {
		t.Fatalf("Refund with a custom algorithm: %v, want ErrRefundUnsupported", err)
	}
	// Nothing was refunded, the built-in layer included.
	if err := m.Peek(ctx, t0, reqs[:1], out); err != nil || out[0].Allowed {
		t.Fatalf("std refunded by a failed batch: %+v %v", out[0], err)
	}
}

// TestPeekStoreFull: Peek predicts the ErrStoreFull that Take meets in a
// full KeepActive store, with the same RetryAfter, and charges nothing.
func TestPeekStoreFull(t *testing.T) {
	m := core.MustMemoryStore(&core.MemoryConfig{Capacity: 4, Shards: 1, KeepActive: true})
	p := core.MustPolicy(core.Rule{Name: "p", Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute})
	ctx := context.Background()
	out := make([]core.Decision, 1)
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := m.Take(ctx, t0, []core.Request{{Policy: p, Key: k, Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []core.Request{{Policy: p, Key: "e", Cost: 1}}
	peek := make([]core.Decision, 1)
	perr := m.Peek(ctx, t0.Add(time.Second), reqs, peek)
	terr := m.Take(ctx, t0.Add(time.Second), reqs, out)
	if !errors.Is(perr, core.ErrStoreFull) || !errors.Is(terr, core.ErrStoreFull) || peek[0] != out[0] {
		t.Fatalf("peek %+v %v\ntake %+v %v", peek[0], perr, out[0], terr)
	}
	if want := 59*time.Second + core.ClockTolerance; peek[0].RetryAfter != want {
		t.Fatalf("RetryAfter %v, want %v", peek[0].RetryAfter, want)
	}
	// A held key still peeks normally, and a peek stores nothing.
	if err := m.Peek(ctx, t0, []core.Request{{Policy: p, Key: "a", Cost: 4}}, peek); err != nil || !peek[0].Allowed {
		t.Fatalf("held key: %+v %v", peek[0], err)
	}
	if m.Len() != 4 {
		t.Fatalf("Len %d after peeks, want 4", m.Len())
	}
	// Once the window has passed, ClockTolerance ago, both find room.
	at := t0.Add(time.Minute + core.ClockTolerance)
	perr = m.Peek(ctx, at, reqs, peek)
	terr = m.Take(ctx, at, reqs, out)
	if perr != nil || terr != nil || peek[0] != out[0] || !out[0].Allowed {
		t.Fatalf("after the window: peek %+v %v, take %+v %v", peek[0], perr, out[0], terr)
	}
}

// TestResetForgetsKey: Reset removes the key from the store.
func TestResetForgetsKey(t *testing.T) {
	m := core.MustMemoryStore(nil)
	p := core.MustPolicy(core.PerMinute(1))
	out := make([]core.Decision, 1)
	m.Take(context.Background(), t0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out)
	if m.Len() != 1 {
		t.Fatal(m.Len())
	}
	if err := m.Reset(context.Background(), p, "k"); err != nil || m.Len() != 0 {
		t.Fatalf("Reset: %v, Len %d", err, m.Len())
	}
	if err := m.Reset(context.Background(), nil, "k"); err == nil {
		t.Fatal("Reset without a policy: no error")
	}
}

// TestPeekAllocations: peeking a held key allocates nothing.
func TestPeekAllocations(t *testing.T) {
	m := core.MustMemoryStore(nil)
	p := core.MustPolicy(core.PerMinute(100))
	reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	out := make([]core.Decision, 1)
	m.Take(context.Background(), t0, reqs, out)
	if n := testing.AllocsPerRun(100, func() { m.Peek(context.Background(), t0, reqs, out) }); n != 0 {
		t.Fatalf("Peek allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { m.Refund(context.Background(), t0, reqs) }); n != 0 {
		t.Fatalf("Refund allocates %v times", n)
	}
}

// TestRefundChargeAfterClockBack: a charge that has recovered, whose key a
// later charge holds, gives nothing back when it is refunded after the
// clock stepped back to before it, for every algorithm: the state is that
// of the later charge.
func TestRefundChargeAfterClockBack(t *testing.T) {
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0).Truncate(time.Hour)
	for _, rule := range []core.Rule{
		{Name: "tb", Limit: 2, Window: time.Minute},
		{Name: "fw", Limit: 2, Window: time.Minute, Algorithm: core.FixedWindow},
		{Name: "swc", Limit: 2, Window: time.Minute, Algorithm: core.SlidingWindowCounter},
		{Name: "log", Limit: 2, Window: time.Minute, Algorithm: core.SlidingWindowLog},
	} {
		t.Run(rule.Name, func(t *testing.T) {
			p := core.MustPolicy(rule)
			with, without := core.MustMemoryStore(nil), core.MustMemoryStore(nil)
			xAt := base.Add(10 * time.Second)
			take := func(m *core.MemoryStore, at time.Time, cost int64) bool {
				out := make([]core.Decision, 1)
				if err := m.Take(ctx, at, []core.Request{{Policy: p, Key: "k", Cost: cost}}, out); err != nil {
					t.Fatal(err)
				}
				return out[0].Allowed
			}
			if !take(with, xAt, 1) { // X, only in with
				t.Fatal("X refused")
			}
			yAt := base.Add(130 * time.Second) // X has gone; Y takes the whole quota
			if !take(with, yAt, 2) || !take(without, yAt, 2) {
				t.Fatal("Y refused")
			}
			back := base.Add(5 * time.Second) // the clock steps back to before X
			if err := with.Refund(ctx, back, []core.Request{{Policy: p, Key: "k", Cost: 1, ChargedAt: xAt}}); err != nil {
				t.Fatal(err)
			}
			for d := time.Duration(0); d <= 3*time.Minute; d += time.Second {
				now := back.Add(d)
				var o1, o2 [1]core.Decision
				r := []core.Request{{Policy: p, Key: "k", Cost: 1}}
				if err := with.Peek(ctx, now, r, o1[:]); err != nil && !errors.Is(err, core.ErrStoreFull) {
					t.Fatal(err)
				}
				if err := without.Peek(ctx, now, r, o2[:]); err != nil && !errors.Is(err, core.ErrStoreFull) {
					t.Fatal(err)
				}
				if o1[0].Allowed && !o2[0].Allowed {
					t.Fatalf("%v after the step back, the refund of X admits what the key without X refuses", d)
				}
			}
		})
	}
}

// TestChargeStartReadsDecisionAt: a Decision made on a store's own clock
// (Decision.At set) names its charge on that clock, whatever the time the
// caller gave the Take: a window's charge at At, a bucket's at At plus the
// units in use before it.
func TestChargeStartReadsDecisionAt(t *testing.T) {
	given := time.Unix(1_800_000_030, 0)  // 30 s into a minute
	server := given.Add(-3 * time.Second) // a store whose clock is 3 s behind the caller's
	win := core.MustPolicy(core.Rule{Name: "w", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	// Decided at the time given, the window ends 30 s after it.
	d := core.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 30 * time.Second, Policy: win}
	if got := win.ChargeStart(given, 1, d); !got.Equal(given) {
		t.Fatalf("without At: %v, want the time given %v", got, given)
	}
	// Decided on the store's clock, 33 s after At.
	d.ResetAfter, d.At = 33*time.Second, server
	if got := win.ChargeStart(given, 1, d); !got.Equal(server) {
		t.Fatalf("window with At: %v, want At %v", got, server)
	}
	tb := core.MustPolicy(core.Rule{Name: "b", Limit: 10, Window: time.Second}) // a unit per 100 ms
	// The tenth unit of a bucket, charged at At: it comes back 900 ms
	// after At, once the nine before it have.
	d = core.Decision{Allowed: true, Limit: 10, ResetAfter: time.Second, Policy: tb, At: server}
	if got, want := tb.ChargeStart(given, 1, d), server.Add(900*time.Millisecond); !got.Equal(want) {
		t.Fatalf("bucket with At: %v, want %v", got, want)
	}
	// A refused decision names no charge: At, the store's time, is still
	// the clock a refund would be read on.
	d = core.Decision{Allowed: false, Limit: 10, Policy: tb, At: server}
	if got := tb.ChargeStart(given, 1, d); !got.Equal(server) {
		t.Fatalf("refused with At: %v, want At %v", got, server)
	}
}

// TestChargeStartOfAnotherPolicysDecision: ChargeStart of a Decision
// another policy made names no charge of p: it returns the time given, from
// which a refund gives back less, never more. Named by such a Decision, a
// refund of a charge that has recovered gives nothing back.
func TestChargeStartOfAnotherPolicysDecision(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	p := core.MustPolicy(core.Rule{Name: "k", Limit: 10, Window: 10 * time.Second}) // a unit a second
	q := core.MustPolicy(core.Rule{Name: "q", Limit: 1, Window: time.Hour})
	store := core.MustMemoryStore(nil)
	out := make([]core.Decision, 1)
	if err := store.Take(ctx, t0, []core.Request{{Policy: q, Key: "x", Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	foreign := out[0] // ResetAfter an hour
	if got := p.ChargeStart(t0, 1, foreign); !got.Equal(t0) {
		t.Fatalf("ChargeStart of q's decision: %v after the time given, want the time given", got.Sub(t0))
	}
	// A charge under p at t0 has recovered by t0+2s; the bucket is then
	// drained, and a refund named by q's decision must not credit it.
	store.Take(ctx, t0, []core.Request{{Policy: p, Key: "z", Cost: 1}}, out)
	t2 := t0.Add(2 * time.Second)
	admitted := 0
	for range 11 {
		store.Take(ctx, t2, []core.Request{{Policy: p, Key: "z", Cost: 1}}, out)
		if out[0].Allowed {
			admitted++
		}
	}
	if err := store.Refund(ctx, t2, []core.Request{{Policy: p, Key: "z", Cost: 1, ChargedAt: p.ChargeStart(t0, 1, foreign)}}); err != nil {
		t.Fatal(err)
	}
	store.Take(ctx, t2, []core.Request{{Policy: p, Key: "z", Cost: 1}}, out)
	if out[0].Allowed {
		admitted++
	}
	if admitted != 10 {
		t.Fatalf("admitted %d at one instant under a bucket of 10 after refunding a recovered charge, want 10", admitted)
	}
}
