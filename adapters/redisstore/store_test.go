package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// deadClient returns a client of a port nobody listens on.
func deadClient(t *testing.T) *redis.Client {
	return newClient(t, "127.0.0.1:1", func(o *redis.Options) { o.DialerRetries = 1 })
}

func TestNew(t *testing.T) {
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := New(deadClient(t), &Config{Breaker: &BreakerConfig{OpenFor: -time.Second}}); err == nil {
		t.Fatal("negative OpenFor accepted")
	}
	s, err := New(deadClient(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.prefix != DefaultPrefix || s.timeout != DefaultTimeout || s.clientTime || s.State() != BreakerClosed || s.place != placeOne {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = New(deadClient(t), &Config{Breaker: &BreakerConfig{Disabled: true}})
	if err != nil || s.State() != BreakerDisabled {
		t.Fatalf("disabled breaker: %v %v", s.State(), err)
	}
	// A Fallback that falls back itself could not route refunds: refused.
	inner := newStore(t, deadClient(t), &Config{Fallback: core.MustMemoryStore(nil)})
	if _, err := New(deadClient(t), &Config{Fallback: inner}); err == nil || !strings.Contains(err.Error(), "Fallback of its own") {
		t.Fatalf("a Fallback with a Fallback: %v", err)
	}
	if _, err := New(deadClient(t), &Config{Fallback: newStore(t, deadClient(t), nil)}); err != nil {
		t.Fatalf("a Store without a Fallback as the Fallback: %v", err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer c.Close()
	if s, _ := New(c, nil); s.place != placeSlot || !s.ctxBound {
		t.Fatalf("cluster client: place %v ctxBound %v", s.place, s.ctxBound)
	}
}

// TestBadInput checks that invalid batches get the memory store's errors
// before Redis is contacted (the client's server does not exist).
func TestBadInput(t *testing.T) {
	s := newStore(t, deadClient(t), &Config{ClientTime: true})
	mem := core.MustMemoryStore(nil)
	p := mustPolicy(t, core.Rule{Name: "p", Limit: 3, Window: time.Second})
	var many []core.Request
	for i := 0; i <= core.MaxBatch; i++ {
		many = append(many, core.Request{Policy: p, Key: string(rune('a' + i)), Cost: 1})
	}
	cases := []struct {
		name string
		reqs []core.Request
		out  int
		want error
	}{
		{"ShortOutput", []core.Request{{Policy: p, Key: "a", Cost: 1}}, 0, core.ErrShortOutput},
		{"TooLarge", many, len(many), core.ErrBatchTooLarge},
		{"ZeroCost", []core.Request{{Policy: p, Key: "a", Cost: 0}}, 1, core.ErrInvalidCost},
		{"NegativeCost", []core.Request{{Policy: p, Key: "a", Cost: -5}}, 1, core.ErrInvalidCost},
		{"Duplicate", []core.Request{{Policy: p, Key: "a", Cost: 1}, {Policy: p, Key: "a", Cost: 1}}, 2, core.ErrDuplicateRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := make([]core.Decision, c.out)
			start := time.Now()
			err := s.Take(context.Background(), storetest.T0, c.reqs, out)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if werr := mem.Take(context.Background(), storetest.T0, c.reqs, make([]core.Decision, c.out)); !errors.Is(werr, c.want) {
				t.Fatalf("memory store: %v", werr)
			}
			if time.Since(start) > 20*time.Millisecond {
				t.Fatal("Redis was contacted")
			}
		})
	}
	if err := s.Take(context.Background(), storetest.T0, nil, nil); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
}

type customAlg struct{ core.Algorithm }

func (customAlg) Name() string { return "custom" }

func TestUnsupported(t *testing.T) {
	s := newStore(t, deadClient(t), &Config{ClientTime: true})
	good := mustPolicy(t, core.Rule{Name: "good", Limit: 3, Window: time.Second})
	custom := mustPolicy(t, core.Rule{Name: "custom", Algorithm: customAlg{core.TokenBucket}, Limit: 3, Window: time.Second})
	odd := mustPolicy(t, core.Rule{Name: "odd", Limit: 3, Window: time.Second + 500*time.Nanosecond})
	shaping := mustPolicy(t, core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second, MaxDelay: time.Millisecond + 1})
	var out [2]core.Decision
	for _, c := range []struct {
		p    *core.Policy
		want error
	}{{custom, ErrUnsupportedAlgorithm}, {odd, ErrUnsupportedRule}, {shaping, ErrUnsupportedRule}} {
		err := s.Take(context.Background(), storetest.T0, []core.Request{{Policy: good, Key: "k", Cost: 1}, {Policy: c.p, Key: "k", Cost: 1}}, out[:])
		if !errors.Is(err, c.want) || !errors.Is(err, core.ErrUnsupportedPolicy) || !strings.Contains(err.Error(), c.p.Name()) {
			t.Errorf("%s: err = %v, want %v naming the policy", c.p, err, c.want)
		}
		// The same answer before any request (core.PolicyChecker), from
		// the store and from the decorators in front of it.
		lease, err := NewLeaseStore(s, &LeaseConfig{Size: 2})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := NewRefusalCache(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []core.Store{s, lease, cache} {
			if err := core.CheckPolicies(st, good, c.p); !errors.Is(err, c.want) || !errors.Is(err, core.ErrUnsupportedPolicy) {
				t.Errorf("%T: CheckPolicies(%s) = %v, want %v", st, c.p, err, c.want)
			}
			if err := core.CheckPolicies(st, good); err != nil {
				t.Errorf("%T: CheckPolicies(%s) = %v", st, good, err)
			}
		}
	}
	for _, at := range []time.Time{{}, MinTime.Add(-time.Microsecond), MaxTime.Add(time.Microsecond), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		err := s.Take(context.Background(), at, []core.Request{{Policy: good, Key: "k", Cost: 1}}, out[:1])
		if !errors.Is(err, ErrTimeOutOfRange) || !errors.Is(err, core.ErrTimeOutOfRange) {
			t.Errorf("at %v: err = %v, want ErrTimeOutOfRange wrapping core.ErrTimeOutOfRange", at, err)
		}
	}
	if MaxTime.Year() != 2155 {
		t.Errorf("MaxTime = %v", MaxTime)
	}
}

func TestKeyLayout(t *testing.T) {
	if got := escapeName("a:b%c{d}"); got != "a%3Ab%25c%7Bd%7D" {
		t.Fatalf("escapeName = %q", got)
	}
	if got := escapeName("plain-name_1"); got != "plain-name_1" {
		t.Fatalf("escapeName changed a plain name: %q", got)
	}
	// Distinct (tag, name, key) triples never share a key.
	type triple struct{ tag, name, key string }
	seen := map[string]triple{}
	parts := []string{"", "a", "b", ":", "a:b", "{", "}", "{a}", "%", "%3A", "a}b"}
	for _, tag := range parts {
		for _, name := range parts[1:] {
			for _, key := range parts {
				k := redisKey("p:", escapeName(name), tag, &core.Request{Key: key})
				if prev, ok := seen[k]; ok {
					t.Fatalf("%+v and %+v share the key %q", prev, triple{tag, name, key}, k)
				}
				seen[k] = triple{tag, name, key}
			}
		}
	}
	// A tag is the key's hash tag, whatever it holds.
	k := redisKey("rl:", "ip", "10.0.0.1", &core.Request{Key: "10.0.0.1"})
	if k != "rl:{10.0.0.1}ip:10.0.0.1" || hashTagOf(k) != "10.0.0.1" {
		t.Fatalf("tagged key %q", k)
	}
	if k := redisKey("rl:", "ip", "a}b", &core.Request{Key: "x"}); hashTagOf(k) != "a%7Db" {
		t.Fatalf("tag with a brace: %q", k)
	}
	// The documented layout is what lands in Redis.
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{Prefix: "layout:"})
	p := mustPolicy(t, core.Rule{Name: "api:v1", Limit: 3, Window: time.Second})
	take(t, s, time.Now(), p, "10.0.0.1", 1)
	if n := client.Exists(context.Background(), "layout:api%3Av1:10.0.0.1").Val(); n != 1 {
		t.Fatal("key not at layout:api%3Av1:10.0.0.1")
	}
}

// TestExpiry checks that keys expire when their state stops mattering
// (core's Algorithm.Expiry, rounded up to a millisecond, plus one), written
// by the same script call that charges them.
func TestExpiry(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, nil) // server time
	ctx := context.Background()
	cases := []struct {
		rule     core.Rule
		cost     int64
		min, max time.Duration
	}{
		{core.Rule{Name: "tb", Limit: 10, Window: time.Second}, 5, 400 * time.Millisecond, 501 * time.Millisecond},
		{core.Rule{Name: "lb", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second}, 1, 400 * time.Millisecond, 501 * time.Millisecond},
		{core.Rule{Name: "swl", Algorithm: core.SlidingWindowLog, Limit: 3, Window: 2 * time.Second}, 1, 1900 * time.Millisecond, 2001 * time.Millisecond},
		{core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour}, 1, 0, time.Hour + time.Millisecond},
		{core.Rule{Name: "swc", Algorithm: core.SlidingWindowCounter, Limit: 3, Window: time.Hour}, 1, time.Hour, 2*time.Hour + time.Millisecond},
	}
	for _, c := range cases {
		p := mustPolicy(t, c.rule)
		take(t, s, time.Time{}, p, "k", c.cost)
		ttl, err := client.PTTL(ctx, redisKey(s.prefix, c.rule.Name, "", &core.Request{Key: "k"})).Result()
		if err != nil || ttl < c.min || ttl > c.max {
			t.Errorf("%s: PTTL %v (%v), want in [%v, %v]", c.rule.Name, ttl, err, c.min, c.max)
		}
	}
	// A refused request writes nothing.
	p := mustPolicy(t, core.Rule{Name: "once", Limit: 1, Window: time.Hour})
	take(t, s, time.Time{}, p, "k", 1)
	key := redisKey(s.prefix, "once", "", &core.Request{Key: "k"})
	before := client.Get(ctx, key).Val()
	if d := take(t, s, time.Time{}, p, "k", 1); d.Allowed {
		t.Fatal("admitted twice")
	}
	if after := client.Get(ctx, key).Val(); after != before {
		t.Fatalf("a refusal wrote %q over %q", after, before)
	}
}

type errorRecorder struct {
	core.NopObserver
	mu   sync.Mutex
	errs []error
	lats []time.Duration
}

func (r *errorRecorder) ObserveError(e core.ErrorEvent) {
	r.mu.Lock()
	r.errs = append(r.errs, e.Err)
	r.lats = append(r.lats, e.Latency)
	r.mu.Unlock()
}

func TestFallbackAndObserver(t *testing.T) {
	var rec errorRecorder
	mem := core.MustMemoryStore(nil)
	s := newStore(t, deadClient(t), &Config{
		Timeout:  20 * time.Millisecond,
		Breaker:  &BreakerConfig{Failures: 2, OpenFor: time.Hour},
		Fallback: mem,
		Observer: &rec,
	})
	p := mustPolicy(t, core.Rule{Name: "fb", Limit: 3, Window: time.Hour})
	for i := 0; i < 4; i++ {
		d := take(t, s, storetest.T0, p, "k", 1)
		if d.Allowed != (i < 3) || d.Policy != p {
			t.Fatalf("fallback decision %d: %+v", i, d)
		}
	}
	if len(rec.errs) != 4 || !errors.Is(rec.errs[3], ErrUnavailable) || errors.Is(rec.errs[0], ErrUnavailable) {
		t.Fatalf("observed errors %v, want 2 backend errors then ErrUnavailable", rec.errs)
	}
	if s.State() != BreakerOpen {
		t.Fatalf("breaker %v after 2 failures", s.State())
	}
	// Without a fallback the errors are returned, not observed.
	var rec2 errorRecorder
	s2 := newStore(t, deadClient(t), &Config{Timeout: 20 * time.Millisecond, Observer: &rec2})
	var out [1]core.Decision
	err := s2.Take(context.Background(), storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	if err == nil || !strings.HasPrefix(err.Error(), "redisstore: ") || len(rec2.errs) != 0 {
		t.Fatalf("err %v, observed %v", err, rec2.errs)
	}
	if out[0].Allowed || out[0].Policy != p || out[0].Limit != 3 {
		t.Fatalf("decision on error: %+v", out[0])
	}
	// The caller's own cancellation does not count against Redis.
	s3 := newStore(t, deadClient(t), &Config{Breaker: &BreakerConfig{Failures: 1}})
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 3; i++ {
		s3.Take(cctx, storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	}
	if s3.State() != BreakerClosed {
		t.Fatalf("cancelled callers opened the breaker")
	}
}

// TestRing runs the conformance suite over a go-redis Ring of two servers,
// where batches are grouped by hash tag.
func TestRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{
		"a": redistest.Server(t), "b": redistest.Server(t),
	}})
	t.Cleanup(func() { ring.Close() })
	storetest.Run(t, func(t *testing.T) core.Store {
		s := newStore(t, ring, &Config{ClientTime: true})
		if s.place != placeTag {
			t.Fatalf("placement %v for a Ring", s.place)
		}
		return s
	})
}

