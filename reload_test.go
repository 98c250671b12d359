package ratelimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// reloadSetup is one per-IP layer on a fake clock with both header sets.
func reloadSetup(t *testing.T, rule core.Rule, opts ...ratelimit.Option) (*ratelimit.Limiter, *core.FakeClock, func(ip string) *httptest.ResponseRecorder) {
	t.Helper()
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	opts = append([]ratelimit.Option{ratelimit.WithClock(clock), ratelimit.WithHeaders(ratelimit.AllHeaders)}, opts...)
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do := func(ip string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = ip + ":1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	return l, clock, do
}

func TestSetRulesKeepsUsage(t *testing.T) {
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			l, _, do := reloadSetup(t, core.Rule{Name: "per-ip", Algorithm: alg, Limit: 5, Window: 10 * time.Minute, Burst: burstFor(alg, 5)})
			for range 3 {
				if c := do("192.0.2.1").Code; c != 200 {
					t.Fatalf("status %d", c)
				}
			}
			if err := l.SetRules(map[string]core.Rule{"per-ip": {Algorithm: alg, Limit: 10, Window: 10 * time.Minute, Burst: burstFor(alg, 10)}}); err != nil {
				t.Fatal(err)
			}
			w := do("192.0.2.1")
			if got := w.Header().Get("X-RateLimit-Limit"); got != "10" {
				t.Errorf("X-RateLimit-Limit %q, want 10", got)
			}
			if got := w.Header().Get("X-RateLimit-Remaining"); got != "6" {
				t.Errorf("X-RateLimit-Remaining %q, want 6: the 3 earlier requests still count", got)
			}
			if got := w.Header().Get("RateLimit-Policy"); !strings.Contains(got, "q=10") {
				t.Errorf("RateLimit-Policy %q, want q=10", got)
			}
			// Another client starts whole under the new rule.
			if got := do("192.0.2.2").Header().Get("X-RateLimit-Remaining"); got != "9" {
				t.Errorf("new client: remaining %q, want 9", got)
			}
		})
	}
}

// burstFor is the Burst that makes an algorithm's capacity limit.
func burstFor(alg core.Algorithm, limit int64) int64 {
	switch alg {
	case core.TokenBucket, core.LeakyBucket:
		return limit
	}
	return 0
}

func TestSetRulesChangesAlgorithmWithoutReset(t *testing.T) {
	l, _, do := reloadSetup(t, core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute})
	for range 4 {
		do("192.0.2.1")
	}
	if err := l.SetRules(map[string]core.Rule{"per-ip": {Algorithm: core.FixedWindow, Limit: 5, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if w := do("192.0.2.1"); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("after the change: %d remaining %q, want 200 with 0", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	if c := do("192.0.2.1").Code; c != http.StatusTooManyRequests {
		t.Fatalf("sixth request: %d, want 429 (no fresh quota)", c)
	}
}

func TestSetRulesRefusesBadInputAndChangesNothing(t *testing.T) {
	l, _, do := reloadSetup(t, core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute})
	cases := []struct {
		name  string
		rules map[string]core.Rule
		want  string
		is    error
	}{
		{"unknown layer", map[string]core.Rule{"per-user": core.PerMinute(1)}, `no layer is named "per-user"`, nil},
		{"renamed", map[string]core.Rule{"per-ip": core.PerMinute(1).Named("other")}, `is named "other"`, nil},
		{"invalid", map[string]core.Rule{"per-ip": {Limit: 0, Window: time.Minute}}, "Limit must be positive", core.ErrInvalidRule},
	}
	for _, c := range cases {
		err := l.SetRules(c.rules)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ratelimit: ") || strings.Count(err.Error(), "ratelimit:") != 1 {
			t.Errorf("%s: %v, want an error with one ratelimit: prefix mentioning %q", c.name, err, c.want)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: %v does not wrap %v", c.name, err, c.is)
		}
	}
	if got := l.Rules()["per-ip"].Limit; got != 5 {
		t.Fatalf("after failed reloads the limit is %d, want 5", got)
	}
	if got := do("192.0.2.1").Header().Get("X-RateLimit-Limit"); got != "5" {
		t.Fatalf("X-RateLimit-Limit %q, want 5", got)
	}
}

type rulesRecorder struct {
	core.NopObserver
	mu     sync.Mutex
	limits [][]int64
}

func (o *rulesRecorder) ObserveRules(ps []*core.Policy) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ls []int64
	for _, p := range ps {
		ls = append(ls, p.Limit())
	}
	o.limits = append(o.limits, ls)
}

