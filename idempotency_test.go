package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// idemSetup is a Limiter of limit requests per minute per client IP behind
// an Idempotency filter, on a fake clock.
type idemSetup struct {
	clock   *core.FakeClock
	l       *ratelimit.Limiter
	f       *ratelimit.Idempotency
	h       http.Handler
	served  int
	servedM sync.Mutex
}

func newIdemSetup(t *testing.T, limit int64, cfg *ratelimit.IdempotencyConfig) *idemSetup {
	t.Helper()
	s := &idemSetup{clock: core.NewFakeClock(time.Unix(1_800_000_000, 0))}
	s.l = ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: limit, Window: time.Minute},
	}}, ratelimit.WithClock(s.clock)))
	f, err := ratelimit.NewIdempotency(s.l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.f = f
	s.h = f.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.servedM.Lock()
		s.served++
		s.servedM.Unlock()
	}))
	return s
}

func (s *idemSetup) do(method, path, ip, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = ip + ":1234"
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, r)
	return w
}

func TestIdempotencyReplaysAdmittedKey(t *testing.T) {
	s := newIdemSetup(t, 2, nil)
	a := s.do("POST", "/charge", "192.0.2.1", "k1")
	b := s.do("POST", "/charge", "192.0.2.1", "k1")
	if a.Code != 200 || b.Code != 200 {
		t.Fatalf("statuses %d, %d; want 200, 200", a.Code, b.Code)
	}
	for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		if a.Header().Get(h) == "" || a.Header().Get(h) != b.Header().Get(h) {
			t.Errorf("%s: first %q, replay %q; want the same value", h, a.Header().Get(h), b.Header().Get(h))
		}
	}
	if got := a.Header().Get("X-Ratelimit-Remaining"); got != "1" {
		t.Errorf("X-RateLimit-Remaining %q, want 1", got)
	}
	// The replay charged nothing: k2 takes the second unit, k3 is refused.
	if c := s.do("POST", "/charge", "192.0.2.1", "k2"); c.Code != 200 || c.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Errorf("k2: %d remaining %q, want 200 with 0", c.Code, c.Header().Get("X-Ratelimit-Remaining"))
	}
	if c := s.do("POST", "/charge", "192.0.2.1", "k3"); c.Code != http.StatusTooManyRequests {
		t.Errorf("k3: %d, want 429", c.Code)
	}
	if s.served != 3 {
		t.Errorf("handler ran %d times, want 3 (k1 twice, k2)", s.served)
	}
}

func TestIdempotencyRefusalIsNotRemembered(t *testing.T) {
	s := newIdemSetup(t, 1, nil)
	if c := s.do("POST", "/x", "192.0.2.1", "k0").Code; c != 200 {
		t.Fatalf("k0: %d", c)
	}
	if c := s.do("POST", "/x", "192.0.2.1", "k1").Code; c != 429 {
		t.Fatalf("k1 over quota: %d, want 429", c)
	}
	s.clock.Advance(time.Minute)
	if c := s.do("POST", "/x", "192.0.2.1", "k1").Code; c != 200 {
		t.Fatalf("k1 after recovery: %d, want 200 (decided afresh)", c)
	}
	// ...and that decision charged: a new key is refused now.
	if c := s.do("POST", "/x", "192.0.2.1", "k2").Code; c != 429 {
		t.Fatalf("k2: %d, want 429", c)
	}
}

func TestIdempotencyScopedPerClientAndRoute(t *testing.T) {
	s := newIdemSetup(t, 3, nil)
	s.do("POST", "/a", "192.0.2.1", "k1")
	// Another client with the same key is charged, not replayed: its own
	// quota goes from 3 to 2.
	if got := s.do("POST", "/a", "192.0.2.2", "k1").Header().Get("X-Ratelimit-Remaining"); got != "2" {
		t.Errorf("other client, same key: remaining %q, want 2", got)
	}
	// The same client on another path is charged too.
	if got := s.do("POST", "/b", "192.0.2.1", "k1").Header().Get("X-Ratelimit-Remaining"); got != "1" {
		t.Errorf("same client, other path: remaining %q, want 1", got)
	}
	// The same client, path and key is replayed.
	if got := s.do("POST", "/a", "192.0.2.1", "k1").Header().Get("X-Ratelimit-Remaining"); got != "2" {
		t.Errorf("replay: remaining %q, want 2 (the first decision's)", got)
	}
}

func TestIdempotencyTTL(t *testing.T) {
	s := newIdemSetup(t, 10, &ratelimit.IdempotencyConfig{TTL: time.Second})
	s.do("POST", "/x", "192.0.2.1", "k1")
	s.clock.Advance(999 * time.Millisecond)
	if got := s.do("POST", "/x", "192.0.2.1", "k1").Header().Get("X-Ratelimit-Remaining"); got != "9" {
		t.Errorf("within TTL: remaining %q, want 9 (replayed)", got)
	}
	s.clock.Advance(time.Millisecond)
	if got := s.do("POST", "/x", "192.0.2.1", "k1").Header().Get("X-Ratelimit-Remaining"); got != "8" {
		t.Errorf("after TTL: remaining %q, want 8 (charged again)", got)
	}
}