// TestRingShardDown checks that when go-redis's heartbeat drops a stopped
// shard from a Ring, and moves its keys to the other shard, which holds no
// state for them, the keys of that shard fail with ErrShardDown (to the
// Fallback, when there is one, and its Observer) instead of being granted
// a fresh quota (nor peeked at, refunded or reset on the other shard),
// that the other shard's keys keep deciding, and that once the shard is
// back its keys decide there again.
func TestRingShardDown(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:              map[string]string{"a": a.Addr(), "b": b.Addr()},
		HeartbeatFrequency: 20 * time.Millisecond,
		DialerRetries:      1,
		MaxRetries:         -1,
	})
	t.Cleanup(func() { ring.Close() })
	var rec errorRecorder
	s := newStore(t, ring, &Config{ClientTime: true, Timeout: 200 * time.Millisecond})
	fb := newStore(t, ring, &Config{ClientTime: true, Timeout: 200 * time.Millisecond, Fallback: core.MustMemoryStore(nil), Observer: &rec})
	fb.prefix = s.prefix // the same records
	p := mustPolicy(t, core.Rule{Name: "q", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour})
	now := time.Unix(1_800_000_000, 0)
	var onA, onB string
	for i := 0; onA == "" || onB == ""; i++ {
		k := fmt.Sprintf("user%d", i)
		if i == 1000 {
			t.Fatal("no key on each shard")
		}
		for range 3 {
			if !take(t, s, now, p, k, 1).Allowed {
				t.Fatalf("key %q refused below its quota", k)
			}
		}
		switch "1" {
		case redistest.Do(t, a.Addr(), "EXISTS", s.prefix+"q:"+k):
			onA = cmp.Or(onA, k)
		case redistest.Do(t, b.Addr(), "EXISTS", s.prefix+"q:"+k):
			onB = cmp.Or(onB, k)
		}
	}
	b.Stop()
	waitRing := func(live int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ring.Len() != live; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the Ring has %d live shards after 10s, want %d", ring.Len(), live)
			}
		}
	}
	waitRing(1)
	var out [1]core.Decision
	for i := range 5 {
		err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: onB, Cost: 1}}, out[:])
		if !errors.Is(err, ErrShardDown) || out[0].Allowed {
			t.Fatalf("decision %d for %q, whose shard is down: %+v, %v; want ErrShardDown", i, onB, out[0], err)
		}
		if err := s.Peek(context.Background(), now, []core.Request{{Policy: p, Key: onB, Cost: 1}}, out[:]); !errors.Is(err, ErrShardDown) {
			t.Fatalf("Peek for %q, whose shard is down: %v, want ErrShardDown", onB, err)
		}
		// A refund or a reset sent to the other shard would change
		// nothing there and report success.
		if err := s.Refund(context.Background(), now, []core.Request{{Policy: p, Key: onB, Cost: 1, ChargedAt: now}}); !errors.Is(err, ErrShardDown) {
			t.Fatalf("Refund for %q, whose shard is down: %v, want ErrShardDown", onB, err)
		}
		if err := s.Reset(context.Background(), p, onB); !errors.Is(err, ErrShardDown) {
			t.Fatalf("Reset of %q, whose shard is down: %v, want ErrShardDown", onB, err)
		}
		if d := take(t, s, now, p, onA, 1); d.Allowed {
			t.Fatalf("%q, on the live shard, admitted above its quota: %+v", onA, d)
		}
	}
	if s.State() != BreakerClosed {
		t.Fatalf("breaker %v: ErrShardDown must not count against it", s.State())
	}
	// In-flight slots of a key homed on the stopped shard are not taken
	// on the other (a fresh count there).
	slots, err := NewInFlight(ring, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slots.Close()
	var sd [1]core.SlotDecision
	home := newRingGuard(ring).home
	var slotA, slotB string
	for i := 0; slotA == "" || slotB == ""; i++ {
		k := fmt.Sprint("conn", i)
		switch home.Get(hashtagKey(redisKey(slots.prefix, "c", "", &core.Request{Key: k}))) {
		case "a":
			slotA = cmp.Or(slotA, k)
		case "b":
			slotB = cmp.Or(slotB, k)
		}
	}
	for _, k := range []string{slotA, slotB} {
		release, err := slots.Acquire(context.Background(), []core.SlotRequest{{Name: "c", Key: k, Limit: 1}}, sd[:])
		if k == slotB && !errors.Is(err, ErrShardDown) || k == slotA && (err != nil || release == nil) {
			t.Fatalf("in-flight slot for %q: %v (release %v)", k, err, release != nil)
		}
		if release != nil {
			release()
		}
	}
	// With a Fallback: decided locally (a fresh local quota, reported),
	// never on the other shard.
	if d := take(t, fb, now, p, onB, 1); !d.Allowed {
		t.Fatalf("with a Fallback: %+v, want the Fallback's admission", d)
	}
	rec.mu.Lock()
	if len(rec.errs) != 1 || !errors.Is(rec.errs[0], ErrShardDown) {
		t.Errorf("the Observer saw %v, want one ErrShardDown", rec.errs)
	}
	rec.mu.Unlock()
	if n := redistest.Do(t, a.Addr(), "EXISTS", s.prefix+"q:"+onB); n != "0" {
		t.Fatalf("%q was written on the other shard (EXISTS %s)", onB, n)
	}
	b.Restart(t) // without persistence: its records are gone
	waitRing(2)
	take(t, s, now, p, onB, 1)
	if n := redistest.Do(t, b.Addr(), "EXISTS", s.prefix+"q:"+onB); n != "1" {
		t.Fatalf("%q, its shard back, was not decided there (EXISTS %s)", onB, n)
	}
}

