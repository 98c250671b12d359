package ratelimit_test

import (
	"context"
	"testing"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// A Result built by hand from its exported fields (LayerResult{Key, Cost,
// Decision}) on a Limiter whose first layer is a concurrency layer is
// refunded: its layer is told by its policy's name, not read as layer 0.
func TestRefundHandBuiltBehindConcurrencyLayer(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{
		inFlightLayer(5),
		{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("per-ip")},
	})
	a := l.Decide(mwReq("192.0.2.1:1"))
	if !a.Proceed || len(a.Layers) != 2 {
		t.Fatalf("a: %+v", a)
	}
	a.Release()
	rl := a.Layers[1]
	hb := ratelimit.Result{Proceed: true, Layers: []ratelimit.LayerResult{{Key: rl.Key, Cost: rl.Cost, Decision: rl.Decision}}}
	if err := l.Refund(context.Background(), &hb); err != nil {
		t.Fatal(err)
	}
	b := l.Decide(mwReq("192.0.2.1:1"))
	b.Release()
	if !b.Proceed {
		t.Fatal("after refunding a hand-built Result of the rate layer, the next request is refused: nothing was refunded")
	}
}

// The same hand-built Result on a Limiter whose only layer is the rate
// layer is refunded.
func TestRefundHandBuiltRateLayerOnly(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("per-ip")},
	})
	a := l.Decide(mwReq("192.0.2.1:1"))
	rl := a.Layers[0]
	hb := ratelimit.Result{Proceed: true, Layers: []ratelimit.LayerResult{{Key: rl.Key, Cost: rl.Cost, Decision: rl.Decision}}}
	if err := l.Refund(context.Background(), &hb); err != nil {
		t.Fatal(err)
	}
	if !l.Decide(mwReq("192.0.2.1:1")).Proceed {
		t.Fatal("not refunded")
	}
}

// A hand-built layer of the second layer keeps its charge after Reset of
// that layer's key: the reset is looked up under its own layer's name, not
// layer 0's, and a refund would give back a unit charged after the reset.
func TestRefundHandBuiltAfterResetOfSecondLayer(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerHour(100).Named("a")},
		{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("b")},
	})
	x := l.Decide(mwReq("192.0.2.1:1"))
	lb := x.Layers[1]
	hb := ratelimit.Result{Proceed: true, Layers: []ratelimit.LayerResult{{Key: lb.Key, Cost: lb.Cost, Decision: lb.Decision}}}
	if err := l.Reset(context.Background(), "b", lb.Key); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	if l.Decide(mwReq("192.0.2.1:1")).Proceed { // y: the first request after the reset
		admitted++
	}
	if err := l.Refund(context.Background(), &hb); err != nil { // x's charge: reset since, must stay
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if l.Decide(mwReq("192.0.2.1:1")).Proceed {
			admitted++
		}
	}
	if admitted > 1 {
		t.Errorf("layer b (1/h) admitted %d requests after its reset: the refund of a charge made before the reset gave back a later one", admitted)
	}
}

