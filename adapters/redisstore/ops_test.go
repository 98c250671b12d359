package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestOpsDifferential replays random traces of takes, peeks, refunds and
// resets (times moving forwards in whole milliseconds; single requests and
// batches mixing algorithms and keys) against the Redis store and a
// core.MemoryStore, and demands the same decisions after every step, as
// TestDifferential does for takes alone.
func TestOpsDifferential(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	var policies []*core.Policy
	for _, r := range differentialRules() {
		policies = append(policies, mustPolicy(t, r))
	}
	keys := []string{"alpha", "beta", "γ:{x}"}
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rs := newStore(t, client, &Config{ClientTime: true})
			ms := core.MustMemoryStore(nil)
			rng := rand.New(rand.NewPCG(seed, 7))
			ctx := context.Background()
			at := storetest.T0
			steps := 2000
			if testing.Short() {
				steps = 400
			}
			var peeks, refunds, resets, refused int
			var last []core.Request // the last admitted batch
			for step := 0; step < steps; step++ {
				switch x := rng.IntN(100); {
				case x < 50:
				case x < 80:
					at = at.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
				case x < 95:
					at = at.Add(time.Duration(rng.IntN(8000)) * time.Millisecond)
				default:
					at = at.Add(time.Duration(rng.IntN(3_600_000)) * time.Millisecond)
				}
				n := 1 + rng.IntN(3)
				reqs := make([]core.Request, 0, n)
				for len(reqs) < n {
					p := policies[rng.IntN(len(policies))]
					k := keys[rng.IntN(len(keys))]
					dup := false
					for _, r := range reqs {
						dup = dup || (r.Policy.Name() == p.Name() && r.Key == k)
					}
					if !dup {
						reqs = append(reqs, core.Request{Policy: p, Key: k, Cost: randomCost(rng, p.Capacity())})
					}
				}
				switch op := rng.IntN(10); {
				case op < 5, op < 7 && last == nil: // take, and a peek beforehand
					want, got := make([]core.Decision, n), make([]core.Decision, n)
					peek := make([]core.Decision, n)
					perr := rs.Peek(ctx, at, reqs, peek)
					werr := ms.Take(ctx, at, reqs, want)
					gerr := rs.Take(ctx, at, reqs, got)
					if !sameOpsErr(werr, gerr) || !sameOpsErr(werr, perr) {
						t.Fatalf("step %d: memory err %v, redis take %v, peek %v", step, werr, gerr, perr)
					}
					ok := werr == nil
					for i := range reqs {
						w := want[i]
						w.RetryAfter, w.ResetAfter, w.Delay = ceilMicro(w.RetryAfter), ceilMicro(w.ResetAfter), ceilMicro(w.Delay)
						if w != got[i] || w != peek[i] {
							t.Fatalf("step %d take %d of %d (%s key %q cost %d):\nmemory %+v\nredis  %+v\npeek   %+v", step, i, n, reqs[i].Policy, reqs[i].Key, reqs[i].Cost, w, got[i], peek[i])
						}
						ok = ok && w.Allowed
					}
					peeks++
					if ok {
						last = reqs
					} else {
						refused++
					}
				case op < 9: // refund the last admitted batch, or part of it
					batch := last
					if rng.IntN(3) == 0 {
						batch = reqs // refunds never charged: never above capacity
						for i := range batch {
							batch[i].Cost = min(batch[i].Cost, batch[i].Policy.Capacity())
						}
					}
					werr := ms.Refund(ctx, at, batch)
					gerr := rs.Refund(ctx, at, batch)
					if werr != nil || gerr != nil {
						t.Fatalf("step %d: refund errors %v / %v", step, werr, gerr)
					}
					refunds++
					last = nil
				default:
					r := reqs[0]
					if err := ms.Reset(ctx, r.Policy, r.Key); err != nil {
						t.Fatal(err)
					}
					if err := rs.Reset(ctx, r.Policy, r.Key); err != nil {
						t.Fatal(err)
					}
					resets++
				}
			}
			t.Logf("%d steps: %d takes and peeks (%d refused), %d refunds, %d resets", steps, peeks, refused, refunds, resets)
			if refused == 0 || refunds == 0 || resets == 0 {
				t.Fatal("the trace is too gentle to compare the stores")
			}
		})
	}
}

func sameOpsErr(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return errors.Is(a, core.ErrCostExceedsCapacity) && errors.Is(b, core.ErrCostExceedsCapacity)
}