func TestSetRulesTellsRulesObserver(t *testing.T) {
	obs := &rulesRecorder{}
	l, _, _ := reloadSetup(t, core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}, ratelimit.WithObserver(obs))
	if err := l.SetRules(map[string]core.Rule{"per-ip": core.PerMinute(7)}); err != nil {
		t.Fatal(err)
	}
	if len(obs.limits) != 2 || obs.limits[0][0] != 5 || obs.limits[1][0] != 7 {
		t.Fatalf("ObserveRules saw %v, want [[5] [7]]", obs.limits)
	}
	// Rules New refuses never apply, and are never reported: neither a
	// rule the store cannot decide nor one refused by a later check.
	obs = &rulesRecorder{}
	if _, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(13).Named("api")}},
		ratelimit.WithStore(pickyStore{core.MustMemoryStore(nil)}), ratelimit.WithObserver(obs)); err == nil {
		t.Fatal("New accepted a rule the store cannot decide")
	}
	if _, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5)}},
		ratelimit.WithStore(takeOnlyStore{core.MustMemoryStore(nil)}), ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithObserver(obs)); err == nil {
		t.Fatal("New accepted WithRefund over a store that cannot refund")
	}
	if len(obs.limits) != 0 {
		t.Fatalf("refused New calls reported rules %v", obs.limits)
	}
}

// takeOnlyStore hides every method of a store but Take.
type takeOnlyStore struct{ s core.Store }

func (o takeOnlyStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return o.s.Take(ctx, now, reqs, out)
}

// TestSetRulesUnderTraffic reloads while 8 goroutines decide requests: every
// response describes one rule set whole (its X-RateLimit-Limit matches its
// RateLimit-Policy), and once SetRules has returned every response is under
// the new rules.
func TestSetRulesUnderTraffic(t *testing.T) {
	l, _, do := reloadSetup(t, core.Rule{Name: "per-ip", Limit: 1_000_000, Window: time.Second})
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Int64
	var badMsg atomic.Value
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ip := "192.0.2." + string(rune('1'+g))
			for !stop.Load() {
				w := do(ip)
				lim, pol := w.Header().Get("X-RateLimit-Limit"), w.Header().Get("RateLimit-Policy")
				if !strings.Contains(pol, "q="+lim+";") {
					bad.Add(1)
					badMsg.Store(lim + " vs " + pol)
				}
			}
		}()
	}
	for i := range 200 {
		limit := int64(1_000_000 + i%2)
		if err := l.SetRules(map[string]core.Rule{"per-ip": {Limit: limit, Window: time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SetRules(map[string]core.Rule{"per-ip": {Limit: 2_000_000, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if got := do("192.0.2.99").Header().Get("X-RateLimit-Limit"); got != "2000000" {
		t.Errorf("after SetRules returned: X-RateLimit-Limit %q, want 2000000", got)
	}
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d responses mixed two rule sets, e.g. %v", n, badMsg.Load())
	}
}

func TestRulesObserverLeavesOutConcurrencyLayers(t *testing.T) {
	obs := &rulesRecorder{}
	ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
	}, ratelimit.WithObserver(obs)))
	if len(obs.limits) != 1 || len(obs.limits[0]) != 1 || obs.limits[0][0] != 5 {
		t.Fatalf("ObserveRules saw %v, want [[5]]: the rate layer alone", obs.limits)
	}
}

// TestSetRulesStaleRequestCreditsNothing: a request still holding the rules
// SetRules replaced (it loaded them before the change) meets a key the new,
// larger rule has charged beyond the old capacity: it is refused, and the
// new rule's state stays as it was, so the window admits its 10, no more.
func TestSetRulesStaleRequestCreditsNothing(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	key := func(r *http.Request) (string, error) {
		if r.Header.Get("X-Stale") != "" {
			close(entered)
			<-release // holds the rules it loaded before SetRules
		}
		return "k", nil
	}
	e := mwNew(t, []ratelimit.Layer{{Key: key, Rule: core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 5, Window: time.Hour}}})
	admitted := 0
	for range 5 {
		if e.do(t, mwReq("192.0.2.1:1")).Code == http.StatusOK {
			admitted++
		}
	}
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, mwReq("192.0.2.1:1", "X-Stale", "1"))
		done <- rec.Code
	}()
	<-entered
	if err := e.l.SetRules(map[string]core.Rule{"api": {Algorithm: core.FixedWindow, Limit: 10, Window: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	for range 4 { // 9 of 10 used
		if e.do(t, mwReq("192.0.2.1:1")).Code == http.StatusOK {
			admitted++
		}
	}
	close(release)
	if code := <-done; code == http.StatusOK {
		admitted++
	}
	for range 20 {
		if e.do(t, mwReq("192.0.2.1:1")).Code == http.StatusOK {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d requests in one window whose limit is 10", admitted)
	}
}

// TestTiersAlternatingCreditNothing: equally named tiers picked per
// request (a free and a pro account behind one client IP) alternate on one
// key: a refused free request leaves the pro state as it was, so pro gets
// its 10 an hour, not 10 more after each free request.
func TestTiersAlternatingCreditNothing(t *testing.T) {
	tiers, err := core.Tiers(func(ctx context.Context, _ string) string {
		u, _ := ratelimit.UserFromContext(ctx)
		return u // "free" or "pro"
	}, map[string]core.Rule{
		"free": {Name: "api", Algorithm: core.FixedWindow, Limit: 2, Window: time.Hour},
		"pro":  {Name: "api", Algorithm: core.FixedWindow, Limit: 10, Window: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "api", Algorithm: core.FixedWindow, Limit: 2, Window: time.Hour}, Resolver: tiers}})
	pro := 0
	for round := 0; round < 3; round++ {
		for range 10 {
			if e.do(t, mwUserReq("192.0.2.1:1", "pro")).Code == http.StatusOK {
				pro++
			}
		}
		if code := e.do(t, mwUserReq("192.0.2.1:1", "free")).Code; code != http.StatusTooManyRequests {
			t.Fatalf("round %d: a free request with 10 in use: %d, want 429", round, code)
		}
	}
	if pro != 10 {
		t.Errorf("admitted %d pro requests in an hour's window of 10", pro)
	}
}

// holdWaitDelay makes l's shaping waits block until release is closed,
// sending each wait's delay on entered first.
func holdWaitDelay(l *ratelimit.Limiter) (entered chan time.Duration, release chan struct{}) {
	entered, release = make(chan time.Duration), make(chan struct{})
	ratelimit.SetWaitFunc(l, func(_ context.Context, d time.Duration) error {
		entered <- d
		<-release
		return nil
	})
	return entered, release
}

// TestSetRulesWaitingRoomRetryAfter checks that a request refused for a
// full waiting room after SetRules lowered MaxDelay is told to retry once
// the request waiting under the old rule has been served, not after the
// new rule's shorter MaxDelay, whether that request holds the room through
// Admit or through Decide and Wait (the flow of framework adapters).
func TestSetRulesWaitingRoomRetryAfter(t *testing.T) {
	for _, viaWait := range []bool{false, true} {
		layers := []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: 10 * time.Second, MaxDelay: time.Minute}}}
		e := mwNew(t, layers, ratelimit.WithMaxWaiting(1))
		entered, release := holdWaitDelay(e.l)
		done := make(chan struct{})
		if viaWait {
			if first := e.l.Decide(mwReq("192.0.2.1:1")); !first.Proceed || first.Delay != 0 {
				t.Fatalf("first request: %+v", first)
			}
			res := e.l.Decide(mwReq("192.0.2.1:1"))
			if !res.Proceed || res.Delay <= 0 {
				t.Fatalf("second request: %+v, want a shaping delay", res)
			}
			go func() { e.l.Wait(context.Background(), &res); close(done) }()
		} else {
			e.do(t, mwReq("192.0.2.1:1")) // served at once
			go func() { e.do(t, mwReq("192.0.2.1:1")); close(done) }()
		}
		waiting := <-entered // 10s: the room's one slot is held that long
		if err := e.l.SetRules(map[string]core.Rule{"shape": {Algorithm: core.LeakyBucket, Limit: 1, Window: 10 * time.Second, MaxDelay: 2 * time.Second}}); err != nil {
			t.Fatal(err)
		}
		rec := e.do(t, mwReq("192.0.2.1:1"))
		close(release)
		<-done
		ra, _ := strconv.Atoi(rec.Header().Get(ratelimit.HeaderRetryAfter))
		if rec.Code != http.StatusTooManyRequests || time.Duration(ra)*time.Second < waiting {
			t.Fatalf("through Wait %v: full room after SetRules: %d Retry-After %ds, but the request holding the room waits %v", viaWait, rec.Code, ra, waiting)
		}
	}
}