func TestIdempotencyConcurrentRetriesChargeOnce(t *testing.T) {
	s := newIdemSetup(t, 100, nil)
	const n = 64
	var wg sync.WaitGroup
	codes := make([]int, n)
	rem := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := s.do("POST", "/charge", "192.0.2.1", "same")
			codes[i], rem[i] = w.Code, w.Header().Get("X-Ratelimit-Remaining")
		}()
	}
	wg.Wait()
	for i := range n {
		if codes[i] != 200 || rem[i] != "99" {
			t.Fatalf("request %d: %d remaining %q, want 200 with 99", i, codes[i], rem[i])
		}
	}
	if got := s.do("POST", "/charge", "192.0.2.1", "").Header().Get("X-Ratelimit-Remaining"); got != "98" {
		t.Fatalf("after 64 retries of one key: remaining %q, want 98 (charged once)", got)
	}
}

// recordingStore wraps a ReplayStore and records the keys it sees.
type recordingStore struct {
	ratelimit.ReplayStore
	mu   sync.Mutex
	keys []string
}

func (s *recordingStore) Claim(ctx context.Context, key string, hold time.Duration, maxReplays int) ([]byte, string, error) {
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	return s.ReplayStore.Claim(ctx, key, hold, maxReplays)
}

func TestIdempotencyKeyIsHashed(t *testing.T) {
	rs := &recordingStore{ReplayStore: ratelimit.NewMemoryReplayStore(10, nil)}
	s := newIdemSetup(t, 10, &ratelimit.IdempotencyConfig{Store: rs})
	s.do("POST", "/x", "192.0.2.1", "secret-key-value")
	if len(rs.keys) != 1 {
		t.Fatalf("store saw %d keys, want 1", len(rs.keys))
	}
	k := rs.keys[0]
	if strings.Contains(k, "secret") || strings.Contains(k, "192.0.2.1") || len(k) != 32 {
		t.Errorf("store key %q: want 32 hex digits of a hash, with no raw key or address", k)
	}
}

// pendingStore always reports another request holding the claim.
type pendingStore struct{ ratelimit.ReplayStore }

func (pendingStore) Claim(context.Context, string, time.Duration, int) ([]byte, string, error) {
	return nil, "", ratelimit.ErrReplayPending
}

func TestIdempotencyPendingTooLongIsConflict(t *testing.T) {
	s := newIdemSetup(t, 10, &ratelimit.IdempotencyConfig{Store: pendingStore{}, MaxWait: 100 * time.Millisecond})
	var waited time.Duration
	ratelimit.SetIdempotencySleep(s.f, func(_ context.Context, d time.Duration) error { waited += d; return nil })
	w := s.do("POST", "/x", "192.0.2.1", "k1")
	if w.Code != http.StatusConflict {
		t.Fatalf("status %d, want 409", w.Code)
	}
	if waited != 100*time.Millisecond {
		t.Errorf("waited %v, want MaxWait (100ms)", waited)
	}
	if s.served != 0 {
		t.Error("handler ran for a conflicting request")
	}
}

// failingStore fails every call.
type failingStore struct{ ratelimit.ReplayStore }

func (failingStore) Claim(context.Context, string, time.Duration, int) ([]byte, string, error) {
	return nil, "", errors.New("backend down")
}

func TestIdempotencyStoreFailureLimitsAsUsual(t *testing.T) {
	var got error
	s := newIdemSetup(t, 1, &ratelimit.IdempotencyConfig{Store: failingStore{}, OnError: func(_ *http.Request, err error) { got = err }})
	if c := s.do("POST", "/x", "192.0.2.1", "k1").Code; c != 200 {
		t.Fatalf("first: %d", c)
	}
	if got == nil || !strings.Contains(got.Error(), "backend down") {
		t.Errorf("OnError got %v, want the store's error", got)
	}
	// Without the store the retry is charged again, and so refused: never
	// unlimited.
	if c := s.do("POST", "/x", "192.0.2.1", "k1").Code; c != 429 {
		t.Fatalf("retry without a replay store: %d, want 429", c)
	}
}

func TestIdempotencyWithoutKeyIsPlainLimiting(t *testing.T) {
	s := newIdemSetup(t, 1, nil)
	if c := s.do("POST", "/x", "192.0.2.1", "").Code; c != 200 {
		t.Fatalf("first: %d", c)
	}
	if c := s.do("POST", "/x", "192.0.2.1", "").Code; c != 429 {
		t.Fatalf("second without a key: %d, want 429", c)
	}
}

