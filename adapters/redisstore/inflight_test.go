package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newInFlight returns an InFlight over client with a unique prefix unless
// cfg sets one, closed when t ends.
func newInFlight(t *testing.T, client redis.UniversalClient, cfg InFlightConfig) *InFlight {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = uniquePrefix(t)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	f, err := NewInFlight(client, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// acquireOne asks f for a slot of key under "conc" with limit n.
func acquireOne(t *testing.T, f *InFlight, key string, n int64) (func(), core.SlotDecision) {
	t.Helper()
	var out [1]core.SlotDecision
	rel, err := f.Acquire(context.Background(), []core.SlotRequest{{Name: "conc", Key: key, Limit: n}}, out[:])
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return rel, out[0]
}

// members returns the number of slot ids in the sorted set of key.
func members(t *testing.T, c *redis.Client, f *InFlight, name, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), redisKey(f.prefix, escapeName(name), "", &core.Request{Key: key})).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInFlightAcquireRelease(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	f := newInFlight(t, c, InFlightConfig{})
	r1, d1 := acquireOne(t, f, "alice", 2)
	r2, d2 := acquireOne(t, f, "alice", 2)
	r3, d3 := acquireOne(t, f, "alice", 2)
	if r1 == nil || r2 == nil || r3 != nil {
		t.Fatalf("admitted %v %v %v, want true true false", r1 != nil, r2 != nil, r3 != nil)
	}
	if d1.InFlight != 1 || d2.InFlight != 2 || d3.InFlight != 2 || d3.Allowed || d3.Limit != 2 {
		t.Fatalf("decisions %+v %+v %+v", d1, d2, d3)
	}
	if f.Held() != 2 {
		t.Fatalf("Held %d, want 2", f.Held())
	}
	r1()
	r1() // a second call removes nothing
	if got := members(t, c, f, "conc", "alice"); got != 1 {
		t.Fatalf("%d slots after one release (called twice), want 1", got)
	}
	r4, _ := acquireOne(t, f, "alice", 2)
	if r4 == nil {
		t.Fatal("refused after a release")
	}
	r2()
	r4()
	if got := members(t, c, f, "conc", "alice"); got != 0 || f.Held() != 0 {
		t.Fatalf("%d slots, %d held after every release", got, f.Held())
	}
}

func TestInFlightAllOrNothing(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	f := newInFlight(t, c, InFlightConfig{})
	rb, _ := f.Acquire(context.Background(), []core.SlotRequest{{Name: "b", Key: "k", Limit: 1}}, make([]core.SlotDecision, 1))
	if rb == nil {
		t.Fatal("refused")
	}
	out := make([]core.SlotDecision, 2)
	rel, err := f.Acquire(context.Background(), []core.SlotRequest{{Name: "a", Key: "k", Limit: 5}, {Name: "b", Key: "k", Limit: 1}}, out)
	if err != nil || rel != nil {
		t.Fatalf("batch with a full key: %v %v, want a refusal", rel != nil, err)
	}
	if !out[0].Allowed || out[0].InFlight != 0 || out[1].Allowed || out[1].InFlight != 1 {
		t.Fatalf("decisions %+v", out)
	}
	if got := members(t, c, f, "a", "k"); got != 0 {
		t.Fatalf("the refused batch took %d slots of a", got)
	}
	rb()
}

// TestInFlightExpiryAfterDeath: a process that dies without releasing (its
// renewer stopped) frees its slots at their expiry, not before.
func TestInFlightExpiryAfterDeath(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	clk := core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	prefix := uniquePrefix(t)
	dead := newInFlight(t, c, InFlightConfig{Prefix: prefix, Clock: clk, Expiry: 30 * time.Second})
	alive := newInFlight(t, c, InFlightConfig{Prefix: prefix, Clock: clk, Expiry: 30 * time.Second})
	for range 2 {
		if rel, _ := acquireOne(t, dead, "alice", 2); rel == nil {
			t.Fatal("refused")
		}
	}
	dead.Close() // dies: no renewal, no release
	clk.Advance(30*time.Second - time.Millisecond)
	if rel, d := acquireOne(t, alive, "alice", 2); rel != nil || d.InFlight != 2 {
		t.Fatalf("before the expiry: admitted %v, in flight %d; want a refusal", rel != nil, d.InFlight)
	}
	clk.Advance(time.Millisecond)
	rel, d := acquireOne(t, alive, "alice", 2)
	if rel == nil || d.InFlight != 1 {
		t.Fatalf("at the expiry: admitted %v, in flight %d; want the dead slots gone", rel != nil, d.InFlight)
	}
	rel()
	if _, err := dead.Acquire(context.Background(), []core.SlotRequest{{Name: "conc", Key: "x", Limit: 1}}, make([]core.SlotDecision, 1)); !errors.Is(err, ErrInFlightClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// TestInFlightRenewal: a request running longer than the expiry keeps its
// slot while it is renewed; one renewed too late is lost, not revived.
func TestInFlightRenewal(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	clk := core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	prefix := uniquePrefix(t)
	a := newInFlight(t, c, InFlightConfig{Prefix: prefix, Clock: clk, Expiry: 30 * time.Second})
	b := newInFlight(t, c, InFlightConfig{Prefix: prefix, Clock: clk, Expiry: 30 * time.Second})
	rel, _ := acquireOne(t, a, "alice", 1)
	if rel == nil {
		t.Fatal("refused")
	}
	for range 4 { // 80 s in all, renewed every 20 s
		clk.Advance(20 * time.Second)
		a.renewAll()
	}
	if r, _ := acquireOne(t, b, "alice", 1); r != nil {
		t.Fatal("a renewed slot was taken by another process after 80 s")
	}
	if a.Lost() != 0 {
		t.Fatalf("Lost %d", a.Lost())
	}
	clk.Advance(31 * time.Second) // the renewer missed its turn
	rb, _ := acquireOne(t, b, "alice", 1)
	if rb == nil {
		t.Fatal("an expired slot still counts")
	}
	a.renewAll()
	if a.Lost() != 1 {
		t.Fatalf("Lost %d, want 1", a.Lost())
	}
	// a's late release removes a's slot id only: b's slot stays.
	rel()
	if got := members(t, c, a, "conc", "alice"); got != 1 {
		t.Fatalf("%d slots after the expired slot's release, want b's 1", got)
	}
	if r, _ := acquireOne(t, a, "alice", 1); r != nil {
		t.Fatal("the late release freed b's slot")
	}
	rb()
}

// TestInFlightReleaseDuringRenewalNotLost: a slot released while a
// renewal round that saw it held is under way is not counted as lost: it
// was given back, not expired.
func TestInFlightReleaseDuringRenewalNotLost(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	parked, resume := make(chan struct{}), make(chan struct{})
	clk := &hookClock{hook: func(n int64) {
		if n == 2 { // the renewal, after its round's snapshot
			close(parked)
			<-resume
		}
	}}
	// The background renewer waits 10 s: the test runs the round itself.
	f := newInFlight(t, c, InFlightConfig{Clock: clk})
	rel, _ := acquireOne(t, f, "alice", 1) // the first clock read
	if rel == nil {
		t.Fatal("refused")
	}
	renewed := make(chan struct{})
	go func() { f.renewAll(); close(renewed) }()
	<-parked
	rel()
	close(resume)
	<-renewed
	if n := f.Lost(); n != 0 {
		t.Fatalf("Lost %d after a slot released during its renewal, want 0", n)
	}
}

// TestInFlightRenewerRuns uses a short real expiry: a slot held for several
// expiries stays held while its renewer runs.
func TestInFlightRenewerRuns(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	prefix := uniquePrefix(t)
	// Real time: the renewer runs every 60 ms against a 600 ms expiry, so a
	// stall of half a second on a loaded machine is still no expiry.
	a := newInFlight(t, c, InFlightConfig{Prefix: prefix, Expiry: 600 * time.Millisecond, RenewEvery: 60 * time.Millisecond})
	b := newInFlight(t, c, InFlightConfig{Prefix: prefix, Expiry: 600 * time.Millisecond})
	rel, _ := acquireOne(t, a, "alice", 1)
	if rel == nil {
		t.Fatal("refused")
	}
	deadline := time.Now().Add(1500 * time.Millisecond) // 2.5 expiries
	for time.Now().Before(deadline) {
		if r, _ := acquireOne(t, b, "alice", 1); r != nil {
			t.Fatal("a renewed slot expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rel()
	if r, _ := acquireOne(t, b, "alice", 1); r == nil {
		t.Fatal("refused after the release")
	} else {
		r()
	}
}

// TestInFlightExactUnderConcurrency: 64 goroutines of 4 processes on one
// key with a limit of 5 hold exactly 5 slots.
func TestInFlightExactUnderConcurrency(t *testing.T) {
	const goroutines, limit = 64, 5
	c := newClient(t, redistest.Server(t))
	prefix := uniquePrefix(t)
	var stores [4]*InFlight
	for i := range stores {
		stores[i] = newInFlight(t, c, InFlightConfig{Prefix: prefix})
	}
	var (
		mu   sync.Mutex
		rels []func()
		wg   sync.WaitGroup
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out [1]core.SlotDecision
			rel, err := stores[g%4].Acquire(context.Background(), []core.SlotRequest{{Name: "conc", Key: "k", Limit: limit}}, out[:])
			if err != nil {
				t.Error(err)
				return
			}
			if rel != nil {
				mu.Lock()
				rels = append(rels, rel)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(rels) != limit {
		t.Fatalf("admitted %d, want %d", len(rels), limit)
	}
	for _, rel := range rels {
		rel()
	}
	if got := members(t, c, stores[0], "conc", "k"); got != 0 {
		t.Fatalf("%d slots after every release", got)
	}
}

// TestInFlightLimiter runs a concurrency layer and a rate layer over Redis
// through the middleware: a request refused by the concurrency layer is
// answered 429 and charges nothing.
func TestInFlightLimiter(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	slots := newInFlight(t, c, InFlightConfig{})
	store := newStore(t, c, nil)
	l, err := ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 10, Window: time.Hour}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1},
	}, ratelimit.WithStore(store), ratelimit.WithSlotStore(slots), ratelimit.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-gate
		}
	}))
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/slow", nil))
		done <- rec.Code
	}()
	<-started
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fast", nil))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("second request: %d Retry-After %q, want 429 and 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	close(gate)
	if code := <-done; code != 200 {
		t.Fatalf("slow request: %d", code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fast", nil))
	if rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "0" {
		// in-flight speaks with 0 left (this request holds the only slot).
		t.Fatalf("after: %d remaining %q", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	d := take(t, store, time.Now(), core.MustPolicy(core.Rule{Name: "rate", Limit: 10, Window: time.Hour}), "192.0.2.1", 1)
	if d.Remaining != 7 {
		t.Fatalf("rate remaining %d after 3 charged requests, want 7 (the refused one charged nothing)", d.Remaining)
	}
	if slots.Held() != 0 {
		t.Fatalf("%d held after every request", slots.Held())
	}
}

func TestInFlightConfigErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, cfg := range []InFlightConfig{
		{Expiry: time.Millisecond},
		{Expiry: time.Second, RenewEvery: time.Second},
		{RenewEvery: -1},
		{Timeout: -1},
	} {
		if f, err := NewInFlight(c, &cfg); err == nil {
			f.Close()
			t.Errorf("%+v accepted", cfg)
		}
	}
	if _, err := NewInFlight(nil, nil); err == nil {
		t.Error("nil client accepted")
	}
}

// TestInFlightCluster acquires two limits whose keys hash to different
// Cluster slots: one key after another, all or nothing, never CROSSSLOT.
func TestInFlightCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starting a cluster takes 2 s")
	}
	c := newClusterClient(t, redistest.Cluster(t))
	f := newInFlight(t, c, InFlightConfig{})
	a := core.SlotRequest{Name: "a", Key: "k1", Limit: 5}
	b := core.SlotRequest{Name: "b", Key: "k2", Limit: 1}
	ka := redisKey(f.prefix, "a", "", &core.Request{Key: "k1"})
	kb := redisKey(f.prefix, "b", "", &core.Request{Key: "k2"})
	if slot(ka) == slot(kb) {
		t.Fatalf("test keys share slot %d", slot(ka))
	}
	card := func(k string) int64 {
		n, err := c.ZCard(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	out := make([]core.SlotDecision, 2)
	rel, err := f.Acquire(context.Background(), []core.SlotRequest{a, b}, out)
	if err != nil || rel == nil {
		t.Fatalf("first: %v %v", rel != nil, err)
	}
	if card(ka) != 1 || card(kb) != 1 || out[0].InFlight != 1 || out[1].InFlight != 1 {
		t.Fatalf("slots %d %d, decisions %+v", card(ka), card(kb), out)
	}
	rel2, err := f.Acquire(context.Background(), []core.SlotRequest{a, b}, out)
	if err != nil || rel2 != nil {
		t.Fatalf("second: %v %v, want a refusal", rel2 != nil, err)
	}
	if card(ka) != 1 || out[1].Allowed || out[0].InFlight != 1 {
		t.Fatalf("after the refusal a holds %d, decisions %+v; want a given back", card(ka), out)
	}
	rel()
	rel()
	if card(ka) != 0 || card(kb) != 0 {
		t.Fatalf("after release: %d %d", card(ka), card(kb))
	}
}

// TestInFlightRedisDown: a failing acquisition is a backend error (never a
// slot held by nobody), answered by the Limiter's fail policy.
func TestInFlightRedisDown(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	f := newInFlight(t, c, InFlightConfig{Timeout: 200 * time.Millisecond})
	rel, err := f.Acquire(context.Background(), []core.SlotRequest{{Name: "conc", Key: "k", Limit: 1}}, make([]core.SlotDecision, 1))
	if err == nil || rel != nil {
		t.Fatalf("Acquire with Redis down: %v %v, want an error", rel != nil, err)
	}
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1}},
		ratelimit.WithSlotStore(f), ratelimit.WithFailClosed(), ratelimit.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	l.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed with Redis down: %d, want 503", rec.Code)
	}
	f.Close()
	if f.Failures() == 0 {
		t.Fatal("the background releases after the failures were not counted")
	}
}