// TestWaitRoomFullObserved checks that Wait's refusal for a full waiting
// room (Decide, then Wait) is reported to the Observer, as Admit's is.
func TestWaitRoomFullObserved(t *testing.T) {
	obs := &mwObserver{}
	layers := []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: 10 * time.Second, MaxDelay: time.Minute}}}
	e := mwNew(t, layers, ratelimit.WithMaxWaiting(1), ratelimit.WithObserver(obs))
	entered, release := holdWaitDelay(e.l)
	e.l.Decide(mwReq("192.0.2.1:1"))
	r1, r2 := e.l.Decide(mwReq("192.0.2.1:1")), e.l.Decide(mwReq("192.0.2.1:1"))
	done := make(chan error)
	go func() { done <- e.l.Wait(context.Background(), &r1) }()
	<-entered
	err := e.l.Wait(context.Background(), &r2)
	close(release)
	<-done
	if !errors.Is(err, ratelimit.ErrTooManyWaiting) {
		t.Fatalf("Wait: %v, want ErrTooManyWaiting", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) != 1 || !errors.Is(obs.errs[0].Err, ratelimit.ErrTooManyWaiting) || len(obs.errs[0].Policies) != 1 {
		t.Errorf("a request refused for a full waiting room (Wait): the Observer saw %v, want one ErrTooManyWaiting", obs.errs)
	}
}