// TestMemoryReplayStoreTimes: a claim whose hold has passed commits
// nothing (as ReplayStore's contract and the Redis store say), and holds
// and TTLs meaning "forever" (time.Duration(math.MaxInt64)) saturate
// instead of wrapping into the past, in the store and through the filter.
func TestMemoryReplayStoreTimes(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	m := ratelimit.NewMemoryReplayStore(10, clock)
	ctx := context.Background()
	forever := time.Duration(math.MaxInt64)

	_, tok, _ := m.Claim(ctx, "late", time.Second, 5)
	clock.Advance(2 * time.Second) // the claim's hold has passed
	if err := m.Commit(ctx, "late", tok, []byte("X: 1\n"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if rec, tok2, _ := m.Claim(ctx, "late", time.Second, 5); tok2 == "" {
		t.Errorf("a commit after its claim expired was stored and replayed (%q)", rec)
	}

	if _, tok, _ := m.Claim(ctx, "held", forever, 5); tok == "" {
		t.Fatal("no claim")
	}
	if _, _, err := m.Claim(ctx, "held", time.Second, 5); !errors.Is(err, ratelimit.ErrReplayPending) {
		t.Errorf("a second claim during one held forever: %v, want ErrReplayPending", err)
	}

	_, tok, _ = m.Claim(ctx, "kept", time.Second, 5)
	if err := m.Commit(ctx, "kept", tok, []byte("X: 1\n"), forever); err != nil {
		t.Fatal(err)
	}
	if rec, tok2, _ := m.Claim(ctx, "kept", time.Second, 5); tok2 != "" || string(rec) != "X: 1\n" {
		t.Errorf("a record kept forever: %q, token %q; want it replayed", rec, tok2)
	}

	s := newIdemSetup(t, 1, &ratelimit.IdempotencyConfig{TTL: forever, MaxWait: forever})
	if a, b := s.do("POST", "/pay", "192.0.2.1", "k1").Code, s.do("POST", "/pay", "192.0.2.1", "k1").Code; a != 200 || b != 200 {
		t.Errorf("a retry with TTL and MaxWait forever: %d then %d, want 200 twice (replayed, charged once)", a, b)
	}
}

func TestMemoryReplayStoreBounded(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	m := ratelimit.NewMemoryReplayStore(2, clock)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		_, tok, err := m.Claim(ctx, k, time.Second, 3)
		if err != nil || tok == "" {
			t.Fatalf("claim %s: %q %v", k, tok, err)
		}
		if err := m.Commit(ctx, k, tok, []byte(k), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2", m.Len())
	}
	if rec, _, _ := m.Claim(ctx, "c", time.Second, 3); string(rec) != "c" {
		t.Errorf("newest key: record %q, want c", rec)
	}
	// A stale token neither commits nor releases.
	_, tok, _ := m.Claim(ctx, "d", time.Second, 3)
	if err := m.Release(ctx, "d", tok+"x"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Claim(ctx, "d", time.Second, 3); !errors.Is(err, ratelimit.ErrReplayPending) {
		t.Errorf("claim after a release with a wrong token: %v, want ErrReplayPending", err)
	}
	clock.Advance(time.Second)
	if _, tok2, err := m.Claim(ctx, "d", time.Second, 3); err != nil || tok2 == "" {
		t.Errorf("claim after the hold expired: %q %v, want a new claim", tok2, err)
	}
}

func TestIdempotencyRefusesConcurrencyLayers(t *testing.T) {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2,
	}}))
	if _, err := ratelimit.NewIdempotency(l, nil); err == nil || !strings.Contains(err.Error(), "InFlight") {
		t.Fatalf("NewIdempotency over a concurrency layer: %v, want an error naming Layer.InFlight", err)
	}
}

// TestIdempotencyReplaysBounded checks that one key is replayed at most
// MaxReplays times: a client that keeps one key gets 1 + MaxReplays handler
// runs per charge, not unlimited ones.
func TestIdempotencyReplaysBounded(t *testing.T) {
	s := newIdemSetup(t, 3, &ratelimit.IdempotencyConfig{MaxReplays: 2})
	codes := ""
	for range 12 {
		codes += fmt.Sprint(s.do("POST", "/login", "192.0.2.1", "k").Code, " ")
	}
	// Each charge buys three runs (one decided, two replayed); the fourth
	// charge is refused, and a refusal is not remembered.
	want := strings.Repeat("200 ", 9) + strings.Repeat("429 ", 3)
	if codes != want {
		t.Fatalf("statuses %q, want %q", codes, want)
	}
	if s.served != 9 {
		t.Fatalf("handler ran %d times, want 9 (3 charges x 3 runs)", s.served)
	}
}

// TestIdempotencyRefusedAfterDecisionIsNotRemembered: a request admitted by
// the store but refused before it is served (a full shaping waiting room)
// is not remembered, so its retry is decided afresh.
// shapedIdem is a Limiter of one shaped request per second per client IP
// with one waiting slot, and an Idempotency filter around it; every delay
// is sent on delays and waited until hold is closed. do sends a POST with
// an idempotency key through the filter, or, with viaFilter false, through
// the Limiter alone.
type shapedIdem struct {
	hold   chan struct{}
	delays chan time.Duration
	served int
	do     func(key string, viaFilter bool) int
}

func newShapedIdem(t *testing.T) *shapedIdem {
	t.Helper()
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "shaped", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute},
	}}, ratelimit.WithClock(clock), ratelimit.WithMaxWaiting(1)))
	s := &shapedIdem{hold: make(chan struct{}), delays: make(chan time.Duration, 8)}
	ratelimit.SetWaitFunc(l, func(ctx context.Context, d time.Duration) error {
		s.delays <- d
		<-s.hold
		return nil
	})
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { s.served++ })
	filtered, plain := f.Handler(next), l.Handler(next)
	s.do = func(key string, viaFilter bool) int {
		r := httptest.NewRequest("POST", "/x", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		if viaFilter {
			filtered.ServeHTTP(w, r)
		} else {
			plain.ServeHTTP(w, r)
		}
		return w.Code
	}
	return s
}

func TestIdempotencyRefusedAfterDecisionIsNotRemembered(t *testing.T) {
	s := newShapedIdem(t)
	do := func(key string) int { return s.do(key, true) }
	if c := do("a"); c != 200 { // the bucket's one unit, no delay
		t.Fatalf("first: %d", c)
	}
	done := make(chan int)
	go func() { done <- do("b") }() // delayed: takes the one waiting slot
	<-s.delays
	if c := do("c"); c != http.StatusTooManyRequests {
		t.Fatalf("with the waiting room full: %d, want 429", c)
	}
	close(s.hold)
	<-done
	// "c" was refused after its decision: its retry is decided again (and
	// delayed like any new request), not replayed as an admission.
	before := s.served
	if c := do("c"); c != 200 {
		t.Fatalf("retry of c: %d, want 200 after its own delay", c)
	}
	if len(s.delays) == 0 {
		t.Fatal("the retry of c was replayed without its shaping delay")
	}
	if s.served != before+1 {
		t.Fatalf("handler ran %d times for the retry, want 1", s.served-before)
	}
}