// TestPeekWritesNothing: a peek leaves a new key absent and a record of
// another policy as it was.
func TestPeekWritesNothing(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	ctx := context.Background()
	for _, a := range core.Algorithms() {
		r := core.Rule{Name: "pw-" + a.Name(), Algorithm: a, Limit: 5, Window: time.Minute}
		if a == core.LeakyBucket {
			r.Burst = 5
		}
		small := mustPolicy(t, r)
		big := mustPolicy(t, core.Rule{Name: "pw-" + a.Name(), Algorithm: core.FixedWindow, Limit: 9, Window: time.Hour})
		key := redisKey(s.prefix, escapeName(small.Name()), "", &core.Request{Key: "k"})
		out := make([]core.Decision, 1)
		if err := s.Peek(ctx, storetest.T0, []core.Request{{Policy: small, Key: "k", Cost: 2}}, out); err != nil || !out[0].Allowed {
			t.Fatalf("%s: %+v %v", a.Name(), out[0], err)
		}
		if n := client.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("%s: a peek stored the key", a.Name())
		}
		take(t, s, storetest.T0, small, "k", 2)
		before := dump(t, s, key)
		if err := s.Peek(ctx, storetest.T0.Add(time.Second), []core.Request{{Policy: big, Key: "k", Cost: 1}}, out); err != nil || out[0].Remaining != 6 {
			t.Fatalf("%s: peek under another policy: %+v %v, want 2 carried over", a.Name(), out[0], err)
		}
		if after := dump(t, s, key); after != before {
			t.Fatalf("%s: a peek rewrote the record:\n%q\n%q", a.Name(), before, after)
		}
	}
}

// dump returns what key holds, a string or a list.
func dump(t *testing.T, s *Store, key string) string {
	t.Helper()
	ctx := context.Background()
	if typ := s.client.Type(ctx, key).Val(); typ == "list" {
		return fmt.Sprint(s.client.LRange(ctx, key, 0, -1).Val())
	}
	return s.client.Get(ctx, key).Val()
}

// TestOpsErrors: what the store cannot do is refused before Redis is
// asked, and nothing changes.
func TestOpsErrors(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	ctx := context.Background()
	ok := mustPolicy(t, core.Rule{Name: "ok", Limit: 2, Window: time.Minute})
	odd := mustPolicy(t, core.Rule{Name: "odd", Limit: 2, Window: time.Minute + time.Nanosecond})
	custom := mustPolicy(t, core.Rule{Name: "custom", Algorithm: opsCustomAlg{core.FixedWindow}, Limit: 2, Window: time.Minute})
	take(t, s, storetest.T0, ok, "k", 2)
	if err := s.Refund(ctx, storetest.T0, []core.Request{{Policy: ok, Key: "k", Cost: 1}, {Policy: odd, Key: "k", Cost: 1}}); !errors.Is(err, ErrUnsupportedRule) {
		t.Fatalf("refund with a rule the store cannot run: %v", err)
	}
	if err := s.Refund(ctx, storetest.T0, []core.Request{{Policy: ok, Key: "k", Cost: 1}, {Policy: custom, Key: "k", Cost: 1}}); !errors.Is(err, core.ErrRefundUnsupported) {
		t.Fatalf("refund with a custom algorithm: %v", err)
	}
	if d := take(t, s, storetest.T0, ok, "k", 1); d.Allowed {
		t.Fatalf("a refused refund gave back: %+v", d)
	}
	out := make([]core.Decision, 1)
	if err := s.Peek(ctx, storetest.T0, []core.Request{{Policy: odd, Key: "k", Cost: 1}}, out); !errors.Is(err, ErrUnsupportedRule) {
		t.Fatalf("peek with a rule the store cannot run: %v", err)
	}
	if err := s.Peek(ctx, time.Time{}, []core.Request{{Policy: ok, Key: "k", Cost: 1}}, out); !errors.Is(err, ErrTimeOutOfRange) {
		t.Fatalf("peek at the zero time: %v", err)
	}
	if err := s.Reset(ctx, nil, "k"); err == nil {
		t.Fatal("reset without a policy: no error")
	}
	s.Close()
	if err := s.Peek(ctx, storetest.T0, []core.Request{{Policy: ok, Key: "k", Cost: 1}}, out); !errors.Is(err, ErrClosed) {
		t.Fatalf("peek after Close: %v", err)
	}
	if err := s.Refund(ctx, storetest.T0, []core.Request{{Policy: ok, Key: "k", Cost: 1}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("refund after Close: %v", err)
	}
	if err := s.Reset(ctx, ok, "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("reset after Close: %v", err)
	}
}

type opsCustomAlg struct{ core.Algorithm }

func (opsCustomAlg) Name() string { return "custom" }

// TestRefundSlidingLogLong refunds from the end of a long log: only the
// newest entries change, and the running counts stay right for the
// decisions that follow.
func TestRefundSlidingLogLong(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, &Config{ClientTime: true})
	ms := core.MustMemoryStore(nil)
	ctx := context.Background()
	p := mustPolicy(t, core.Rule{Name: "log", Algorithm: core.SlidingWindowLog, Limit: 3000, Window: time.Minute})
	at := storetest.T0
	for i := 0; i < 2000; i++ {
		at = at.Add(10 * time.Millisecond)
		req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
		var a, b [1]core.Decision
		ms.Take(ctx, at, req, a[:])
		s.Take(ctx, at, req, b[:])
		if i%100 == 99 {
			req[0].Cost = 37
			if err := s.Refund(ctx, at, req); err != nil {
				t.Fatal(err)
			}
			ms.Refund(ctx, at, req)
		}
	}
	for _, d := range []time.Duration{0, 20 * time.Second, 50 * time.Second, 61 * time.Second} {
		req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
		var a, b [1]core.Decision
		ms.Peek(ctx, at.Add(d), req, a[:])
		if err := s.Peek(ctx, at.Add(d), req, b[:]); err != nil {
			t.Fatal(err)
		}
		a[0].ResetAfter, a[0].RetryAfter = ceilMicro(a[0].ResetAfter), ceilMicro(a[0].RetryAfter)
		if a[0] != b[0] {
			t.Fatalf("+%v: memory %+v, redis %+v", d, a[0], b[0])
		}
	}
}

