// Package promlimit exports what a rate limiter decides as Prometheus metrics
// (github.com/prometheus/client_golang). A [Metrics] is a [core.Observer]:
// give it to ratelimit.WithObserver (or core.WithObserver) and, for
// evictions, to core.MemoryConfig.Observer.
//
//	metrics := promlimit.Must(promlimit.New(prometheus.DefaultRegisterer))
//	limiter := ratelimit.Must(ratelimit.New(layers, ratelimit.WithObserver(metrics)))
//	http.Handle("/metrics", promhttp.Handler())
//
// # Metrics
//
// Every metric is labelled by rule, the Name of the layer's rule (or of the
// policy a Resolver chose), never by key: keys are unbounded and may identify
// people. Rule names come from the program, so the number of series is
// bounded.
//
//	ratelimit_decisions_total{rule, outcome}         counter
//	ratelimit_decision_duration_seconds{rule}        histogram
//	ratelimit_errors_total{rule}                     counter
//	ratelimit_fallback_decisions_total{rule}         counter
//	ratelimit_evictions_total{rule}                  counter
//	ratelimit_memory_store_keys                      gauge (with SetMemoryStore)
//	ratelimit_memory_store_capacity                  gauge (with SetMemoryStore)
//	ratelimit_rule_limit{rule, algorithm}            gauge (see ObserveRules)
//	ratelimit_rule_window_seconds{rule, algorithm}   gauge (see ObserveRules)
//
// ratelimit_decisions_total counts one decision per rule per request: a
// request decided by two layers counts once under each rule. Its outcome is
// one of:
//
//   - "allowed": the rule allowed the request and every other rule of its
//     batch did too, so the request was admitted and the rule charged (in
//     dry-run mode too).
//   - "denied": the rule refused the request and the refusal was enforced
//     (including a cost above the rule's capacity, answered 413).
//   - "dry_run_denied": the rule refused the request in dry-run mode; the
//     request was served anyway.
//   - "not_charged": the rule allowed the request but another rule of the
//     same batch (another layer of the same Limiter) refused it. Layers are
//     all-or-nothing, so this rule was not charged. The request was refused
//     (or, in dry-run mode, served), and the refusing rule counts it as
//     "denied" (or "dry_run_denied").
//
// A request decided more than once counts each decision: an outbound
// request that a ratelimit.Transport waits to retry after a refusal is
// decided again, so one sent after n refusals counts n "denied" and one
// "allowed" (waiting out a shaping delay or a server's pause is no
// decision).
//
// So, per rule, allowed is exactly the number of charges, and denied plus
// dry_run_denied the number of refusals this rule made itself; summing
// "denied" over rules counts a request refused by two layers twice. For a
// concurrency layer (ratelimit.Layer.InFlight), a charge is a slot that
// stays taken: a request another layer refuses gives its slot back
// ("not_charged"), but one served in dry-run mode keeps it ("allowed").
// One exception: a request admitted with a shaping delay is counted when
// decided, so one whose wait then fails (its context ended, or the waiting
// room was full after Decide) stays counted "allowed" under its
// concurrency layers, though its slot is given back.
//
// ratelimit_decision_duration_seconds is the time the store took to decide
// the batch that held the rule's decision (the same batch time is observed
// once under each of its rules). Its default buckets, [DefaultBuckets], run
// from 1µs to 100ms: an in-memory decision takes from well under a
// microsecond to a few microseconds, a Redis round trip about a millisecond.
// A Limiter on a fake clock reports 0.
//
// ratelimit_errors_total counts the errors a Store returned, once under each
// rule of the batch: store failures (of a refund too, through
// ratelimit.WithRefund or Limiter.Refund; and a layer's Resolver failing
// in the HTTP middleware, handled as a store failure and counted under the
// rules of that layer and of the layers before it), core.ErrStoreFull from a full
// MemoryStore with KeepActive (its requests are answered 429, but no rule
// refused them, so they are not "denied": a growing count means the store
// is too small for its busy keys, or under a flood of new ones),
// core.ErrDuplicateRequest and the other clashes of a Resolver's policy
// with another layer's name (answered 500, see ratelimit.ErrConfig),
// core.ErrUnsupportedPolicy (a policy a Resolver
// picked that the store cannot decide, answered 500), and, under the
// shaping rules of the request,
// ratelimit.ErrTooManyWaiting from the HTTP middleware (a request refused
// with 429 because too many requests were waiting for a shaping delay,
// before any store decided it: see ratelimit.WithMaxWaiting). An error that
// the caller's context ending caused (its client went away) is not
// counted; a store's own error met after that, such as a full KeepActive
// store's, is. A
// cost above a rule's capacity is a refusal ("denied"), not an error. Key errors
// of the HTTP middleware never reach the store and are not counted; see
// ratelimit.WithErrorHandler. ratelimit_evictions_total
// counts keys a MemoryStore evicted while they still held state, under the
// rule of the evicted key: a growing count means the store's capacity is too
// small. ratelimit_fallback_decisions_total counts the decisions a store's
// fallback made in its place (core.Decision.Fallback: a Redis store whose
// Redis was unavailable, deciding through its Config.Fallback), whatever
// their outcome, which ratelimit_decisions_total counts as well: while it
// grows, each instance limits on its own local state, so a fleet of N admits
// up to N times the quota. The memory-store gauges are read from the store
// at scrape time.
//
// # Registration
//
// [New] registers the metrics with the prometheus.Registerer it is given:
// prometheus.DefaultRegisterer to serve them with promhttp.Handler(),
// or a registry of your own. Registering twice on one registry is an error
// (a prometheus.AlreadyRegisteredError, wrapped), not a panic; [Must] panics
// instead. One Metrics can observe several Limiters: their series are told
// apart by rule name. To keep two sets on one registry, register each through
// prometheus.WrapRegistererWith with a distinct value of the same constant
// label (limiter="api", limiter="admin"), or through
// prometheus.WrapRegistererWithPrefix. A Metrics is also a
// prometheus.Collector, so New(nil, ...) builds one without registering it.
package promlimit

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/limitry/ratelimit/core"
)