// TestIdempotencyReplayIsOfTheSameCharge: a key admitted for a request of
// cost 1 is replayed for the same request, never for a costlier one, which
// is decided and charged as usual (or refused, above the capacity).
func TestIdempotencyReplayIsOfTheSameCharge(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "units", Limit: 10, Window: time.Hour},
	}}, ratelimit.WithClock(clock), ratelimit.WithCost(func(r *http.Request) int64 {
		n, _ := strconv.ParseInt(r.URL.Query().Get("units"), 10, 64)
		return max(n, 1)
	})))
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do := func(units string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/export?units="+units, nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i, tc := range []struct {
		units     string
		code      int
		remaining string
	}{
		{"1", 200, "9"},
		{"1", 200, "9"}, // replayed: the same charge, charged nothing
		{"1000000", http.StatusRequestEntityTooLarge, "9"},
		{"5", 200, "4"}, // decided and charged
		{"5", 200, "4"}, // replayed
	} {
		w := do(tc.units)
		if w.Code != tc.code || w.Header().Get("X-RateLimit-Remaining") != tc.remaining {
			t.Fatalf("request %d (%s units): %d, remaining %q; want %d, %q", i, tc.units, w.Code, w.Header().Get("X-RateLimit-Remaining"), tc.code, tc.remaining)
		}
	}
}

// TestIdempotencyScopedPerUser: behind one address, a user's key is not
// replayed for another user, whose own layer decides (and here refuses).
func TestIdempotencyScopedPerUser(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:     ratelimit.User(),
		Rule:    core.Rule{Name: "per-user", Limit: 1, Window: time.Hour},
		IfNoKey: ratelimit.NoKeyRefuse,
	}}, ratelimit.WithClock(clock)))
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	h := f.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := ratelimit.UserFromContext(r.Context())
		runs[u]++
	}))
	do := func(user, key string) int {
		r := httptest.NewRequest("POST", "/send", nil)
		r.RemoteAddr = "198.51.100.7:1" // one office behind one address
		r = r.WithContext(ratelimit.WithUser(r.Context(), user))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i, tc := range []struct {
		user, key string
		code      int
	}{
		{"bob", "b1", 200},
		{"bob", "b2", 429}, // bob's quota is spent
		{"alice", "1", 200},
		{"alice", "1", 200}, // alice's replay
		{"bob", "1", 429},   // alice's key, bob's charge: decided, refused
	} {
		if c := do(tc.user, tc.key); c != tc.code {
			t.Fatalf("request %d (%s, key %s): %d, want %d", i, tc.user, tc.key, c, tc.code)
		}
	}
	if runs["bob"] != 1 || runs["alice"] != 2 {
		t.Fatalf("handler runs %v, want bob 1 and alice 2", runs)
	}
}

// TestIdempotencyFullWaitingRoomChargesNothing: through the filter as
// through Admit, a request refused for a full waiting room is charged
// nothing: the next request's delay counts only the requests admitted.
func TestIdempotencyFullWaitingRoomChargesNothing(t *testing.T) {
	for _, viaFilter := range []bool{false, true} {
		s := newShapedIdem(t)
		s.do("a", viaFilter) // the bucket's one unit, no delay
		done := make(chan struct{})
		go func() { s.do("b", viaFilter); close(done) }() // delayed 1 s: the one waiting slot
		<-s.delays
		for _, k := range []string{"c1", "c2", "c3"} {
			if c := s.do(k, viaFilter); c != http.StatusTooManyRequests {
				t.Fatalf("filter %v: %s with the room full: %d, want 429", viaFilter, k, c)
			}
		}
		close(s.hold)
		<-done
		go s.do("d", viaFilter)
		if d := <-s.delays; d != 2*time.Second {
			t.Fatalf("filter %v: the next delay is %v, want 2s (a and b charged, the refusals not)", viaFilter, d)
		}
	}
}