// TestPeekFallback: a Peek that cannot reach Redis asks the Fallback when
// it can peek, and returns the error otherwise; Refund and Reset return it.
func TestPeekFallback(t *testing.T) {
	ctx := context.Background()
	p := mustPolicy(t, core.Rule{Name: "fb", Limit: 3, Window: time.Minute})
	mem := core.MustMemoryStore(nil)
	take(t, mem, storetest.T0, p, "k", 2)
	s := newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: mem, Timeout: time.Second})
	out := make([]core.Decision, 1)
	if err := s.Peek(ctx, storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out); err != nil || !out[0].Allowed || out[0].Remaining != 0 {
		t.Fatalf("peek through the Fallback: %+v %v, want its decision (1 left, then 0)", out[0], err)
	}
	bare := newStore(t, deadClient(t), &Config{ClientTime: true, Timeout: time.Second})
	if err := bare.Peek(ctx, storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out); err == nil || out[0].Allowed {
		t.Fatalf("peek without Redis or Fallback: %+v %v, want an error", out[0], err)
	}
	if err := s.Refund(ctx, storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}); err == nil {
		t.Fatal("refund without Redis: no error")
	}
	if err := s.Reset(ctx, p, "k"); err == nil {
		t.Fatal("reset without Redis: no error")
	}
}

// TestPeekFallbackMarked: a Peek the Fallback answers marks its decisions
// with Decision.Fallback, as Take does: it decides exactly as Take would.
func TestPeekFallbackMarked(t *testing.T) {
	p := mustPolicy(t, core.Rule{Name: "api", Limit: 3, Window: time.Hour, Algorithm: core.FixedWindow})
	ctx := context.Background()
	s := newStore(t, deadClient(t), &Config{ClientTime: true, Fallback: core.MustMemoryStore(nil), Timeout: time.Second})
	reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	var peek, tk [1]core.Decision
	if err := s.Peek(ctx, storetest.T0, reqs, peek[:]); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, storetest.T0, reqs, tk[:]); err != nil {
		t.Fatal(err)
	}
	if !tk[0].Fallback {
		t.Fatalf("Take: %+v, want Fallback", tk[0])
	}
	if !peek[0].Fallback {
		t.Errorf("Peek decided by the Fallback: %+v, Fallback not set", peek[0])
	}
}

// TestOpsBoundedByTimeout: Peek, Refund and Reset are bounded by the
// store's Timeout also for a client without ContextTimeoutEnabled (whose
// reads would wait for its ReadTimeout), with an error matching
// context.DeadlineExceeded, and Close waits for the calls they abandon.
func TestOpsBoundedByTimeout(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	s := newStore(t, newClient(t, px.Addr()), &Config{ClientTime: true, Timeout: 100 * time.Millisecond})
	p := mustPolicy(t, core.Rule{Name: "ops", Limit: 3, Window: time.Minute})
	req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	take(t, s, storetest.T0, p, "k", 1)
	out := make([]core.Decision, 1)
	if err := s.Peek(ctx, storetest.T0, req, out); err != nil { // loads the ops script
		t.Fatal(err)
	}
	px.delay.Store(int64(2 * time.Second))
	ops := []struct {
		name string
		call func() error
	}{
		{"Peek", func() error { return s.Peek(ctx, storetest.T0, req, out) }},
		{"Refund", func() error { return s.Refund(ctx, storetest.T0, req) }},
		{"Reset", func() error { return s.Reset(ctx, p, "k") }},
	}
	for _, op := range ops {
		start := time.Now()
		err := op.call()
		if el := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || el > time.Second {
			t.Errorf("%s with Timeout 100ms and replies 2s late: %v after %v, want a timeout within a second", op.name, err, el)
		}
	}
	px.delay.Store(0)
	eventually(t, 5*time.Second, "the abandoned calls to end", func() bool { return s.gate.running() == 0 })
}

