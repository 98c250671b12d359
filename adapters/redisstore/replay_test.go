package redisstore

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newReplayStore returns a ReplayStore on client under prefix.
func newReplayStore(t *testing.T, client redis.UniversalClient, prefix string) *ReplayStore {
	t.Helper()
	s, err := NewReplayStore(client, &ReplayConfig{Prefix: prefix, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReplayStoreClaimCommitRelease(t *testing.T) {
	client, prefix := newClient(t, redistest.Server(t)), uniquePrefix(t)
	s := newReplayStore(t, client, prefix)
	ctx := context.Background()
	rec, tok, err := s.Claim(ctx, "a", 5*time.Second, 3)
	if err != nil || tok == "" || rec != nil {
		t.Fatalf("first claim: %q %q %v, want a token", rec, tok, err)
	}
	if ttl := client.PTTL(ctx, prefix+"%idem:a").Val(); ttl <= 0 || ttl > 5*time.Second {
		t.Errorf("claim PTTL %v, want within (0, 5s]", ttl)
	}
	if _, _, err := s.Claim(ctx, "a", 5*time.Second, 3); !errors.Is(err, ratelimit.ErrReplayPending) {
		t.Fatalf("second claim: %v, want ErrReplayPending", err)
	}
	// A stale token changes nothing.
	if err := s.Commit(ctx, "a", tok+"x", []byte("no"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "a", tok+"x"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "a", 5*time.Second, 3); !errors.Is(err, ratelimit.ErrReplayPending) {
		t.Fatalf("claim after stale calls: %v, want ErrReplayPending", err)
	}
	if err := s.Commit(ctx, "a", tok, []byte("X-Ratelimit-Remaining: 1\n"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if ttl := client.PTTL(ctx, prefix+"%idem:a").Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("record PTTL %v, want about 1h", ttl)
	}
	rec, tok2, err := s.Claim(ctx, "a", 5*time.Second, 3)
	if err != nil || tok2 != "" || string(rec) != "X-Ratelimit-Remaining: 1\n" {
		t.Fatalf("claim of a committed key: %q %q %v, want its record", rec, tok2, err)
	}
	// A record is replayed at most maxReplays times, then claimed anew.
	for i := range 2 {
		if rec, tok, err := s.Claim(ctx, "a", 5*time.Second, 3); err != nil || tok != "" || rec == nil {
			t.Fatalf("replay %d: %q %q %v, want the record", i+2, rec, tok, err)
		}
	}
	if rec, tok, err := s.Claim(ctx, "a", 5*time.Second, 3); err != nil || tok == "" || rec != nil {
		t.Fatalf("after 3 replays: %q %q %v, want a new claim", rec, tok, err)
	}
	// Release frees a claim for the next request.
	_, tok, _ = s.Claim(ctx, "b", 5*time.Second, 3)
	if err := s.Release(ctx, "b", tok); err != nil {
		t.Fatal(err)
	}
	if _, tok, err := s.Claim(ctx, "b", 5*time.Second, 3); err != nil || tok == "" {
		t.Fatalf("claim after release: %q %v, want a new claim", tok, err)
	}
}

// TestReplayAcrossFleet runs two middleware instances sharing one Redis for
// limits and idempotency keys: 64 concurrent requests with one key, spread
// over both, are charged once, and a later retry on either is replayed.
func TestReplayAcrossFleet(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	prefix := uniquePrefix(t)
	var handlers []http.Handler
	for range 2 {
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key:  ratelimit.MustClientIP(),
			Rule: core.Rule{Name: "per-ip", Limit: 100, Window: time.Hour},
		}}, ratelimit.WithStore(newStore(t, client, &Config{Prefix: prefix}))))
		rs := newReplayStore(t, client, prefix)
		f, err := ratelimit.NewIdempotency(l, &ratelimit.IdempotencyConfig{Store: rs, MaxWait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		handlers = append(handlers, f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	}
	do := func(i int, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/charge", nil)
		r.RemoteAddr = "192.0.2.7:1000"
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		handlers[i%2].ServeHTTP(w, r)
		return w
	}
	const n = 64
	var wg sync.WaitGroup
	rem := make([]string, n)
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := do(i, "pay-1")
			codes[i], rem[i] = w.Code, w.Header().Get("X-RateLimit-Remaining")
		}()
	}
	wg.Wait()
	for i := range n {
		if codes[i] != 200 || rem[i] != "99" {
			t.Fatalf("request %d: %d remaining %q, want 200 with 99", i, codes[i], rem[i])
		}
	}
	if got := do(0, "").Header().Get("X-RateLimit-Remaining"); got != "98" {
		t.Fatalf("after 64 retries of one key on two instances: remaining %q, want 98", got)
	}
}

func TestReplayStoreConfig(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	if _, err := NewReplayStore(nil, nil); err == nil {
		t.Error("a nil client was accepted")
	}
	if _, err := NewReplayStore(client, &ReplayConfig{Timeout: -time.Second}); err == nil {
		t.Error("a negative Timeout was accepted")
	}
	s, err := NewReplayStore(client, nil)
	if err != nil || s.prefix != DefaultPrefix+"%idem:" || s.timeout != DefaultTimeout {
		t.Fatalf("defaults: %+v %v", s, err)
	}
}

// TestReplayStoreFaults: a claim whose reply is lost is not retried by the
// client (a retry would find the claim it made and call it another's, or
// count a replay twice); a slow Redis costs a call its Timeout, also for a
// client without ContextTimeoutEnabled; and replay keys never meet a rule's
// keys under the same prefix, even a rule named "idem".
func TestReplayStoreFaults(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	direct := newClient(t, addr)
	// go-redis's default retries (MaxRetries 0 is 3), and no
	// ContextTimeoutEnabled.
	viaProxy := newClient(t, px.Addr(), func(o *redis.Options) { o.MaxRetries = 0 })
	prefix := uniquePrefix(t)
	s, err := NewReplayStore(viaProxy, &ReplayConfig{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, tok, err := s.Claim(ctx, "warm", time.Second, 3); err != nil || tok == "" {
		t.Fatal(tok, err) // loads the script
	}

	px.cutOnce.Store(true)
	if _, _, err := s.Claim(ctx, "fresh", 10*time.Second, 3); err == nil || errors.Is(err, ratelimit.ErrReplayPending) {
		t.Fatalf("a claim whose reply was lost: %v, want the connection's error", err)
	}
	_, tok, err := s.Claim(ctx, "rec", 10*time.Second, 3)
	if err != nil || tok == "" {
		t.Fatal(tok, err)
	}
	if err := s.Commit(ctx, "rec", tok, []byte("X: 1\n"), time.Hour); err != nil {
		t.Fatal(err)
	}
	px.cutOnce.Store(true)
	s.Claim(ctx, "rec", 10*time.Second, 3) // a replay whose reply is lost
	if v := direct.Get(ctx, prefix+"%idem:rec").Val(); v != "d:1:X: 1\n" {
		t.Fatalf("one replay stored as %q, want d:1:...", v)
	}

	fast, err := NewReplayStore(viaProxy, &ReplayConfig{Prefix: prefix, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	px.delay.Store(int64(2 * time.Second))
	start := time.Now()
	_, _, err = fast.Claim(ctx, "slow", time.Second, 3)
	if el := time.Since(start); err == nil || el > time.Second {
		t.Fatalf("a claim with Timeout 100ms and replies 2s late: %v after %v, want an error at the Timeout", err, el)
	}
	px.delay.Store(0)

	st := newStore(t, direct, &Config{Prefix: prefix})
	p := mustPolicy(t, core.Rule{Name: "idem", Limit: 1, Window: time.Hour})
	const k = "0123456789abcdef0123456789abcdef" // a scoped idempotency key's shape
	now := time.Now()
	take(t, st, now, p, k, 1)
	rs, err := NewReplayStore(direct, &ReplayConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, tok, err := rs.Claim(ctx, k, time.Second, 3); err != nil || tok == "" {
		t.Fatal(tok, err)
	}
	if d := take(t, st, now, p, k, 1); d.Allowed {
		t.Fatal("a rule named idem was credited by a replay claim on the same key")
	}
}

// TestReplayStoreForever checks that a hold and a TTL of the longest
// Duration (meaning forever, as MemoryReplayStore reads them) keep the
// claim and the record for about that long, not for the 1 ms a sum
// wrapping into the past gave: replay and the claim would be off.
func TestReplayStoreForever(t *testing.T) {
	client, prefix := newClient(t, redistest.Server(t)), uniquePrefix(t)
	s := newReplayStore(t, client, prefix)
	ctx := context.Background()
	forever := time.Duration(math.MaxInt64)
	if _, tok, err := s.Claim(ctx, "hold", forever, 3); err != nil || tok == "" {
		t.Fatalf("claim: %q %v", tok, err)
	}
	// PTTL in milliseconds as Redis gives it (go-redis's Duration would
	// overflow).
	century := int64(100 * 365 * 24 * time.Hour / time.Millisecond)
	if ms, err := client.Do(ctx, "PTTL", prefix+"%idem:hold").Int64(); err != nil || ms < century {
		t.Errorf("a claim held for the longest Duration: PTTL %d ms (%v), want centuries", ms, err)
	}
	_, tok, err := s.Claim(ctx, "rec", time.Second, 3)
	if err != nil || tok == "" {
		t.Fatalf("claim: %q %v", tok, err)
	}
	if err := s.Commit(ctx, "rec", tok, []byte("X-Ratelimit-Remaining: 1\n"), forever); err != nil {
		t.Fatal(err)
	}
	if ms, err := client.Do(ctx, "PTTL", prefix+"%idem:rec").Int64(); err != nil || ms < century {
		t.Errorf("a record kept for the longest Duration: PTTL %d ms (%v), want centuries", ms, err)
	}
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 1}, {1, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2}, {forever, int64(forever/time.Millisecond) + 1}} {
		if got := millis(c.d); got != c.want {
			t.Errorf("millis(%d) = %d, want %d", c.d, got, c.want)
		}
	}
}