// A replay sets the rate-limit headers it recorded, replacing those an
// outer Limiter set, as a fresh decision does: never two values per field.
func TestIdempotencyReplaySetsHeaders(t *testing.T) {
	clk := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	outer := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100).Named("global")},
	}, ratelimit.WithClock(clk), ratelimit.WithHeaders(ratelimit.AllHeaders)))
	inner := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(5).Named("charge")},
	}, ratelimit.WithClock(clk), ratelimit.WithHeaders(ratelimit.AllHeaders)))
	idem, err := ratelimit.NewIdempotency(inner, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := outer.Handler(idem.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	do := func() http.Header {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set(ratelimit.IdempotencyKeyHeader, "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
		return w.Header()
	}
	fresh := do()
	replay := do()
	for _, name := range []string{ratelimit.HeaderRateLimitLimit, ratelimit.HeaderRateLimitRemaining, ratelimit.HeaderRateLimitReset, ratelimit.HeaderRateLimit, ratelimit.HeaderRateLimitPolicy} {
		if got, want := replay.Values(name), fresh.Values(name); !slices.Equal(got, want) || len(got) != 1 {
			t.Errorf("replayed response: %s = %q, want the fresh decision's %q", name, got, want)
		}
	}
}

// Through the filter, as through the Limiter alone, the cost function and
// every layer's key are read once per request: a cost or a key read from
// the request and consumed (as a body is) charges what the request said.
func TestIdempotencyReadsKeysAndCostOnce(t *testing.T) {
	for _, viaFilter := range []bool{false, true} {
		clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
		var costs, keys int
		// The account named in the body, consumed as a handler would find it.
		account := func(r *http.Request) (string, error) {
			keys++
			b, _ := io.ReadAll(r.Body)
			if len(b) == 0 {
				return "", ratelimit.ErrNoKey
			}
			return string(b), nil
		}
		units := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "units", Limit: 10, Window: time.Hour},
		}}, ratelimit.WithClock(clock), ratelimit.WithCost(func(r *http.Request) int64 {
			costs++
			b, _ := io.ReadAll(r.Body) // the units asked for, consumed
			n, _ := strconv.ParseInt(string(b), 10, 64)
			return max(n, 1)
		})))
		payments := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: account, Rule: core.Rule{Name: "per-account", Limit: 1, Window: time.Hour},
		}}, ratelimit.WithClock(clock)))
		served := 0
		next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
		hUnits, hPay := units.Handler(next), payments.Handler(next)
		if viaFilter {
			fu, err := ratelimit.NewIdempotency(units, nil)
			if err != nil {
				t.Fatal(err)
			}
			fp, err := ratelimit.NewIdempotency(payments, nil)
			if err != nil {
				t.Fatal(err)
			}
			hUnits, hPay = fu.Handler(next), fp.Handler(next)
		}
		req := func(body, key string) *http.Request {
			r := httptest.NewRequest("POST", "/export", strings.NewReader(body))
			r.RemoteAddr = "192.0.2.1:1"
			r.Header.Set("Idempotency-Key", key)
			return r
		}
		w := httptest.NewRecorder()
		hUnits.ServeHTTP(w, req("8", "u"))
		if got := w.Header().Get("X-RateLimit-Remaining"); got != "2" || costs != 1 {
			t.Errorf("filter %v: a request of 8 units (limit 10): remaining %q, cost read %d times; want 2, once", viaFilter, got, costs)
		}
		served = 0
		for i := range 3 {
			hPay.ServeHTTP(httptest.NewRecorder(), req("acct-42", "p"+strconv.Itoa(i)))
		}
		if served != 1 || keys != 3 {
			t.Errorf("filter %v: three payments of one account (limit 1): served %d, account read %d times; want 1, once each", viaFilter, served, keys)
		}
	}
}

// Filters over different Limiters may share one ReplayStore: a key one of
// them charged is never replayed by another, whose Limiter it did not
// charge. (Two hosts, one path, with distinct and equal rule names; and two
// prefixes stripped to one path.)
func TestIdempotencySharedStoreNeverReplaysAnotherLimitersCharge(t *testing.T) {
	for _, shape := range []string{"hosts", "prefixes", "same names"} {
		clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
		store := ratelimit.NewMemoryReplayStore(0, clock)
		lenientName, strictName := "search", "payout"
		if shape == "same names" {
			lenientName, strictName = "default", "default"
		}
		lenient := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: lenientName, Limit: 1000, Window: time.Hour},
		}}, ratelimit.WithClock(clock)))
		strict := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: strictName, Limit: 1, Window: time.Hour},
		}}, ratelimit.WithClock(clock)))
		fa, err := ratelimit.NewIdempotency(lenient, &ratelimit.IdempotencyConfig{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		fb, err := ratelimit.NewIdempotency(strict, &ratelimit.IdempotencyConfig{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		payouts := 0
		search := fa.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		payout := fb.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { payouts++ }))
		mux := http.NewServeMux()
		searchURL, payoutURL := "http://search.example/submit", "http://payout.example/submit"
		switch shape {
		case "hosts", "same names":
			mux.Handle("POST search.example/submit", search)
			mux.Handle("POST payout.example/submit", payout)
		case "prefixes":
			mux.Handle("POST /search/", http.StripPrefix("/search", search))
			mux.Handle("POST /payout/", http.StripPrefix("/payout", payout))
			searchURL, payoutURL = "http://api.example/search/submit", "http://api.example/payout/submit"
		}
		do := func(url string) int {
			r := httptest.NewRequest("POST", url, nil)
			r.RemoteAddr = "192.0.2.1:1"
			r.Header.Set("Idempotency-Key", "k")
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			return w.Code
		}
		if c := do(searchURL); c != http.StatusOK {
			t.Fatalf("%s: search: %d", shape, c)
		}
		for range 5 {
			do(payoutURL)
		}
		// Its retries are replays of its own admission (the handler runs
		// again, uncharged): the strict Limiter must have been charged.
		r := httptest.NewRequest("POST", payoutURL, nil)
		r.RemoteAddr = "192.0.2.1:1"
		if res := strict.Peek(r); payouts == 0 || len(res.Layers) != 1 || res.Layers[0].Decision.Allowed {
			t.Errorf("%s: the payout handler (1 per hour) ran %d times for a key the search Limiter charged, and the payout Limiter was never charged", shape, payouts)
		}
	}
}