// ringKeyOn returns a key of policy "q" of s whose record hashes to the
// shard want among the shards names.
func ringKeyOn(t *testing.T, s *Store, ring *redis.Ring, names []string, want string) string {
	t.Helper()
	h := ring.Options().NewConsistentHash(names)
	for i := range 10000 {
		k := fmt.Sprintf("user%d", i)
		if h.Get(hashtagKey(s.prefix+"q:"+k)) == want {
			return k
		}
	}
	t.Fatalf("no key on %s", want)
	return ""
}

// TestRingShardsSwap checks that the shards found down follow the shards
// that are up: one shard back up and another down (the same number of
// shards up) fails the keys of the second, not of the first.
func TestRingShardsSwap(t *testing.T) {
	a, b, c := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:              map[string]string{"a": a.Addr(), "b": b.Addr(), "c": c.Addr()},
		HeartbeatFrequency: 20 * time.Millisecond,
		DialerRetries:      1,
		MaxRetries:         -1,
	})
	t.Cleanup(func() { ring.Close() })
	s := newStore(t, ring, &Config{ClientTime: true, Timeout: 200 * time.Millisecond})
	p := mustPolicy(t, core.Rule{Name: "q", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour})
	now := time.Unix(1_800_000_000, 0)
	names := []string{"a", "b", "c"}
	kb, kc := ringKeyOn(t, s, ring, names, "b"), ringKeyOn(t, s, ring, names, "c")
	for range 3 {
		take(t, s, now, p, kc, 1) // kc's quota spent on c
	}
	waitRing := func(live int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ring.Len() != live; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the Ring has %d live shards after 10s, want %d", ring.Len(), live)
			}
		}
	}
	b.Stop()
	waitRing(2)
	take(t, s, now, p, kc, 1) // finds b down
	b.Restart(t)
	waitRing(3)
	c.Stop()
	waitRing(2)
	var out [1]core.Decision
	if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: kc, Cost: 1}}, out[:]); !errors.Is(err, ErrShardDown) || out[0].Allowed {
		t.Errorf("%q, over its quota, its shard c down: %+v, %v; want ErrShardDown", kc, out[0], err)
	}
	if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: kb, Cost: 1}}, out[:]); err != nil {
		t.Errorf("%q, its shard b up again: %v", kb, err)
	}
}