// DefaultBuckets are the upper bounds, in seconds, of the decision-latency
// histogram's buckets when no [WithBuckets] option is given: 1µs to 100ms in
// 1-2.5-5 steps, fine enough for sub-microsecond in-memory decisions and for
// Redis round trips of a few milliseconds.
var DefaultBuckets = []float64{
	1e-6, 2.5e-6, 5e-6,
	1e-5, 2.5e-5, 5e-5,
	1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3,
	1e-2, 2.5e-2, 5e-2,
	1e-1,
}

// Outcome label values of ratelimit_decisions_total.
const (
	outcomeAllowed      = "allowed"
	outcomeDenied       = "denied"
	outcomeDryRunDenied = "dry_run_denied"
	outcomeNotCharged   = "not_charged"
)

// Metrics records a rate limiter's decisions, store errors and evictions as
// Prometheus metrics (see the package documentation for their names and
// meaning). It implements core.Observer and prometheus.Collector. Build it
// with New; it is safe for concurrent use. Observing a decision costs a
// lookup of the rule's series and a few atomic updates; it does not allocate
// after the rule's first decision.
type Metrics struct {
	decisions  *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	errors     *prometheus.CounterVec
	evictions  *prometheus.CounterVec
	fallback   *prometheus.CounterVec
	ruleLimit  *prometheus.GaugeVec
	ruleWindow *prometheus.GaugeVec
	keysDesc   *prometheus.Desc
	capDesc    *prometheus.Desc

	store atomic.Pointer[core.MemoryStore]
	rules sync.Map // rule name -> *ruleSeries
}

// ruleSeries holds the series of one rule, resolved once.
type ruleSeries struct {
	allowed, denied, dryRunDenied, notCharged prometheus.Counter
	fallback                                  prometheus.Counter
	latency                                   prometheus.Observer
}