// TestInFlightRing: on a Ring, whose shards each hold some keys, a
// request's keys are taken one after another (they share no hash tag), so
// a per-user slot set lives on one shard and its limit holds.
func TestInFlightRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{
		"a": redistest.Server(t), "b": redistest.Server(t),
	}})
	t.Cleanup(func() { ring.Close() })
	f := newInFlight(t, ring, InFlightConfig{})
	admitted := 0
	for i := 0; i < 20; i++ {
		var out [2]core.SlotDecision
		rel, err := f.Acquire(context.Background(), []core.SlotRequest{
			{Name: "ip", Key: fmt.Sprintf("10.0.0.%d", i), Limit: 100},
			{Name: "user", Key: "u", Limit: 1},
		}, out[:])
		if err != nil {
			t.Fatal(err)
		}
		if rel != nil {
			admitted++ // never released: every admitted request stays in flight
		}
	}
	if admitted != 1 {
		t.Fatalf("user u (limit 1) holds %d slots at once on a Ring, want 1", admitted)
	}
}

// TestInFlightTimeoutWithoutContextTimeout: Acquire is bounded by Timeout
// for a client that does not bound its I/O by the context (go-redis's
// default), and the slot an abandoned acquisition took is given back once
// it has ended.
func TestInFlightTimeoutWithoutContextTimeout(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	c := newClient(t, px.Addr()) // ContextTimeoutEnabled unset
	f := newInFlight(t, c, InFlightConfig{Timeout: 100 * time.Millisecond})
	req := []core.SlotRequest{{Name: "conc", Key: "k", Limit: 5}}
	if _, err := f.Acquire(context.Background(), req, make([]core.SlotDecision, 1)); err != nil {
		t.Fatal(err) // loads the script; this slot stays held
	}
	px.delay.Store(int64(2 * time.Second))
	start := time.Now()
	_, err := f.Acquire(context.Background(), req, make([]core.SlotDecision, 1))
	if el := time.Since(start); err == nil || el > time.Second {
		t.Fatalf("Acquire with Timeout 100ms and replies 2s late: %v after %v, want an error at the Timeout", err, el)
	}
	px.delay.Store(0)
	f.Close() // waits for the abandoned acquisition and its release
	direct := newClient(t, addr)
	if n := direct.ZCard(context.Background(), f.prefix+"conc:k").Val(); n != 1 {
		t.Fatalf("%d slots held after the abandoned acquisition ended, want 1 (the first)", n)
	}
}

