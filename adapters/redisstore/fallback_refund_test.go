package redisstore

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestRefundOfFallbackCharges checks that a charge the Fallback made is
// refunded to the Fallback, never to Redis, which never saw it: with
// WithRefund counting only failed logins, three successful logins decided
// by the Fallback while the breaker was open, then refunded, gave three
// units back in Redis, taken from the failed logins that had exhausted
// the key there.
func TestRefundOfFallbackCharges(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	prefix := uniquePrefix(t)
	fallback := core.MustMemoryStore(nil)
	s := newStore(t, newClient(t, px.Addr(), func(o *redis.Options) { o.MaxRetries = -1 }), &Config{
		Prefix:     prefix,
		ClientTime: true,
		Timeout:    40 * time.Millisecond,
		Breaker:    &BreakerConfig{Failures: 1, OpenFor: time.Hour},
		Fallback:   fallback,
	})
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	rule := core.Rule{Name: "login", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour}
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Header("X-User"), Rule: rule}},
		ratelimit.WithStore(s), ratelimit.WithClock(clk), ratelimit.WithRefund(ratelimit.RefundSuccessful), ratelimit.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.Header.Get("X-Status"))
		w.WriteHeader(code)
	}))
	login := func(status int) int {
		r := httptest.NewRequest("POST", "/login", nil)
		r.Header.Set("X-User", "alice")
		r.Header.Set("X-Status", strconv.Itoa(status))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	codes := ""
	for range 4 {
		codes += strconv.Itoa(login(http.StatusUnauthorized)) + " "
	}
	if codes != "401 401 401 429 " {
		t.Fatalf("failed logins: %s", codes)
	}
	// A slow moment opens the breaker; Redis answers at once again.
	px.delay.Store(int64(300 * time.Millisecond))
	trip := mustPolicy(t, core.Rule{Name: "trip", Limit: 10, Window: time.Hour})
	var out [1]core.Decision
	_ = s.Take(context.Background(), clk.Now(), []core.Request{{Policy: trip, Key: "x", Cost: 1}}, out[:])
	px.delay.Store(0)
	if st := s.State(); st != BreakerOpen {
		t.Fatalf("breaker %v, want open", st)
	}
	// The Fallback admits, charges and (the logins succeed) refunds three.
	for i := range 3 {
		if c := login(http.StatusOK); c != http.StatusOK {
			t.Fatalf("login %d during the outage: %d", i, c)
		}
	}
	// Redis still holds the failed logins' three units.
	direct := newStore(t, newClient(t, addr), &Config{Prefix: prefix, ClientTime: true})
	p := l.Rules()["login"]
	pol := mustPolicy(t, p)
	var peek [1]core.Decision
	if err := direct.Peek(context.Background(), clk.Now(), []core.Request{{Policy: pol, Key: "alice", Cost: 1}}, peek[:]); err != nil {
		t.Fatal(err)
	}
	if peek[0].Allowed || peek[0].Remaining != 0 {
		t.Fatalf("alice in Redis after the outage: %+v, want exhausted (Redis admitted nothing since)", peek[0])
	}
	// And the Fallback holds none: its charges were refunded to it.
	if err := fallback.Peek(context.Background(), clk.Now(), []core.Request{{Policy: pol, Key: "alice", Cost: 1}}, peek[:]); err != nil || peek[0].Remaining != 2 {
		t.Fatalf("alice in the Fallback: %+v, %v; want 3 whole less this request", peek[0], err)
	}
}

// TestRefundFallbackRouting checks Refund's routing of charges marked as
// the Fallback's (Request.Fallback): to the Fallback; refused without one,
// with one that cannot refund, and in a batch mixing the two; and a
// MemoryStore refuses them as a store without a fallback.
func TestRefundFallbackRouting(t *testing.T) {
	p := mustPolicy(t, core.Rule{Name: "api", Limit: 3, Window: time.Hour, Algorithm: core.FixedWindow})
	q := mustPolicy(t, core.Rule{Name: "other", Limit: 3, Window: time.Hour})
	at := time.Unix(1_800_000_000, 0)
	ctx := context.Background()
	fb := core.MustMemoryStore(nil)
	s := newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: fb})
	var out [2]core.Decision
	if err := s.Take(ctx, at, []core.Request{{Policy: p, Key: "k", Cost: 2}, {Policy: q, Key: "k", Cost: 1}}, out[:]); err != nil || !out[0].Allowed || !out[0].Fallback || !out[1].Fallback {
		t.Fatalf("Take with Redis down: %+v, %v; want allowed by the Fallback, marked", out, err)
	}
	if err := s.Refund(ctx, at, []core.Request{{Policy: p, Key: "k", Cost: 2, ChargedAt: at, Fallback: true}}); err != nil {
		t.Fatalf("refund of the Fallback's charge: %v", err)
	}
	if d := take(t, fb, at, p, "k", 3); !d.Allowed {
		t.Fatalf("the Fallback after the refund: %+v, want its 3 units back", d)
	}
	mixed := []core.Request{{Policy: p, Key: "k", Cost: 1, Fallback: true}, {Policy: q, Key: "k", Cost: 1}}
	if err := s.Refund(ctx, at, mixed); !errors.Is(err, errMixedRefund) {
		t.Fatalf("mixed batch: %v", err)
	}
	mixed[0].Fallback, mixed[1].Fallback = false, true
	if err := s.Refund(ctx, at, mixed); !errors.Is(err, errMixedRefund) {
		t.Fatalf("mixed batch, Fallback second: %v", err)
	}
	marked := []core.Request{{Policy: p, Key: "k", Cost: 1, Fallback: true}}
	if err := newStore(t, deadClient(t), &Config{ClientTime: true}).Refund(ctx, at, marked); !errors.Is(err, core.ErrFallbackCharge) {
		t.Fatalf("store without a Fallback: %v", err)
	}
	if err := newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: takeOnly{fb}}).Refund(ctx, at, marked); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("Fallback that cannot refund: %v", err)
	}
	if err := fb.Refund(ctx, at, marked); !errors.Is(err, core.ErrFallbackCharge) {
		t.Fatalf("MemoryStore: %v", err)
	}
}

// takeOnly hides every method of a store but Take.
type takeOnly struct{ s core.Store }

func (o takeOnly) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	return o.s.Take(ctx, now, reqs, out)
}

// TestRefundByFallbackThatCannotRefundReported: WithRefund over a store
// whose Fallback cannot refund (Redis down, the Fallback charged): the
// refund fails with an error wrapping core.ErrUnsupported and the charge
// stays, which is reported to the Observer like any failed refund.
func TestRefundByFallbackThatCannotRefundReported(t *testing.T) {
	var rec errorRecorder
	s := newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: takeOnly{core.MustMemoryStore(nil)}})
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Header("X-User"), Rule: core.Rule{Name: "login", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour}}},
		ratelimit.WithStore(s), ratelimit.WithClock(core.NewFakeClock(time.Unix(1_800_000_000, 0))), ratelimit.WithObserver(&rec),
		ratelimit.WithRefund(func(*http.Request, int) bool { return true }))
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/login", nil)
	r.Header.Set("X-User", "alice")
	w := httptest.NewRecorder()
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var refunds int
	for _, e := range rec.errs {
		if errors.Is(e, core.ErrUnsupported) {
			refunds++
		}
	}
	if refunds != 1 {
		t.Errorf("the failed refund reported %d times; errors: %v", refunds, rec.errs)
	}
}
