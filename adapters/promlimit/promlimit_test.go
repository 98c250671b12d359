package promlimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/promlimit"
	"github.com/limitry/ratelimit/core"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newMetrics returns Metrics registered on a fresh registry.
func newMetrics(t *testing.T, opts ...promlimit.Option) (*promlimit.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := promlimit.New(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// compare checks the named metrics of reg against the exposition text want.
func compare(t *testing.T, reg prometheus.Gatherer, want string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

func take(t *testing.T, l *core.Limiter, reqs ...core.Request) bool {
	t.Helper()
	out := make([]core.Decision, len(reqs))
	ok, err := l.Take(context.Background(), reqs, out)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

const decisionsHelp = `# HELP ratelimit_decisions_total Rate-limit decisions, one per rule per request, by outcome: allowed (charged), denied, dry_run_denied (refused but served in dry-run mode), not_charged (allowed by this rule, refused by another rule of the batch).
# TYPE ratelimit_decisions_total counter
`

// decisions is the expected ratelimit_decisions_total series of rule, one
// per outcome.
func decisions(rule string, allowed, denied, dryRunDenied, notCharged int) string {
	return fmt.Sprintf(`ratelimit_decisions_total{outcome="allowed",rule=%[1]q} %[2]d
ratelimit_decisions_total{outcome="denied",rule=%[1]q} %[3]d
ratelimit_decisions_total{outcome="dry_run_denied",rule=%[1]q} %[4]d
ratelimit_decisions_total{outcome="not_charged",rule=%[1]q} %[5]d
`, rule, allowed, denied, dryRunDenied, notCharged)
}

// Every outcome, counted exactly: enforced and dry-run, single requests and
// layered batches where one rule allows and another refuses.
func TestDecisionOutcomes(t *testing.T) {
	m, reg := newMetrics(t)
	clk := core.NewFakeClock(t0)
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute})
	login := core.MustPolicy(core.Rule{Name: "login", Limit: 1, Window: time.Minute})
	l := core.Must(core.NewWithPolicy(nil, core.WithClock(clk), core.WithObserver(m)))

	steps := []struct {
		reqs []core.Request
		want bool
	}{
		{[]core.Request{{Policy: perIP, Key: "a", Cost: 1}, {Policy: login, Key: "a", Cost: 1}}, true},  // both allowed
		{[]core.Request{{Policy: perIP, Key: "a", Cost: 1}, {Policy: login, Key: "a", Cost: 1}}, false}, // login denies, per-ip not charged
		{[]core.Request{{Policy: perIP, Key: "a", Cost: 1}}, true},                                      // per-ip allowed (its 2nd charge)
		{[]core.Request{{Policy: perIP, Key: "a", Cost: 1}}, false},                                     // per-ip denied
		{[]core.Request{{Policy: perIP, Key: "b", Cost: 3}}, false},                                     // above capacity: denied
	}
	for i, s := range steps {
		out := make([]core.Decision, len(s.reqs))
		ok, err := l.Take(context.Background(), s.reqs, out)
		if err != nil && !errors.Is(err, core.ErrCostExceedsCapacity) {
			t.Fatal(err)
		}
		if ok != s.want {
			t.Fatalf("step %d: admitted %v, want %v", i+1, ok, s.want)
		}
	}

	shadow := core.MustPolicy(core.Rule{Name: "shadow", Limit: 1, Window: time.Minute})
	dry := core.Must(core.NewWithPolicy(nil, core.WithClock(clk), core.WithObserver(m), core.WithDryRun()))
	take(t, dry, core.Request{Policy: shadow, Key: "a", Cost: 1})                                                 // allowed
	take(t, dry, core.Request{Policy: shadow, Key: "a", Cost: 1})                                                 // dry_run_denied
	take(t, dry, core.Request{Policy: shadow, Key: "a", Cost: 1}, core.Request{Policy: login, Key: "z", Cost: 1}) // login not_charged

	compare(t, reg, decisionsHelp+decisions("login", 1, 1, 0, 1)+
		decisions("per-ip", 2, 2, 0, 1)+
		decisions("shadow", 1, 0, 2, 0), "ratelimit_decisions_total")
}

// stepClock advances by step on every reading, so that the time a Limiter
// measures around its store call is exactly step.
type stepClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	c.now = c.now.Add(c.step)
	return t
}

func TestLatencyHistogram(t *testing.T) {
	m, reg := newMetrics(t, promlimit.WithBuckets(0.0001, 0.001, 0.01))
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	login := core.MustPolicy(core.Rule{Name: "login", Limit: 10, Window: time.Minute})
	l := core.Must(core.NewWithPolicy(nil, core.WithClock(&stepClock{now: t0, step: 250 * time.Microsecond}), core.WithObserver(m)))
	take(t, l, core.Request{Policy: perIP, Key: "a", Cost: 1}, core.Request{Policy: login, Key: "a", Cost: 1})
	take(t, l, core.Request{Policy: perIP, Key: "a", Cost: 1})

	// One batch observes its time once under each of its rules.
	compare(t, reg, `
# HELP ratelimit_decision_duration_seconds Time the store took to decide the batch holding the rule's decision.
# TYPE ratelimit_decision_duration_seconds histogram
ratelimit_decision_duration_seconds_bucket{rule="login",le="0.0001"} 0
ratelimit_decision_duration_seconds_bucket{rule="login",le="0.001"} 1
ratelimit_decision_duration_seconds_bucket{rule="login",le="0.01"} 1
ratelimit_decision_duration_seconds_bucket{rule="login",le="+Inf"} 1
ratelimit_decision_duration_seconds_sum{rule="login"} 0.00025
ratelimit_decision_duration_seconds_count{rule="login"} 1
ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.0001"} 0
ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.001"} 2
ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.01"} 2
ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="+Inf"} 2
ratelimit_decision_duration_seconds_sum{rule="per-ip"} 0.0005
ratelimit_decision_duration_seconds_count{rule="per-ip"} 2
`, "ratelimit_decision_duration_seconds")
}

func TestDefaultBuckets(t *testing.T) {
	m, reg := newMetrics(t)
	l := core.Must(core.New(core.Rule{Name: "r", Limit: 1, Window: time.Second}, core.WithClock(core.NewFakeClock(t0)), core.WithObserver(m)))
	if _, err := l.Allow(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_decision_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		var bounds []float64
		for _, b := range h.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if fmt.Sprint(bounds) != fmt.Sprint(promlimit.DefaultBuckets) {
			t.Errorf("buckets %v, want %v", bounds, promlimit.DefaultBuckets)
		}
		if h.GetSampleCount() != 1 || h.GetSampleSum() != 0 {
			t.Errorf("count %d sum %v, want 1 and 0 on a fake clock", h.GetSampleCount(), h.GetSampleSum())
		}
		return
	}
	t.Error("no histogram gathered")
}

// failingStore fails every batch.
type failingStore struct{}

func (failingStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return errors.New("backend down")
}

func TestErrors(t *testing.T) {
	m, reg := newMetrics(t)
	perIP := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	login := core.MustPolicy(core.Rule{Name: "login", Limit: 10, Window: time.Minute})
	l := core.Must(core.NewWithPolicy(nil, core.WithStore(failingStore{}), core.WithClock(core.NewFakeClock(t0)), core.WithObserver(m)))
	out := make([]core.Decision, 2)
	for range 2 {
		if _, err := l.Take(context.Background(), []core.Request{{Policy: perIP, Key: "a", Cost: 1}, {Policy: login, Key: "a", Cost: 1}}, out); err == nil {
			t.Fatal("no error from a failing store")
		}
	}
	if _, err := l.Take(context.Background(), []core.Request{{Policy: perIP, Key: "a", Cost: 1}}, out); err == nil {
		t.Fatal("no error from a failing store")
	}
	compare(t, reg, `
# HELP ratelimit_errors_total Errors a store returned (failures, and a full KeepActive store) and refusals for a full shaping waiting room, once per rule.
# TYPE ratelimit_errors_total counter
ratelimit_errors_total{rule="login"} 2
ratelimit_errors_total{rule="per-ip"} 3
`, "ratelimit_errors_total")
	if n := testutil.CollectAndCount(m, "ratelimit_decisions_total"); n != 0 {
		t.Errorf("%d decision series after failures only, want 0", n)
	}
}

// TestStoreFullIsAnError: a full KeepActive MemoryStore refuses a new key
// with core.ErrStoreFull; no rule refused it, so it counts in errors_total,
// not as denied.
func TestStoreFullIsAnError(t *testing.T) {
	m, reg := newMetrics(t)
	p := core.MustPolicy(core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute})
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 1, Shards: 1, KeepActive: true})
	l := core.Must(core.NewWithPolicy(nil, core.WithStore(store), core.WithClock(core.NewFakeClock(t0)), core.WithObserver(m)))
	if !take(t, l, core.Request{Policy: p, Key: "a", Cost: 1}) {
		t.Fatal("first key refused")
	}
	out := make([]core.Decision, 1)
	if _, err := l.Take(context.Background(), []core.Request{{Policy: p, Key: "b", Cost: 1}}, out); !errors.Is(err, core.ErrStoreFull) {
		t.Fatalf("second key in a full store: %v, want ErrStoreFull", err)
	}
	compare(t, reg, `
# HELP ratelimit_errors_total Errors a store returned (failures, and a full KeepActive store) and refusals for a full shaping waiting room, once per rule.
# TYPE ratelimit_errors_total counter
ratelimit_errors_total{rule="per-ip"} 1
`, "ratelimit_errors_total")
	compare(t, reg, decisionsHelp+decisions("per-ip", 1, 0, 0, 0), "ratelimit_decisions_total")
}