// Nested filters over Limiters with different unnamed rules (both
// "default") sharing one ReplayStore: the inner filter never replays the
// outer one's charge, so the strict inner Limiter is charged.
func TestIdempotencyNestedFiltersSharingStore(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	store := ratelimit.NewMemoryReplayStore(0, clock)
	site := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Limit: 1000, Window: time.Hour},
	}}, ratelimit.WithClock(clock)))
	payout := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Limit: 1, Window: time.Hour},
	}}, ratelimit.WithClock(clock)))
	if runs := nestedPayoutRuns(t, site, payout, &ratelimit.IdempotencyConfig{Store: store}, &ratelimit.IdempotencyConfig{Store: store}); runs != 1 {
		t.Fatalf("5 distinct payouts under a 1-per-hour Limiter: the handler ran %d times", runs)
	}
}

// A '#' in a request-target is part of the path (net/http routes "/pay#x"
// apart from "/pay"): a key charged on one is not replayed on the other.
func TestIdempotencyHashInPathIsAnotherPath(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "writes", Limit: 1, Window: time.Hour},
	}}, ratelimit.WithClock(clock)))
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	codes := []int{}
	for _, target := range []string{"/pay", "/pay#refund"} {
		r := httptest.NewRequest("POST", "http://api.example/", nil)
		r.RequestURI, r.URL.Path = target, target // as the server parses it
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if !slices.Equal(codes, []int{http.StatusOK, http.StatusTooManyRequests}) {
		t.Fatalf("POST /pay, then POST /pay#refund with the same key (limit 1): %v, want [200 429]", codes)
	}
}

// Nested filters sharing a ReplayStore over Limiters whose layers have the
// same rule and key, where the inner layer's Resolver decides the key under
// a stricter policy: with Scopes of their own (as IdempotencyConfig.Scope
// asks of such filters), the inner filter keeps records of its own, so the
// strict policy is charged for every request with a fresh key.
func TestIdempotencyNestedResolverPolicyCharged(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	store := ratelimit.NewMemoryReplayStore(0, clock)
	site := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "api", Limit: 1000, Window: time.Hour},
	}}, ratelimit.WithClock(clock)))
	strict := core.MustPolicy(core.Rule{Name: "api-suspended", Limit: 1, Window: time.Hour})
	payout := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "api", Limit: 1000, Window: time.Hour},
		Resolver: core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return strict, nil }),
	}}, ratelimit.WithClock(clock)))
	if runs := nestedPayoutRuns(t, site, payout, &ratelimit.IdempotencyConfig{Store: store, Scope: "site"}, &ratelimit.IdempotencyConfig{Store: store, Scope: "payout"}); runs != 1 {
		t.Fatalf("5 distinct payouts, the inner layer's Resolver deciding them under 1 per hour: the handler ran %d times", runs)
	}
}

// Nested filters sharing a ReplayStore over two Limiters with the same rule
// and key but their own stores, the outer one in dry-run (trialling the
// rule on a new store), each with its own Scope: the enforcing inner filter
// never replays what the dry run admitted, so its 1 per hour admits 1 of 5
// distinct requests.
func TestIdempotencyNestedUnderDryRunSameRule(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	store := ratelimit.NewMemoryReplayStore(0, clock)
	layers := func() []ratelimit.Layer {
		return []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "payout", Limit: 1, Window: time.Hour}}}
	}
	trial := ratelimit.Must(ratelimit.New(layers(), ratelimit.WithClock(clock), ratelimit.WithDryRun(),
		ratelimit.WithStore(core.MustMemoryStore(nil))))
	enforce := ratelimit.Must(ratelimit.New(layers(), ratelimit.WithClock(clock)))
	if runs := nestedPayoutRuns(t, trial, enforce, &ratelimit.IdempotencyConfig{Store: store, Scope: "trial"}, &ratelimit.IdempotencyConfig{Store: store, Scope: "payout"}); runs != 1 {
		t.Fatalf("5 distinct payouts under an enforcing 1-per-hour Limiter (a dry-run one with the same rule around it): the handler ran %d times", runs)
	}
}

// Two processes, each with a per-process Limiter (its own memory store)
// around a fleet Limiter with the same rule and key on a shared store (as
// Redis would be), their filters sharing one ReplayStore (as the Redis
// ReplayStore would be), each filter with its own Scope. The fleet Limiter
// (1 per hour) is charged for every request: 1 of 2 distinct payouts
// passes.
func TestIdempotencyNestedSameRuleOtherStore(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	replays := ratelimit.NewMemoryReplayStore(0, clock)
	fleetStore := core.MustMemoryStore(nil)
	rule := core.Rule{Name: "payout", Limit: 1, Window: time.Hour}
	runs := 0
	var procs []http.Handler
	for range 2 {
		local := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}},
			ratelimit.WithClock(clock), ratelimit.WithStore(core.MustMemoryStore(nil))))
		fleet := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}},
			ratelimit.WithClock(clock), ratelimit.WithStore(fleetStore)))
		fl, _ := ratelimit.NewIdempotency(local, &ratelimit.IdempotencyConfig{Store: replays, Scope: "local"})
		ff, _ := ratelimit.NewIdempotency(fleet, &ratelimit.IdempotencyConfig{Store: replays, Scope: "fleet"})
		procs = append(procs, fl.Handler(ff.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ }))))
	}
	for i := range 2 {
		r := httptest.NewRequest("POST", "http://api.example/payout", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("Idempotency-Key", "fresh-"+strconv.Itoa(i))
		procs[i].ServeHTTP(httptest.NewRecorder(), r)
	}
	if runs != 1 {
		t.Fatalf("2 distinct payouts under a fleet-wide 1-per-hour Limiter: the handler ran %d times", runs)
	}
}