// hookClock is the system clock calling hook with the count of its reads
// before each.
type hookClock struct {
	n    atomic.Int64
	hook func(n int64)
}

func (c *hookClock) Now() time.Time { c.hook(c.n.Add(1)); return time.Now() }

// keyByKey is an InFlight on a one-shard Ring behind px (ContextTimeoutEnabled
// unset), whose two-key requests reqs are taken key by key (they share no
// hash tag), with a Timeout of 100ms and a clock calling hook on each read,
// whose first Acquire and release (which load the scripts) are done.
// noSlots fails the test unless reqs' keys hold no slot.
type keyByKey struct {
	f       *InFlight
	px      *proxy
	reqs    []core.SlotRequest
	noSlots func(when string)
}

func newKeyByKey(t *testing.T, hook func(n int64)) *keyByKey {
	t.Helper()
	addr := redistest.Server(t)
	k := &keyByKey{px: newProxy(t, addr), reqs: []core.SlotRequest{{Name: "ip", Key: "1.2.3.4", Limit: 100}, {Name: "user", Key: "u", Limit: 100}}}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": k.px.Addr()}})
	t.Cleanup(func() { ring.Close() })
	k.f = newInFlight(t, ring, InFlightConfig{Timeout: 100 * time.Millisecond, Clock: &hookClock{hook: hook}})
	rel, err := k.f.Acquire(context.Background(), k.reqs, make([]core.SlotDecision, 2))
	if err != nil || rel == nil {
		t.Fatal(err)
	}
	rel()
	direct := newClient(t, addr)
	k.noSlots = func(when string) {
		t.Helper()
		for _, key := range []string{"ip:1.2.3.4", "user:u"} {
			if n := direct.ZCard(context.Background(), k.f.prefix+key).Val(); n != 0 {
				t.Fatalf("%s holds %d slots %s, want 0", key, n, when)
			}
		}
	}
	return k
}