// signalling passes every event to the Metrics and signals each decision.
type signalling struct {
	*promlimit.Metrics
	decided chan struct{}
}

func (s signalling) ObserveDecision(ev core.DecisionEvent) {
	s.Metrics.ObserveDecision(ev)
	s.decided <- struct{}{}
}

// TestWaitingRoomFullIsAnError: a request the middleware refuses (429)
// because too many requests wait for a shaping delay was decided by no
// store and refused by no rule: it counts in errors_total under the
// request's shaping rule alone.
func TestWaitingRoomFullIsAnError(t *testing.T) {
	m, reg := newMetrics(t)
	obs := signalling{Metrics: m, decided: make(chan struct{}, 8)}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 100, Window: time.Minute}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Minute, MaxDelay: time.Hour}},
	}, ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithObserver(obs), ratelimit.WithMaxWaiting(1)))
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := func(ctx context.Context) *http.Request {
		r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		r.RemoteAddr = "192.0.2.1:1"
		return r
	}
	h.ServeHTTP(httptest.NewRecorder(), req(context.Background())) // served at once
	<-obs.decided
	<-obs.decided
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { // delayed a minute: holds the one waiting slot
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req(ctx))
		done <- w.Code
	}()
	<-obs.decided // charged, its waiting slot taken before that
	<-obs.decided
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req(context.Background()))
	cancel()
	<-done
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("full waiting room: %d, want 429", w.Code)
	}
	compare(t, reg, `
# HELP ratelimit_errors_total Errors a store returned (failures, and a full KeepActive store) and refusals for a full shaping waiting room, once per rule.
# TYPE ratelimit_errors_total counter
ratelimit_errors_total{rule="shape"} 1
`, "ratelimit_errors_total")
}

