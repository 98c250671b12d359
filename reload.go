package ratelimit

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/limitry/ratelimit/core"
)

// RulesObserver is implemented by Observers (see [WithObserver]) that want
// to know the rules a Limiter decides under, such as a metrics exporter
// publishing each rule's limit. ObserveRules is called once by [New] and
// again after every successful [Limiter.SetRules], with the policy of every
// rate layer in layer order (concurrency layers, which have no rate, are
// left out, as [Limiter.Rules] leaves them out).
type RulesObserver interface {
	// ObserveRules receives the policies in force, in layer order, once
	// they apply to requests. A Limiter makes one call at a time (SetRules
	// calls it under the lock that orders reloads), and the slice is new
	// on every call: the observer may keep it.
	ObserveRules(policies []*core.Policy)
}

// SetRules replaces the rules of some of the Limiter's layers while it
// serves: rules maps a layer's name (its Rule.Name, core.DefaultName for an
// unnamed layer) to its new Rule. Layers not named keep their rule; key
// functions, costs and Resolvers are code and do not change.
//
// The change is atomic with respect to traffic: every request is decided,
// and its headers written, under either the old rules or the new ones,
// never a mix; the next decision after SetRules returns uses the new rules,
// and its X-RateLimit-Limit and RateLimit-Policy say so. Nothing is reset:
// a layer keeps its name, so its keys keep their state, which the store
// carries over to the new rule by the policy-identity rules of core.Store:
// the units in use when the change is first met are kept in absolute
// numbers (3 used of "5/10m" are 3 used of "10/10m", leaving 6 after the
// next request), so a change never credits quota; and those units then
// recover under the new rule, from the moment of the change (a token
// bucket refills them at the new rate, a fixed or sliding window counts
// them in the window that holds that moment, a log records them at it).
// This holds when the algorithm changes too. Requests decided while the
// change happens may still hold the old rules (at most one per request in
// flight): one that meets a key the new rule has charged carries its record
// back, and the key's units then recover at the pace of the rule that
// charged last (see core.Store), so a key may briefly admit up to that many
// more than either rule. A request charged under the old rule and refunded
// after the change (WithRefund, Limiter.Refund) keeps its charge on the
// layers whose rule changed, also when a later SetRules brings the old
// rule back (the same rule set again reads the key's state as it was
// charged, and refunds it): the new rule's record holds the units found in
// use when it first met the key, in absolute numbers, and cannot tell
// which of them, if any, were this charge's (see the README, "Changing
// rules at runtime").
//
// SetRules validates everything first and changes nothing on an error: a
// name that is no layer's, a Rule whose Name is set and differs from its
// layer's (renaming would orphan the layer's state), an invalid Rule
// (the error wraps core.ErrInvalidRule), or a Rule the store cannot decide
// (core.PolicyChecker; the error wraps core.ErrUnsupportedPolicy, as for a
// custom algorithm on a Redis store). It is safe to call concurrently
// with requests and with itself.
func (l *Limiter) SetRules(rules map[string]core.Rule) error {
	l.reloadMu.Lock()
	defer l.reloadMu.Unlock()
	cur := l.rules.Load()
	policies := make([]*core.Policy, len(cur.rules))
	for i := range cur.rules {
		policies[i] = cur.rules[i].policy
	}
	names := make([]string, 0, len(rules))
	for name := range rules {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		i := l.layerIndex(name)
		if i < 0 {
			return fmt.Errorf("ratelimit: SetRules: no layer is named %q (layers: %s)", name, l.layerNames())
		}
		if l.layers[i].inFlight > 0 {
			return fmt.Errorf("ratelimit: SetRules: layer %q is a concurrency layer (InFlight): its limit is fixed by New", name)
		}
		r := rules[name]
		if r.Name == "" {
			r.Name = name
		} else if r.Name != name {
			return fmt.Errorf("ratelimit: SetRules: the rule for layer %q is named %q: a layer keeps its name, so that its keys keep their state", name, r.Name)
		}
		p, err := core.NewPolicy(r)
		if err != nil {
			return prefixed("SetRules: layer "+l.layers[i].desc, err)
		}
		if err := core.CheckPolicies(l.cl.Store(), p); err != nil {
			return prefixed("SetRules: layer "+l.layers[i].desc, err)
		}
		if old := policies[i]; sameRule(old.Rule(), p.Rule()) {
			p = old // the same rule: the same policy, so that nothing tells them apart
		}
		policies[i] = p
	}
	rs := newRuleSet(policies, l.resolverDelay)
	for i := range rs.rules {
		rs.rules[i].gen = cur.rules[i].gen
		if policies[i].Identity() != cur.rules[i].policy.Identity() {
			rs.rules[i].gen++
		}
	}
	l.rules.Store(rs)
	l.observeRules(policies)
	return nil
}

// sameRule reports whether a and b are the same Rule: every field equal,
// the algorithms too, deeply (reflect.DeepEqual), so that a custom one
// holding a map, a slice or a func compares without a panic. A rule found
// different although it is the same (one holding a func) only gets a new
// policy of the same Identity, which decides and refunds alike.
func sameRule(a, b core.Rule) bool {
	return a.Name == b.Name && a.Limit == b.Limit && a.Window == b.Window && a.Burst == b.Burst &&
		a.MaxDelay == b.MaxDelay && reflect.DeepEqual(a.Algorithm, b.Algorithm)
}

// Rules returns the rule of every layer, by layer name, with defaults
// filled in (see core.Policy.Rule).
func (l *Limiter) Rules() map[string]core.Rule {
	rs := l.rules.Load()
	m := make(map[string]core.Rule, len(rs.rules))
	for i := range rs.rules {
		if l.layers[i].inFlight > 0 {
			continue // not a Rule: see Layer.InFlight
		}
		m[l.layers[i].name] = rs.rules[i].policy.Rule()
	}
	return m
}

// layerIndex returns the index of the layer named name, or -1.
func (l *Limiter) layerIndex(name string) int {
	for i := range l.layers {
		if l.layers[i].name == name {
			return i
		}
	}
	return -1
}

// layerNames lists the layers' names for error messages.
func (l *Limiter) layerNames() string {
	names := make([]string, len(l.layers))
	for i := range l.layers {
		names[i] = fmt.Sprintf("%q", l.layers[i].name)
	}
	return strings.Join(names, ", ")
}

// observeRules tells a RulesObserver the rules now in force.
// Concurrency layers are left out, as Rules leaves them out: they have no
// rate.
func (l *Limiter) observeRules(policies []*core.Policy) {
	o, ok := l.cfg.observer.(RulesObserver)
	if !ok {
		return
	}
	ps := make([]*core.Policy, 0, len(policies))
	for i, p := range policies {
		if l.layers[i].inFlight == 0 {
			ps = append(ps, p)
		}
	}
	o.ObserveRules(ps)
}