// TestInFlightTimeoutKeyByKey: keys taken one after another (a Ring, no
// common hash tag) keep Acquire within its Timeout when a later key's call
// is abandoned: the keys taken before are given back in the background.
func TestInFlightTimeoutKeyByKey(t *testing.T) {
	var k *keyByKey
	k = newKeyByKey(t, func(n int64) {
		if n == 4 { // the second key of the second Acquire
			k.px.delay.Store(int64(2 * time.Second))
		}
	})
	start := time.Now()
	_, err := k.f.Acquire(context.Background(), k.reqs, make([]core.SlotDecision, 2))
	el := time.Since(start)
	k.px.delay.Store(0)
	if err == nil || el > time.Second {
		t.Fatalf("Acquire with Timeout 100ms, Redis slow after the first key: %v after %v, want an error at the Timeout", err, el)
	}
	k.f.Close() // waits for the background release and the abandoned call
	k.noSlots("after the failed Acquire")
}

// TestInFlightCloseDuringKeyByKeyAcquire: an Acquire that fails while
// Close runs, keys taken one after another, still gives back the keys it
// took before Close returns.
func TestInFlightCloseDuringKeyByKeyAcquire(t *testing.T) {
	var k *keyByKey
	parked, resume := make(chan struct{}), make(chan struct{})
	k = newKeyByKey(t, func(n int64) {
		if n == 4 { // the second key of the second Acquire: the first is taken
			k.px.delay.Store(int64(time.Second))
			close(parked)
			<-resume
		}
	})
	errc := make(chan error, 1)
	go func() {
		_, err := k.f.Acquire(context.Background(), k.reqs, make([]core.SlotDecision, 2))
		errc <- err
	}()
	<-parked
	closed := make(chan struct{})
	go func() { k.f.Close(); close(closed) }()
	for { // Close has begun
		k.f.mu.Lock()
		c := k.f.closed
		k.f.mu.Unlock()
		if c {
			break
		}
		runtime.Gosched()
	}
	close(resume)
	<-closed
	k.px.delay.Store(0)
	if err := <-errc; err == nil {
		t.Fatal("the Acquire met a Redis 1s late within a 100ms Timeout and succeeded")
	}
	k.noSlots("after Close returned")
}