func TestEvictionsAndMemoryStore(t *testing.T) {
	m, reg := newMetrics(t)
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: m})
	m.SetMemoryStore(store)
	l := core.Must(core.New(core.Rule{Name: "per-ip", Limit: 10, Window: time.Hour},
		core.WithStore(store), core.WithClock(core.NewFakeClock(t0)), core.WithObserver(m)))
	for i := range 67 {
		if _, err := l.Allow(context.Background(), fmt.Sprintf("client-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	compare(t, reg, `
# HELP ratelimit_evictions_total Keys a memory store evicted while they still held state; growth means its capacity is too small.
# TYPE ratelimit_evictions_total counter
ratelimit_evictions_total{rule="per-ip"} 3
# HELP ratelimit_memory_store_keys Keys held by the memory store.
# TYPE ratelimit_memory_store_keys gauge
ratelimit_memory_store_keys 64
# HELP ratelimit_memory_store_capacity Most keys the memory store can hold.
# TYPE ratelimit_memory_store_capacity gauge
ratelimit_memory_store_capacity 64
`, "ratelimit_evictions_total", "ratelimit_memory_store_keys", "ratelimit_memory_store_capacity")
	if got := store.Evictions(); got != 3 {
		t.Errorf("store.Evictions() = %d, want 3", got)
	}

	m.SetMemoryStore(nil)
	if n := testutil.CollectAndCount(m, "ratelimit_memory_store_keys"); n != 0 {
		t.Errorf("keys gauge still reported after SetMemoryStore(nil)")
	}
}

// Through the HTTP middleware: a key never becomes a label value, and the
// metrics count what the clients saw.
func TestThroughMiddlewareNoKeyLabels(t *testing.T) {
	m, reg := newMetrics(t)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithObserver(m)))
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	codes := map[int]int{}
	for range 6 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.77:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes[w.Code]++
	}
	if codes[200] != 5 || codes[429] != 1 {
		t.Fatalf("statuses %v", codes)
	}
	compare(t, reg, decisionsHelp+decisions("per-ip", 5, 1, 0, 0), "ratelimit_decisions_total")

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if name := lp.GetName(); name != "rule" && name != "outcome" && name != "le" && name != "algorithm" {
					t.Errorf("%s has label %q", mf.GetName(), name)
				}
				if strings.Contains(lp.GetValue(), "192.0.2.77") {
					t.Errorf("%s has the key in label %s=%q", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}

// TestInFlightLayerNotCharged: a concurrency layer's slot given back
// because a rate layer refused the request counts as not_charged, not
// allowed: allowed is exactly the number of slots that stayed taken.
func TestInFlightLayerNotCharged(t *testing.T) {
	m, reg := newMetrics(t)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Minute}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "conc"}, InFlight: 5},
	}, ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithObserver(m)))
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	compare(t, reg, decisionsHelp+decisions("conc", 1, 0, 0, 2)+decisions("rate", 1, 2, 0, 0), "ratelimit_decisions_total")
}

// TestInFlightLayerDryRun: in dry-run mode a request a rate layer refuses
// is served and keeps its slot, so the slot counts as allowed.
func TestInFlightLayerDryRun(t *testing.T) {
	m, reg := newMetrics(t)
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Minute}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "conc"}, InFlight: 1},
	}, ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithObserver(m), ratelimit.WithDryRun()))
	req := func() *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		return r
	}
	var h http.Handler
	nested := false
	h = l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		if !nested { // while this request runs, its slot is held
			nested = true
			h.ServeHTTP(httptest.NewRecorder(), req())
			nested = false
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), req()) // rate allowed; slot taken
	h.ServeHTTP(httptest.NewRecorder(), req()) // rate refused in dry run, served; slot taken
	// Each nested request found the slot full (dry_run_denied) and was not
	// decided by "rate".
	compare(t, reg, decisionsHelp+decisions("conc", 2, 0, 2, 0)+decisions("rate", 1, 0, 1, 0), "ratelimit_decisions_total")
}

func TestRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := promlimit.New(reg); err != nil {
		t.Fatal(err)
	}
	_, err := promlimit.New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("second New on one registry: %v, want an AlreadyRegisteredError", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Must did not panic on a duplicate registration")
			}
		}()
		promlimit.Must(promlimit.New(reg))
	}()

	// Two sets on one registry, told apart by a constant label on each.
	reg2 := prometheus.NewRegistry()
	for _, name := range []string{"api", "admin"} {
		if _, err := promlimit.New(prometheus.WrapRegistererWith(prometheus.Labels{"limiter": name}, reg2)); err != nil {
			t.Errorf("wrapped registerer %q: %v", name, err)
		}
	}

	// nil registers nothing; the Metrics is a Collector to register later.
	m, err := promlimit.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := prometheus.NewRegistry().Register(m); err != nil {
		t.Errorf("registering a New(nil) Metrics: %v", err)
	}
}

func TestOptionErrors(t *testing.T) {
	for name, opts := range map[string][]promlimit.Option{
		"no buckets":      {promlimit.WithBuckets()},
		"unsorted":        {promlimit.WithBuckets(0.1, 0.01)},
		"duplicate bound": {promlimit.WithBuckets(0.1, 0.1)},
		"nil option":      {nil},
	} {
		if _, err := promlimit.New(prometheus.NewRegistry(), opts...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestConcurrentObserve(t *testing.T) {
	m, reg := newMetrics(t)
	l := core.Must(core.New(core.Rule{Name: "r", Limit: 100, Window: time.Hour}, core.WithClock(core.NewFakeClock(t0)), core.WithObserver(m)))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, err := l.Allow(context.Background(), fmt.Sprint("k", g%2)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	compare(t, reg, decisionsHelp+decisions("r", 200, 200, 0, 0), "ratelimit_decisions_total")
}

func TestObserveDecisionDoesNotAllocate(t *testing.T) {
	m, _ := newMetrics(t)
	ev := core.DecisionEvent{
		Key:      "k",
		Decision: core.Decision{Allowed: true, Policy: core.MustPolicy(core.Rule{Name: "r", Limit: 1, Window: time.Second})},
		Admitted: true,
		Latency:  time.Microsecond,
	}
	m.ObserveDecision(ev) // the rule's first decision resolves its series
	if n := testing.AllocsPerRun(1000, func() { m.ObserveDecision(ev) }); n != 0 {
		t.Errorf("ObserveDecision allocates %v times per call", n)
	}
}

func BenchmarkObserveDecision(b *testing.B) {
	m, err := promlimit.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	p := core.MustPolicy(core.Rule{Name: "r", Limit: 1, Window: time.Second})
	ev := core.DecisionEvent{Key: "k", Decision: core.Decision{Allowed: true, Policy: p}, Admitted: true, Latency: time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ObserveDecision(ev)
		}
	})
}

// fallbackStore is a MemoryStore whose decisions say a fallback made them,
// as a Redis store's do while Redis is unavailable.
type fallbackStore struct{ *core.MemoryStore }

func (s fallbackStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	err := s.MemoryStore.Take(ctx, now, reqs, out)
	for i := range reqs {
		out[i].Fallback = true
	}
	return err
}

// TestFallbackDecisions: decisions a store's fallback made are counted in
// ratelimit_fallback_decisions_total, whatever their outcome, besides
// ratelimit_decisions_total; the store's own decisions are not.
func TestFallbackDecisions(t *testing.T) {
	m, reg := newMetrics(t)
	clk := core.NewFakeClock(t0)
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 1, Window: time.Minute})
	down := core.Must(core.NewWithPolicy(nil, core.WithClock(clk), core.WithObserver(m), core.WithStore(fallbackStore{core.MustMemoryStore(nil)})))
	take(t, down, core.Request{Policy: p, Key: "a", Cost: 1})
	if take(t, down, core.Request{Policy: p, Key: "a", Cost: 1}) {
		t.Fatal("second request admitted")
	}
	up := core.Must(core.NewWithPolicy(nil, core.WithClock(clk), core.WithObserver(m)))
	take(t, up, core.Request{Policy: p, Key: "b", Cost: 1})
	compare(t, reg, `# HELP ratelimit_fallback_decisions_total Decisions a store's fallback made while its backend (Redis) was unavailable, once per rule per request, whatever their outcome; while it grows, each instance limits on its own state.
# TYPE ratelimit_fallback_decisions_total counter
ratelimit_fallback_decisions_total{rule="api"} 2
`, "ratelimit_fallback_decisions_total")
	compare(t, reg, decisionsHelp+decisions("api", 2, 1, 0, 0), "ratelimit_decisions_total")
}

// TestClashCountedOncePerRule: two layers' Resolvers pick one policy for one
// request, a clash answered 500 whose ErrorEvent names the policy twice
// (the listed one and the one it clashes with); ratelimit_errors_total
// counts it once under that rule, as it counts every error.
func TestClashCountedOncePerRule(t *testing.T) {
	m, reg := newMetrics(t)
	pro := core.MustPolicy(core.Rule{Name: "pro", Limit: 10, Window: time.Minute})
	res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return pro, nil })
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 10, Window: time.Minute}, Resolver: res},
		{Key: ratelimit.Header("X-Key"), Rule: core.Rule{Name: "per-key", Limit: 10, Window: time.Minute}, Resolver: res},
	}, ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithObserver(m),
		ratelimit.WithErrorHandler(func(http.ResponseWriter, *http.Request, error) {})))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	r.Header.Set("X-Key", "k")
	w := httptest.NewRecorder()
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 (a clash)", w.Code)
	}
	compare(t, reg, `
# HELP ratelimit_errors_total Errors a store returned (failures, and a full KeepActive store) and refusals for a full shaping waiting room, once per rule.
# TYPE ratelimit_errors_total counter
ratelimit_errors_total{rule="pro"} 1
`, "ratelimit_errors_total")
}