// TestRingShardsChanged checks that when Ring.SetAddrs changes the shards
// (drops one that is up, or one that is down, or adds one), the store
// reports ErrRingChanged once to its Observer and from then on decides
// keys where the Ring sends them (none fails for good with ErrShardDown).
// (Swapping two shards' addresses cannot be told from a flapping shard, and
// goes unseen, as the package documentation says.)
func TestRingShardsChanged(t *testing.T) {
	for _, change := range []string{"drop", "drop down", "add"} {
		t.Run(change, func(t *testing.T) {
			a, b, c := redistest.Start(t), redistest.Start(t), redistest.Start(t)
			addrs := map[string]string{"a": a.Addr(), "b": b.Addr(), "c": c.Addr()}
			if change == "add" {
				delete(addrs, "c")
			}
			ring := redis.NewRing(&redis.RingOptions{Addrs: addrs, HeartbeatFrequency: 20 * time.Millisecond, DialerRetries: 1, MaxRetries: -1})
			t.Cleanup(func() { ring.Close() })
			var rec errorRecorder
			s := newStore(t, ring, &Config{ClientTime: true, Timeout: 200 * time.Millisecond, Observer: &rec})
			p := mustPolicy(t, core.Rule{Name: "q", Algorithm: core.FixedWindow, Limit: 3, Window: time.Hour})
			now := time.Unix(1_800_000_000, 0)
			var k string
			var out [1]core.Decision
			switch change {
			case "drop":
				k = ringKeyOn(t, s, ring, []string{"a", "b", "c"}, "c")
				ring.SetAddrs(map[string]string{"a": a.Addr(), "b": b.Addr()})
			case "drop down":
				k = ringKeyOn(t, s, ring, []string{"a", "b", "c"}, "c")
				take(t, s, now, p, k, 1) // the store sees c up
				c.Stop()
				for deadline := time.Now().Add(10 * time.Second); ring.Len() != 2; time.Sleep(2 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("c never marked down")
					}
				}
				if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: k, Cost: 1}}, out[:]); !errors.Is(err, ErrShardDown) {
					t.Fatalf("c down: %v, want ErrShardDown", err)
				}
				ring.SetAddrs(map[string]string{"a": a.Addr(), "b": b.Addr()})
			case "add":
				k = ringKeyOn(t, s, ring, []string{"a", "b"}, "b")
				ring.SetAddrs(map[string]string{"a": a.Addr(), "b": b.Addr(), "c": c.Addr()})
			}
			for i := range 3 {
				if err := s.Take(context.Background(), now, []core.Request{{Policy: p, Key: k, Cost: 1}}, out[:]); err != nil {
					t.Fatalf("Take %d for %q after SetAddrs: %+v, %v", i, k, out[0], err)
				}
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			var changed int
			for _, err := range rec.errs {
				if errors.Is(err, ErrRingChanged) {
					changed++
				}
			}
			if changed != 1 {
				t.Errorf("the Observer saw %v, want one ErrRingChanged", rec.errs)
			}
		})
	}
}