// Filters over Limiters with different rule sets share no records even for
// a request only their common layer applies to (the other layer is
// route-gated, or its key is absent): the fleet Limiter nested in a
// per-process one with an extra layer is charged for every fresh key.
func TestIdempotencyDifferentRuleSetsShareNothing(t *testing.T) {
	for _, variant := range []string{"routes", "nokey"} {
		t.Run(variant, func(t *testing.T) {
			clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
			replays := ratelimit.NewMemoryReplayStore(0, clock)
			fleetStore := core.MustMemoryStore(nil)
			rule := core.Rule{Name: "payout", Limit: 1, Window: time.Hour}
			extra := ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "admin", Limit: 5, Window: time.Minute}, Routes: []string{"POST /admin"}}
			if variant == "nokey" {
				extra = ratelimit.Layer{Key: ratelimit.Header("X-User"), Rule: core.Rule{Name: "user", Limit: 5, Window: time.Minute}}
			}
			runs := 0
			var procs []http.Handler
			for range 2 {
				local := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}, extra},
					ratelimit.WithClock(clock), ratelimit.WithStore(core.MustMemoryStore(nil))))
				fleet := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}},
					ratelimit.WithClock(clock), ratelimit.WithStore(fleetStore)))
				fl, err := ratelimit.NewIdempotency(local, &ratelimit.IdempotencyConfig{Store: replays})
				if err != nil {
					t.Fatal(err)
				}
				ff, err := ratelimit.NewIdempotency(fleet, &ratelimit.IdempotencyConfig{Store: replays})
				if err != nil {
					t.Fatal(err)
				}
				procs = append(procs, fl.Handler(ff.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ }))))
			}
			for i := range 2 {
				r := httptest.NewRequest("POST", "http://api.example/payout", nil)
				r.Pattern = "POST /payout"
				r.RemoteAddr = "192.0.2.1:1"
				r.Header.Set("Idempotency-Key", "fresh-"+strconv.Itoa(i))
				procs[i].ServeHTTP(httptest.NewRecorder(), r)
			}
			if runs != 1 {
				t.Fatalf("2 distinct payouts under a fleet-wide 1-per-hour Limiter: the handler ran %d times", runs)
			}
		})
	}
}

// idemPayoutReq is a POST /payout from 192.0.2.1 with idempotency key key.
func idemPayoutReq(key string) *http.Request {
	r := httptest.NewRequest("POST", "http://api.example/payout", nil)
	r.Pattern = "POST /payout"
	r.RemoteAddr = "192.0.2.1:1"
	r.Header.Set("X-User", "u1")
	r.Header.Set("Idempotency-Key", key)
	return r
}

// Two processes with equal configuration, the routed layer's Routes listed
// in another order (built from a map, say): the same rules, so a retry
// reaching the other process is replayed.
func TestIdempotencyRoutesAreASet(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	replays := ratelimit.NewMemoryReplayStore(0, clock)
	fleet := core.MustMemoryStore(nil)
	runs := 0
	var procs []http.Handler
	for _, routes := range [][]string{{"POST /payout", "POST /refund"}, {"POST /refund", "POST /payout"}} {
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(),
			Rule: core.Rule{Name: "payout", Limit: 1, Window: time.Hour}, Routes: routes}},
			ratelimit.WithClock(clock), ratelimit.WithStore(fleet)))
		f, err := ratelimit.NewIdempotency(l, &ratelimit.IdempotencyConfig{Store: replays})
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ })))
	}
	a, b := httptest.NewRecorder(), httptest.NewRecorder()
	procs[0].ServeHTTP(a, idemPayoutReq("k"))
	procs[1].ServeHTTP(b, idemPayoutReq("k")) // the client's retry, reaching the other instance
	if a.Code != 200 || b.Code != 200 {
		t.Errorf("first %d, retry on the other instance %d: want 200 and a replay (the same rules: same name, quota and routes)", a.Code, b.Code)
	}
}

// A retry made after SetRules changed the rules is decided afresh, a change
// of MaxDelay alone included.
func TestIdempotencyRetryAfterMaxDelayChangeDecidedAfresh(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "shaped", Algorithm: core.LeakyBucket, Limit: 5, Window: time.Minute, MaxDelay: time.Second}}},
		ratelimit.WithClock(clock)))
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ }))
	h.ServeHTTP(httptest.NewRecorder(), idemPayoutReq("k"))
	r := l.Rules()["shaped"]
	r.MaxDelay = 2 * time.Second
	if err := l.SetRules(map[string]core.Rule{"shaped": r}); err != nil {
		t.Fatal(err)
	}
	// Decided afresh, a request now waits 12 s > MaxDelay 2 s: refused.
	if w := httptest.NewRecorder(); func() int { h.ServeHTTP(w, idemPayoutReq("fresh")); return w.Code }() != http.StatusTooManyRequests {
		t.Fatalf("a fresh key: %d, want 429", w.Code)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, idemPayoutReq("k"))
	if w.Code != http.StatusTooManyRequests {
		t.Errorf("retry after SetRules changed the layer's rule (MaxDelay 1s -> 2s): %d (replayed), want it decided afresh (429) as the Idempotency doc says", w.Code)
	}
}