// TestInFlightCloseWaitsForAcquire: an Acquire past its closed check when
// Close runs is waited for, with the call it abandons.
func TestInFlightCloseWaitsForAcquire(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	c := newClient(t, px.Addr()) // ContextTimeoutEnabled unset
	parked, resume := make(chan struct{}), make(chan struct{})
	clk := &hookClock{hook: func(n int64) {
		if n == 2 { // the second Acquire, past its closed check
			close(parked)
			<-resume
		}
	}}
	f := newInFlight(t, c, InFlightConfig{Timeout: 100 * time.Millisecond, Clock: clk})
	req := []core.SlotRequest{{Name: "conc", Key: "k", Limit: 5}}
	rel, err := f.Acquire(context.Background(), req, make([]core.SlotDecision, 1))
	if err != nil || rel == nil {
		t.Fatal(err)
	}
	rel() // loads the release script too
	px.delay.Store(int64(time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := f.Acquire(context.Background(), req, make([]core.SlotDecision, 1))
		errc <- err
	}()
	<-parked
	closed := make(chan struct{})
	go func() { f.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while an Acquire was running")
	case <-time.After(50 * time.Millisecond): // Close is waiting, as it must
	}
	close(resume)
	<-closed
	if err := <-errc; err == nil {
		t.Fatal("the Acquire met a Redis 1s late within a 100ms Timeout and succeeded")
	}
	if n := c.ZCard(context.Background(), f.prefix+"conc:k").Val(); n != 0 {
		t.Fatalf("%d slots held after Close, want 0: the abandoned acquisition's was not given back", n)
	}
}

// TestInFlightCloseDuringSlowRenewal: Close during a renewal round on a
// slow Redis starts no further renewal and waits only for the calls under
// way, each bounded by the Timeout (abandoned then, for a client without
// ContextTimeoutEnabled, and waited for until it ends), not for the whole
// round.
func TestInFlightCloseDuringSlowRenewal(t *testing.T) {
	const slots = 64 // four times the renewals run at once
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	c := newClient(t, px.Addr()) // ContextTimeoutEnabled unset
	var armed atomic.Bool
	var renewals atomic.Int64 // renewals begun once armed
	started := make(chan struct{})
	clk := &hookClock{hook: func(int64) {
		if armed.Load() {
			if renewals.Add(1) == 1 {
				px.delay.Store(int64(time.Second))
				close(started)
			}
		}
	}}
	f := newInFlight(t, c, InFlightConfig{Timeout: 100 * time.Millisecond, Expiry: 30 * time.Second, RenewEvery: 200 * time.Millisecond, Clock: clk})
	for i := range slots {
		if rel, _ := acquireOne(t, f, fmt.Sprint("k", i), 1); rel == nil {
			t.Fatal("refused")
		}
	}
	f.renewAll() // loads the renewal script
	armed.Store(true)
	<-started // a renewal round has begun, its replies 1s late
	start := time.Now()
	f.Close()
	el := time.Since(start)
	px.delay.Store(0)
	if n := renewals.Load(); n > renewConcurrency || el > 1500*time.Millisecond {
		t.Fatalf("Close during a renewal round with replies 1s late and Timeout 100ms: returned after %v, %d renewals begun; want at most the %d under way, and waited for only them", el, n, renewConcurrency)
	}
}

// TestInFlightDefaultPrefixApartFromStore: with the default prefixes, an
// in-flight layer's keys never meet a Store's, whatever the names: a rate
// policy named "inflight" keyed "api:203.0.113.7" and an in-flight layer
// "api" keyed "203.0.113.7" keep their own state.
func TestInFlightDefaultPrefixApartFromStore(t *testing.T) {
	srv := redistest.Start(t) // the default prefixes: a server of its own
	c := newClient(t, srv.Addr())
	st := newStore(t, c, &Config{Prefix: DefaultPrefix, ClientTime: true})
	f, err := NewInFlight(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	p := mustPolicy(t, core.Rule{Name: "inflight", Limit: 5, Window: time.Minute})
	slot := []core.SlotRequest{{Name: "api", Key: "203.0.113.7", Limit: 1}}
	acquire := func() (func(), error) {
		return f.Acquire(context.Background(), slot, make([]core.SlotDecision, 1))
	}

	rel, err := acquire()
	if err != nil || rel == nil {
		t.Fatalf("first in-flight slot: %v (admitted %v)", err, rel != nil)
	}
	if d := take(t, st, leaseT0, p, "api:203.0.113.7", 1); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("rate decision %+v, want the first of 5", d)
	}
	if r, err := acquire(); err != nil || r != nil {
		t.Fatalf("second slot with the limit 1 held: %v (admitted %v), want a refusal", err, r != nil)
	}
	rel()
	r, err := acquire()
	if err != nil || r == nil {
		t.Fatalf("slot after the release: %v (admitted %v)", err, r != nil)
	}
	r()
	if d := take(t, st, leaseT0, p, "api:203.0.113.7", 1); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("rate decision %+v, want the second of 5", d)
	}
}