// A hand-built Result of a policy a layer's Resolver lists is refunded
// under it (SetRules does not replace a Resolver's policies); one of a
// policy no layer names or lists keeps its charge: its layer, and so its
// resets, cannot be told.
func TestRefundHandBuiltResolverPolicies(t *testing.T) {
	gold := core.PerHour(1).Named("gold")
	res, err := core.Tiers(func(context.Context, string) string { return "gold" }, map[string]core.Rule{"gold": gold})
	if err != nil {
		t.Fatal(err)
	}
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("per-ip"), Resolver: res}})
	a := l.Decide(mwReq("192.0.2.1:1"))
	if !a.Proceed || a.Layers[0].Decision.Policy.Name() != "gold" {
		t.Fatalf("a: %+v", a)
	}
	hb := ratelimit.Result{Proceed: true, Layers: []ratelimit.LayerResult{{Key: a.Layers[0].Key, Cost: 1, Decision: a.Layers[0].Decision}}}
	if err := l.Refund(context.Background(), &hb); err != nil {
		t.Fatal(err)
	}
	if !l.Decide(mwReq("192.0.2.1:1")).Proceed {
		t.Fatal("a hand-built Result of a listed Resolver policy was not refunded")
	}

	// A policy of a name no layer names or lists: kept.
	other := core.MustPolicy(core.PerHour(1).Named("unlisted"))
	l2 := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(1).Named("per-ip"),
		Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return other, nil })}})
	b := l2.Decide(mwReq("192.0.2.1:1"))
	if !b.Proceed || b.Layers[0].Decision.Policy != other {
		t.Fatalf("b: %+v", b)
	}
	hb2 := ratelimit.Result{Proceed: true, Layers: []ratelimit.LayerResult{{Key: b.Layers[0].Key, Cost: 1, Decision: b.Layers[0].Decision}}}
	if err := l2.Refund(context.Background(), &hb2); err != nil {
		t.Fatal(err)
	}
	if l2.Decide(mwReq("192.0.2.1:1")).Proceed {
		t.Fatal("a hand-built Result of an unlisted policy was refunded")
	}
}

// A Resolver lists a tier policy under its own layer's name (allowed: the
// same layer). A Limiter-built Result of it is refunded, and so are the
// same layers put in a hand-built Result: a policy a Resolver lists is not
// a rule SetRules replaces.
func TestRefundHandBuiltListedPolicyNamedAsLayer(t *testing.T) {
	gold := core.PerHour(1).Named("per-ip")
	tiers, err := core.Tiers(func(context.Context, string) string { return "gold" }, map[string]core.Rule{"gold": gold})
	if err != nil {
		t.Fatal(err)
	}
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(5).Named("per-ip"), Resolver: tiers}})
	a := l.Decide(mwReq("192.0.2.1:1"))
	if !a.Proceed || a.Layers[0].Decision.Policy.Rule().Limit != 1 {
		t.Fatalf("a: %+v", a)
	}
	if !refundBothWays(t, l, a) {
		t.Fatal("a hand-built Result of a policy the layer's Resolver lists (named as the layer) kept its charge; the Limiter-built one was refunded")
	}
}

// refundBothWays refunds a, a Result of l admitted on a quota of one, and
// checks that it was refunded (the next decision proceeds); then it
// refunds the same layers in a Result built by hand and reports whether
// that refund took (the decision after it proceeds).
func refundBothWays(t *testing.T, l *ratelimit.Limiter, a ratelimit.Result) bool {
	t.Helper()
	if err := l.Refund(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	b := l.Decide(mwReq("192.0.2.1:1"))
	if !b.Proceed {
		t.Fatal("the Limiter-built Result was not refunded")
	}
	hb := ratelimit.Result{Proceed: true, Layers: b.Layers}
	if err := l.Refund(context.Background(), &hb); err != nil {
		t.Fatal(err)
	}
	return l.Decide(mwReq("192.0.2.1:1")).Proceed
}

// A Resolver that builds its policy per key (a quota read from a
// database) under its layer's name, unlisted: the Limiter-built Result is
// refunded; a hand-built copy of its layers keeps its charge, as the
// Refund godoc says, since such a policy cannot be told from a rule
// SetRules replaced.
func TestRefundHandBuiltUnlistedPolicyNamedAsLayer(t *testing.T) {
	quota := core.MustPolicy(core.PerHour(1).Named("per-ip"))
	rv := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return quota, nil })
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerHour(5).Named("per-ip"), Resolver: rv}})
	a := l.Decide(mwReq("192.0.2.1:1"))
	if !a.Proceed || a.Layers[0].Decision.Policy != quota {
		t.Fatalf("a: %+v", a)
	}
	if refundBothWays(t, l, a) {
		t.Fatal("a hand-built Result of an unlisted policy named as its layer was refunded")
	}
}