// nestedPayoutRuns serves five payouts with fresh idempotency keys through
// a filter over outer (configured by oc) around one over inner (ic), and
// returns how many times the handler ran.
func nestedPayoutRuns(t *testing.T, outer, inner *ratelimit.Limiter, oc, ic *ratelimit.IdempotencyConfig) int {
	t.Helper()
	fo, err := ratelimit.NewIdempotency(outer, oc)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := ratelimit.NewIdempotency(inner, ic)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := fo.Handler(fi.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ })))
	for i := range 5 {
		r := httptest.NewRequest("POST", "http://api.example/payout", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("Idempotency-Key", "fresh-"+strconv.Itoa(i)) // a new payout each time
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	return runs
}

// TestMemoryReplayStoreRefusedClaimsForgetNothing checks that requests
// refused (charged nothing, their claims released) with fresh keys in a
// full store do not make it forget other clients' records: a retry of an
// admitted request is still replayed, not charged again.
func TestMemoryReplayStoreRefusedClaimsForgetNothing(t *testing.T) {
	const capacity = 4
	store := ratelimit.NewMemoryReplayStore(capacity, nil)
	s := newIdemSetup(t, 1, &ratelimit.IdempotencyConfig{Store: store})
	clients := []string{"192.0.2.9", "198.51.100.1", "198.51.100.2"}
	for _, ip := range clients {
		if c := s.do("POST", "/pay", ip, "k-"+ip).Code; c != http.StatusOK {
			t.Fatalf("%s's first request: %d", ip, c)
		}
	}
	// An attacker spends its quota (1 a minute) on its first request,
	// which fills the store...
	if c := s.do("POST", "/pay", "192.0.2.66", "a0").Code; c != http.StatusOK {
		t.Fatalf("attacker's first request: %d", c)
	}
	// ...then sends only refused requests with fresh keys.
	for i := 1; i <= 2*capacity; i++ {
		if c := s.do("POST", "/pay", "192.0.2.66", fmt.Sprintf("a%d", i)).Code; c != http.StatusTooManyRequests {
			t.Fatalf("attacker's request %d: %d, want 429", i, c)
		}
	}
	if n := store.Len(); n != capacity {
		t.Fatalf("the store holds %d keys, want %d", n, capacity)
	}
	for _, ip := range clients {
		if c := s.do("POST", "/pay", ip, "k-"+ip).Code; c != http.StatusOK {
			t.Errorf("%s's retry of an admitted request: %d, want 200 (replayed): its record was forgotten", ip, c)
		}
	}
}

// TestIdempotencyClaimReleasedOnPanic: a panic between the claim and its
// outcome (a denied or error handler aborting with http.ErrAbortHandler, a
// panicking Observer or Resolver; net/http recovers it and the server
// keeps running) releases the claim, so a retry with the key is decided
// afresh rather than answered 409 "in progress" until the claim expires.
func TestIdempotencyClaimReleasedOnPanic(t *testing.T) {
	clk := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	panicked := false
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute},
	}}, ratelimit.WithClock(clk), ratelimit.WithLogger(nil),
		ratelimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, _ *ratelimit.Result) {
			if !panicked {
				panicked = true
				panic(http.ErrAbortHandler) // abort the response, as net/http allows
			}
			http.Error(w, "slow down", http.StatusTooManyRequests)
		})))
	f, err := ratelimit.NewIdempotency(l, &ratelimit.IdempotencyConfig{MaxWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ratelimit.SetIdempotencySleep(f, func(context.Context, time.Duration) error { return nil })
	h := f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do := func(key string) (code int) {
		defer func() {
			if p := recover(); p != nil {
				code = -1 // net/http's server recovers it and goes on
			}
		}()
		r := httptest.NewRequest("POST", "/pay", nil)
		r.RemoteAddr = "192.0.2.1:1"
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if c := do(""); c != 200 {
		t.Fatalf("first request: %d", c)
	}
	if c := do("k1"); c != -1 {
		t.Fatalf("refused request: %d, want the denied handler's panic", c)
	}
	if c := do("k1"); c != http.StatusTooManyRequests {
		t.Errorf("retry after the panic: %d, want 429 (decided afresh); the panicked request's claim is still held", c)
	}
}

// A request whose layer key is a key error (400 without the filter) is
// answered as the Limiter answers it, not admitted as a replay of an
// earlier request under the same idempotency key for which that layer, its
// key absent, did not apply; the layers' keys are still read once.
func TestIdempotencyKeyErrorNotReplayed(t *testing.T) {
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	ip, reads := ratelimit.MustClientIP(), 0
	counted := func(r *http.Request) (string, error) { reads++; return ip(r) }
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: counted, Rule: core.Rule{Name: "per-ip", Limit: 1, Window: time.Minute}},
		{Key: ratelimit.Header("X-API-Key"), Rule: core.Rule{Name: "per-key", Limit: 10, Window: time.Minute}},
	}, ratelimit.WithClock(clock), ratelimit.WithLogger(nil)))
	f, err := ratelimit.NewIdempotency(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	h := f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	do := func(apiKey string) int {
		r := httptest.NewRequest("POST", "/pay", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set("Idempotency-Key", "k1")
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if c := do(""); c != http.StatusOK {
		t.Fatalf("first request (no API key): %d, want 200", c)
	}
	long := strings.Repeat("a", ratelimit.MaxHeaderKeyLen+1)
	reads = 0
	if c := do(long); c != http.StatusBadRequest || served != 1 {
		t.Fatalf("a too-long API key under a used idempotency key: status %d, handler runs %d; want 400 and 1 (a key error, as without the filter)", c, served)
	}
	if reads != 1 {
		t.Errorf("the first layer's key was read %d times for the request, want once", reads)
	}
	if c := do(""); c != http.StatusOK || served != 2 {
		t.Fatalf("the first request again: status %d, handler runs %d; want a replay of its admission (200, 2: per-ip allows 1)", c, served)
	}
}