// TestInFlightSplitRefusalReadsEveryKey: on a Cluster, keys on different
// hash slots are taken one after another. When an earlier key refuses, the
// later keys' decisions still say how many slots they hold, as
// core.SlotTable's do, not that they are free.
func TestInFlightSplitRefusalReadsEveryKey(t *testing.T) {
	client := newClusterClient(t, redistest.Cluster(t))
	f := newInFlight(t, client, InFlightConfig{})
	// Three keys on three slots.
	var keys []string
	seen := map[int]bool{}
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprintf("k%d", i)
		if s := slot(redisKey(f.prefix, "n"+k, "", &core.Request{Key: k})); !seen[s] {
			seen[s] = true
			keys = append(keys, k)
		}
	}
	req := func(k string, limit int64) core.SlotRequest {
		return core.SlotRequest{Name: "n" + k, Key: k, Limit: limit}
	}
	ctx := context.Background()
	var out [3]core.SlotDecision
	rel, err := f.Acquire(ctx, []core.SlotRequest{req(keys[0], 1), req(keys[1], 1)}, out[:2])
	if err != nil || rel == nil {
		t.Fatalf("first acquire: %v", err)
	}
	defer rel()
	rel2, err := f.Acquire(ctx, []core.SlotRequest{req(keys[2], 2)}, out[:1])
	if err != nil || rel2 == nil {
		t.Fatalf("second acquire: %v", err)
	}
	defer rel2()
	rel3, err := f.Acquire(ctx, []core.SlotRequest{req(keys[0], 1), req(keys[1], 1), req(keys[2], 2)}, out[:])
	if err != nil || rel3 != nil {
		t.Fatalf("third acquire: released %v, %v; want refused", rel3 != nil, err)
	}
	want := [3]core.SlotDecision{
		{Allowed: false, Limit: 1, InFlight: 1},
		{Allowed: false, Limit: 1, InFlight: 1},
		{Allowed: true, Limit: 2, InFlight: 1},
	}
	if out != want {
		t.Fatalf("refused batch: %+v, want %+v", out, want)
	}
}