// TestExpiryExact checks the exact millisecond expiry that a charge sets,
// on the single-request fast path and on the general (batch) path: the
// state's life rounded up to a millisecond, plus the slack. It reads the
// server's clock before and after the charge and keeps only runs where both
// fall in the same millisecond, so the expiry time pins the TTL exactly.
func TestExpiryExact(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	ctx := context.Background()
	slack := int64(ClientTimeSlack / time.Millisecond)
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name string
		rule core.Rule
		cost int64
		life time.Duration // state's life after the charge
	}{
		// 1/3 s per unit: a life of 333.333334 ms rounds up to 334.
		{"tb", core.Rule{Name: "x-tb", Limit: 3, Window: time.Second}, 1, 333333334 * time.Nanosecond},
		{"lb", core.Rule{Name: "x-lb", Algorithm: core.LeakyBucket, Limit: 3, Window: time.Second, Burst: 3}, 2, 666666667 * time.Nanosecond},
		{"fw", core.Rule{Name: "x-fw", Algorithm: core.FixedWindow, Limit: 3, Window: 7 * time.Millisecond}, 1, 7*time.Millisecond - time.Duration(now.UnixNano()%int64(7*time.Millisecond))},
	}
	for _, c := range cases {
		p := mustPolicy(t, c.rule)
		want := (int64(c.life)+int64(time.Millisecond)-1)/int64(time.Millisecond) + slack
		for _, batch := range []bool{false, true} {
			var got int64
			for attempt := 0; ; attempt++ {
				key := fmt.Sprintf("exact-%v-%d", batch, attempt)
				before, _ := client.Time(ctx).Result()
				reqs := []core.Request{{Policy: p, Key: key, Cost: c.cost}}
				if batch {
					other := mustPolicy(t, core.Rule{Name: "x-other", Limit: 100, Window: time.Hour})
					reqs = append(reqs, core.Request{Policy: other, Key: key, Cost: 1})
				}
				out := make([]core.Decision, len(reqs))
				if err := s.Take(ctx, now, reqs, out); err != nil || !out[0].Allowed {
					t.Fatalf("%s: %+v %v", c.name, out, err)
				}
				after, _ := client.Time(ctx).Result()
				at, err := client.PExpireTime(ctx, redisKey(s.prefix, p.Name(), "", &core.Request{Key: key})).Result()
				if err != nil {
					t.Fatal(err)
				}
				if before.UnixMilli() == after.UnixMilli() {
					got = at.Milliseconds() - before.UnixMilli()
					break
				}
				if attempt > 500 {
					t.Skip("the server's clock never stayed within one millisecond across a charge")
				}
			}
			if got != want {
				t.Errorf("%s (batch %v): key expires %d ms after the charge, want %d", c.name, batch, got, want)
			}
		}
	}
}