var (
	_ core.Observer        = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// Option configures New.
type Option func(*config)

type config struct {
	buckets []float64
}

// WithBuckets sets the upper bounds, in seconds, of the decision-latency
// histogram's buckets; they must be strictly increasing. The default value
// is DefaultBuckets.
func WithBuckets(bounds ...float64) Option {
	return func(c *config) { c.buckets = append([]float64(nil), bounds...) }
}

// New returns a Metrics registered with reg. It returns an error for invalid
// options, and the registerer's error, wrapped, when reg refuses the metrics
// (a prometheus.AlreadyRegisteredError when the same metrics are already
// registered there). A nil reg registers nothing: the Metrics is a
// prometheus.Collector to register later.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	cfg := config{buckets: DefaultBuckets}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("promlimit: nil Option")
		}
		o(&cfg)
	}
	if len(cfg.buckets) == 0 {
		return nil, errors.New("promlimit: WithBuckets needs at least one bucket")
	}
	for i := 1; i < len(cfg.buckets); i++ {
		if !(cfg.buckets[i-1] < cfg.buckets[i]) {
			return nil, fmt.Errorf("promlimit: buckets must be strictly increasing, got %v", cfg.buckets)
		}
	}
	const ns = "ratelimit"
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "decisions_total",
			Help: "Rate-limit decisions, one per rule per request, by outcome: allowed (charged), denied, dry_run_denied (refused but served in dry-run mode), not_charged (allowed by this rule, refused by another rule of the batch).",
		}, []string{"rule", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "decision_duration_seconds",
			Help:    "Time the store took to decide the batch holding the rule's decision.",
			Buckets: cfg.buckets,
		}, []string{"rule"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "errors_total",
			Help: "Errors a store returned (failures, and a full KeepActive store) and refusals for a full shaping waiting room, once per rule.",
		}, []string{"rule"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "evictions_total",
			Help: "Keys a memory store evicted while they still held state; growth means its capacity is too small.",
		}, []string{"rule"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "fallback_decisions_total",
			Help: "Decisions a store's fallback made while its backend (Redis) was unavailable, once per rule per request, whatever their outcome; while it grows, each instance limits on its own state.",
		}, []string{"rule"}),
		ruleLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "rule_limit",
			Help: "Units each rule admits per window, as last set by ratelimit.New or Limiter.SetRules.",
		}, []string{"rule", "algorithm"}),
		ruleWindow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "rule_window_seconds",
			Help: "Window of each rule, as last set by ratelimit.New or Limiter.SetRules.",
		}, []string{"rule", "algorithm"}),
		keysDesc: prometheus.NewDesc(ns+"_memory_store_keys",
			"Keys held by the memory store.", nil, nil),
		capDesc: prometheus.NewDesc(ns+"_memory_store_capacity",
			"Most keys the memory store can hold.", nil, nil),
	}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, fmt.Errorf("promlimit: registering the metrics: %w", err)
		}
	}
	return m, nil
}

// Must panics if err is not nil and returns m otherwise, for metrics set up
// at program start: promlimit.Must(promlimit.New(reg)).
func Must(m *Metrics, err error) *Metrics {
	if err != nil {
		panic(err)
	}
	return m
}

// SetMemoryStore makes the Metrics report s's key count and capacity as the
// ratelimit_memory_store_keys and ratelimit_memory_store_capacity gauges,
// read at scrape time; nil stops reporting them. For evictions, make s with
// this Metrics as its core.MemoryConfig.Observer:
//
//	store := core.MustMemoryStore(&core.MemoryConfig{Observer: metrics})
//	metrics.SetMemoryStore(store)
func (m *Metrics) SetMemoryStore(s *core.MemoryStore) { m.store.Store(s) }