// TestPeekThroughBreaker: Peek goes through the circuit breaker as a
// decision does: with the breaker open it fails at once with
// ErrUnavailable (no wait on a Redis known to be failing), and a Peek the
// Fallback answers reports its backend failure with the time it took.
func TestPeekThroughBreaker(t *testing.T) {
	px := newProxy(t, redistest.Server(t))
	rec := &errorRecorder{}
	s := newStore(t, newClient(t, px.Addr()), &Config{Timeout: 50 * time.Millisecond, Breaker: &BreakerConfig{Failures: 1, OpenFor: time.Hour}})
	fs := newStore(t, newClient(t, px.Addr()), &Config{Timeout: 50 * time.Millisecond, Breaker: &BreakerConfig{Disabled: true}, Fallback: core.MustMemoryStore(nil), Observer: rec})
	p := mustPolicy(t, core.Rule{Name: "peeked", Limit: 5, Window: time.Hour})
	take(t, s, time.Now(), p, "k", 1) // connections warm
	take(t, fs, time.Now(), p, "k", 1)
	px.delay.Store(int64(200 * time.Millisecond))
	reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	var out [1]core.Decision
	if err := s.Take(context.Background(), time.Now(), reqs, out[:]); err == nil || s.State() != BreakerOpen {
		t.Fatalf("a Take on a slow Redis: %v, breaker %v; want a timeout and the breaker open", err, s.State())
	}
	if err := s.Peek(context.Background(), time.Now(), reqs, out[:]); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Peek with the breaker open: %v, want ErrUnavailable", err)
	}
	if err := fs.Peek(context.Background(), time.Now(), reqs, out[:]); err != nil || !out[0].Fallback {
		t.Fatalf("Peek with a Fallback on a slow Redis: %v %+v, want the Fallback's answer", err, out[0])
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.errs) != 1 || rec.lats[0] < 50*time.Millisecond {
		t.Fatalf("the Fallback's Peek reported %v with latencies %v, want one error of the Timeout's latency or more", rec.errs, rec.lats)
	}
}

// TestRefundByChargeOnServerClock: on the server's clock (the default), a
// refund naming its charge by Policy.ChargeStart, which reads the server's
// time of the decision from Decision.At, gives back that charge's unit
// under every algorithm; a sliding log finds its entry by that time to the
// microsecond.
func TestRefundByChargeOnServerClock(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	s := newStore(t, client, nil)
	ctx := context.Background()
	for _, alg := range []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowCounter, core.SlidingWindowLog} {
		t.Run(alg.Name(), func(t *testing.T) {
			// Three a day: nothing comes back while the test runs.
			r := core.Rule{Name: "srv-" + alg.Name(), Algorithm: alg, Limit: 3, Window: 24 * time.Hour}
			if alg == core.LeakyBucket {
				r.Burst = 3
			}
			p := mustPolicy(t, r)
			var d core.Decision
			var at time.Time
			for i := 0; i < 3; i++ {
				at = time.Now()
				before := time.Now()
				d = take(t, s, at, p, "k", 1)
				if !d.Allowed {
					t.Fatalf("charge %d refused: %+v", i+1, d)
				}
				if d.At.Before(before.Add(-time.Minute)) || d.At.After(time.Now().Add(time.Minute)) {
					t.Fatalf("charge %d: At %v is not the server's time of the decision (about %v)", i+1, d.At, before)
				}
			}
			req := []core.Request{{Policy: p, Key: "k", Cost: 1, ChargedAt: p.ChargeStart(at, 1, d)}}
			if err := s.Refund(ctx, time.Now(), req); err != nil {
				t.Fatal(err)
			}
			var out [1]core.Decision
			if err := s.Peek(ctx, time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
			if !out[0].Allowed || out[0].Remaining != 0 {
				t.Fatalf("after the refund of the third charge: %+v; want it admitted with 0 remaining after it", out[0])
			}
		})
	}
}