// TestKeyBounds checks that the store bounds what a request key can do to
// Redis: a key longer than MaxKeyLen is stored under its hash (the Redis
// key has a fixed length, and two long keys differing in their last byte
// stay apart), and a key holding "{...}" cannot choose its Cluster hash
// slot unless HashTag says so.
func TestKeyBounds(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{Prefix: "bounds:"})
	p := mustPolicy(t, core.Rule{Name: "api", Limit: 1, Window: time.Hour})
	long := strings.Repeat("x", 1<<20)
	if d := take(t, s, time.Now(), p, long+"a", 1); !d.Allowed {
		t.Fatal("first long key refused")
	}
	if d := take(t, s, time.Now(), p, long+"b", 1); !d.Allowed {
		t.Fatal("a second long key shares the first's quota")
	}
	if d := take(t, s, time.Now(), p, long+"a", 1); d.Allowed {
		t.Fatal("a long key's quota was lost")
	}
	// boundedKeys checks that the two long request keys are two Redis
	// keys of at most max bytes under prefix.
	boundedKeys := func(prefix string, max int) {
		t.Helper()
		keys, err := client.Keys(context.Background(), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 2 {
			t.Fatalf("%s: %d Redis keys for two long request keys, want 2", prefix, len(keys))
		}
		for _, k := range keys {
			if len(k) > max {
				t.Errorf("%s: Redis key of %d bytes for a 1 MiB request key, want at most %d", prefix, len(k), max)
			}
		}
	}
	boundedKeys("bounds:", len("bounds:api%h:")+64)
	// Exactly MaxKeyLen is kept as it is.
	exact := strings.Repeat("y", MaxKeyLen)
	take(t, s, time.Now(), p, exact, 1)
	if n := client.Exists(context.Background(), "bounds:api:"+exact).Val(); n != 1 {
		t.Fatal("a key of MaxKeyLen bytes was not stored as it is")
	}

	// A braced key hashes whole without a HashTag...
	for _, key := range []string{"{victim}", "a{b}c", "{", "x{}y"} {
		k := redisKey("rl:", "api", "", &core.Request{Key: key})
		if got, want := slot(k), int(crc16(k)&16383); got != want {
			t.Errorf("key %q: Redis key %q lands in slot %d chosen by the key, want %d (the whole key's)", key, k, got, want)
		}
		if hashTagOf(k) != k {
			t.Errorf("key %q: Redis key %q has hash tag %q", key, k, hashTagOf(k))
		}
	}
	// ...and its Redis server agrees.
	take(t, s, time.Now(), p, "{victim}", 1)
	if n := client.Exists(context.Background(), "bounds:{}api:{victim}").Val(); n != 1 {
		t.Fatal("braced key not at bounds:{}api:{victim}")
	}
	// A HashTag still chooses.
	k := redisKey("rl:", "api", "t", &core.Request{Key: "{victim}"})
	if hashTagOf(k) != "t" {
		t.Fatalf("tagged key %q hashes by %q, want t", k, hashTagOf(k))
	}

	// A tag is bounded as a key is, also when it is the key (TagByKey),
	// and still puts every policy's key of one tag in one slot.
	ts := newStore(t, client, &Config{Prefix: "tbounds:", HashTag: TagByKey})
	for _, key := range []string{long + "a", long + "b"} {
		for i, want := range []bool{true, false} {
			if d := take(t, ts, time.Now(), p, key, 1); d.Allowed != want {
				t.Fatalf("TagByKey, long key ending %q, take %d: allowed %v, want %v", key[len(key)-1:], i+1, d.Allowed, want)
			}
		}
	}
	boundedKeys("tbounds:", len("tbounds:{%h}api%h:")+2*64)
	a := redisKey("rl:", "per-second", long, &core.Request{Key: long})
	b := redisKey("rl:", "per-hour", long, &core.Request{Key: long})
	if hashTagOf(a) != hashTagOf(b) || !strings.HasPrefix(hashTagOf(a), "%h") {
		t.Errorf("one long tag under two policies hashes by %.20q and %.20q, want one hashed tag", hashTagOf(a), hashTagOf(b))
	}
	if short := redisKey("rl:", "api", "%h"+hashTagOf(a)[2:], &core.Request{Key: "k"}); hashTagOf(short) == hashTagOf(a) {
		t.Errorf("a short tag spelling a hashed one shares its slot tag %.20q", hashTagOf(short))
	}
}