// series returns the series of the rule named name.
func (m *Metrics) series(name string) *ruleSeries {
	if s, ok := m.rules.Load(name); ok {
		return s.(*ruleSeries)
	}
	s := &ruleSeries{
		allowed:      m.decisions.WithLabelValues(name, outcomeAllowed),
		denied:       m.decisions.WithLabelValues(name, outcomeDenied),
		dryRunDenied: m.decisions.WithLabelValues(name, outcomeDryRunDenied),
		notCharged:   m.decisions.WithLabelValues(name, outcomeNotCharged),
		fallback:     m.fallback.WithLabelValues(name),
		latency:      m.latency.WithLabelValues(name),
	}
	got, _ := m.rules.LoadOrStore(name, s)
	return got.(*ruleSeries)
}

// policyName is p's Name, or "" for a nil policy.
func policyName(p *core.Policy) string {
	if p == nil {
		return ""
	}
	return p.Name()
}

// ObserveDecision counts ev under its rule and outcome and observes its
// latency. It implements core.Observer.
func (m *Metrics) ObserveDecision(ev core.DecisionEvent) {
	s := m.series(policyName(ev.Decision.Policy))
	switch {
	case !ev.Decision.Allowed && ev.DryRun:
		s.dryRunDenied.Inc()
	case !ev.Decision.Allowed:
		s.denied.Inc()
	case ev.Admitted:
		s.allowed.Inc()
	default:
		s.notCharged.Inc()
	}
	if ev.Decision.Fallback {
		s.fallback.Inc()
	}
	s.latency.Observe(ev.Latency.Seconds())
}

// ObserveError counts a store failure once under each rule of the failed
// batch: a rule the event names twice (a Resolver's policy that clashes
// with another layer's) is counted once. It implements core.Observer.
func (m *Metrics) ObserveError(ev core.ErrorEvent) {
	if len(ev.Policies) == 0 {
		m.errors.WithLabelValues("").Inc()
		return
	}
	for i, p := range ev.Policies {
		name := policyName(p)
		if !slices.ContainsFunc(ev.Policies[:i], func(q *core.Policy) bool { return policyName(q) == name }) {
			m.errors.WithLabelValues(name).Inc()
		}
	}
}

// ObserveEviction counts an eviction under the evicted key's rule. It
// implements core.Observer.
func (m *Metrics) ObserveEviction(ev core.EvictionEvent) {
	m.evictions.WithLabelValues(ev.PolicyName).Inc()
}

// ObserveRules implements ratelimit.RulesObserver: it publishes each rule's
// limit and window as the ratelimit_rule_limit and
// ratelimit_rule_window_seconds gauges, labelled by rule name and
// algorithm, so a reload (Limiter.SetRules) shows at once. A rule whose
// algorithm changed loses its old series.
func (m *Metrics) ObserveRules(policies []*core.Policy) {
	for _, p := range policies {
		m.ruleLimit.DeletePartialMatch(prometheus.Labels{"rule": p.Name()})
		m.ruleWindow.DeletePartialMatch(prometheus.Labels{"rule": p.Name()})
		m.ruleLimit.WithLabelValues(p.Name(), p.Algorithm().Name()).Set(float64(p.Limit()))
		m.ruleWindow.WithLabelValues(p.Name(), p.Algorithm().Name()).Set(p.Window().Seconds())
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.latency.Describe(ch)
	m.errors.Describe(ch)
	m.evictions.Describe(ch)
	m.fallback.Describe(ch)
	m.ruleLimit.Describe(ch)
	m.ruleWindow.Describe(ch)
	ch <- m.keysDesc
	ch <- m.capDesc
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.latency.Collect(ch)
	m.errors.Collect(ch)
	m.evictions.Collect(ch)
	m.fallback.Collect(ch)
	m.ruleLimit.Collect(ch)
	m.ruleWindow.Collect(ch)
	if s := m.store.Load(); s != nil {
		ch <- prometheus.MustNewConstMetric(m.keysDesc, prometheus.GaugeValue, float64(s.Len()))
		ch <- prometheus.MustNewConstMetric(m.capDesc, prometheus.GaugeValue, float64(s.Capacity()))
	}
}