type cmdHook struct{ onCmd func(cmd redis.Cmder) }

func (h cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.onCmd(cmd)
		return next(ctx, cmd)
	}
}
func (h cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestInFlightRefusedBatchReleasesBeforeReading: a batch refused key by key
// (a client of unknown topology, keys without a common hash tag) gives back
// the slots it took before the refusing key before it reads the later
// keys, so that no concurrent request on those keys is refused meanwhile
// by a request that was refused; the read takes no slot.
func TestInFlightRefusedBatchReleasesBeforeReading(t *testing.T) {
	addr := redistest.Server(t)
	base := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { base.Close() })
	probe := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { probe.Close() })

	f := newInFlight(t, unknownClient{base}, InFlightConfig{})
	if f.place != placeTag {
		t.Fatalf("placement %v, want key by key", f.place)
	}
	req := func(k string, limit int64) core.SlotRequest {
		return core.SlotRequest{Name: "n" + k, Key: k, Limit: limit}
	}
	rk := func(k string) string { return redisKey(f.prefix, "n"+k, "", &core.Request{Key: k}) }
	ctx := context.Background()
	var out [3]core.SlotDecision
	// k1 full.
	rel, err := f.Acquire(ctx, []core.SlotRequest{req("k1", 1)}, out[:1])
	if err != nil || rel == nil {
		t.Fatalf("k1: %v", err)
	}
	defer rel()

	var armed atomic.Bool
	var heldDuringCount atomic.Int64
	heldDuringCount.Store(-1)
	base.AddHook(cmdHook{onCmd: func(cmd redis.Cmder) {
		if !armed.Load() {
			return
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && s == rk("k2") {
				n, _ := probe.ZCard(context.Background(), rk("k0")).Result()
				heldDuringCount.Store(n)
			}
		}
	}})
	armed.Store(true)
	rel3, err := f.Acquire(ctx, []core.SlotRequest{req("k0", 1), req("k1", 1), req("k2", 1)}, out[:])
	armed.Store(false)
	if err != nil || rel3 != nil {
		t.Fatalf("want refused: %v %v", rel3 != nil, err)
	}
	if n := heldDuringCount.Load(); n != 0 {
		t.Errorf("while the refused batch read k2, k0 held %d slots (its own, taken before k1 refused): want 0", n)
	}
	if n, _ := probe.ZCard(ctx, rk("k0")).Result(); n != 0 {
		t.Errorf("after the refusal k0 holds %d", n)
	}
	if n, _ := probe.ZCard(ctx, rk("k2")).Result(); n != 0 {
		t.Errorf("the count took a slot of k2: %d", n)
	}
}