// TestForeignLogEntry: a sliding log whose head and newest entry are of our
// shape but with an entry of a foreign shape between them (load reads only
// those two) is read as fresh and overwritten, as any key of a foreign
// shape, on every path that reads entries: a take's decision, a refund
// and a peek. Its decisions never fail, so they never count against the
// breaker either.
func TestForeignLogEntry(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	ctx := context.Background()
	s := newStore(t, client, &Config{ClientTime: true, Breaker: &BreakerConfig{Failures: 2, OpenFor: time.Hour}})
	p := mustPolicy(t, core.Rule{Name: "log", Algorithm: core.SlidingWindowLog, Limit: 3, Window: time.Hour})
	at := storetest.T0
	for _, path := range []string{"take", "refund", "peek"} {
		t.Run(path, func(t *testing.T) {
			key := "bad-" + path
			rk := redisKey(s.prefix, p.Name(), "", &core.Request{Key: key})
			us := at.UnixMicro()
			if err := client.RPush(ctx, rk, "0;", fmt.Sprintf("%d:1:1", us-2), "garbage", fmt.Sprintf("%d:1:3", us-1)).Err(); err != nil {
				t.Fatal(err)
			}
			reqs := []core.Request{{Policy: p, Key: key, Cost: 1}}
			switch path {
			case "refund":
				// given back from the first entry's charge: the entries
				// are read from the newest back to it
				charged := []core.Request{{Policy: p, Key: key, Cost: 1, ChargedAt: time.UnixMicro(us - 2)}}
				if err := s.Refund(ctx, at, charged); err != nil {
					t.Fatalf("refund on a log with a foreign entry: %v", err)
				}
			case "peek":
				var out [1]core.Decision
				if err := s.Peek(ctx, at, reqs, out[:]); err != nil {
					t.Fatalf("peek on a log with a foreign entry: %v", err)
				}
			}
			for i := 1; i <= 4; i++ {
				var out [1]core.Decision
				if err := s.Take(ctx, at, reqs, out[:]); err != nil {
					t.Fatalf("take %d on a log with a foreign entry: %v", i, err)
				}
				if want := i <= 3; out[0].Allowed != want {
					t.Fatalf("take %d: allowed %v, want %v (the log read as fresh): %+v", i, out[0].Allowed, want, out[0])
				}
			}
		})
	}
	if st := s.State(); st != BreakerClosed {
		t.Fatalf("breaker %v after decisions on foreign logs, want closed", st)
	}
}
