package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestCloseWaitsForRunningTake closes the store while a Take is waiting for
// a slow reply and checks that Close returned only once that Take was
// over (the Take succeeds: its reply arrives), and that later Takes fail
// with ErrClosed.
func TestCloseWaitsForRunningTake(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	client := newClient(t, px.Addr(), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	s := newStore(t, client, &Config{Timeout: 5 * time.Second})
	p := mustPolicy(t, core.Rule{Name: "close", Limit: 10, Window: time.Hour})
	take := func() error {
		var out [1]core.Decision
		return s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	}
	if err := take(); err != nil { // warm connection and script
		t.Fatal(err)
	}
	const delay = 300 * time.Millisecond
	px.delay.Store(int64(delay))
	var takeEnded atomic.Int64 // Unix ns at which the slow Take returned
	errc := make(chan error, 1)
	go func() {
		err := take()
		takeEnded.Store(time.Now().UnixNano())
		errc <- err
	}()
	eventually(t, 5*time.Second, "the slow Take to start", func() bool { return s.gate.running() > 0 })
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed := time.Now()
	if err := <-errc; err != nil {
		t.Fatalf("the Take running during Close failed: %v", err)
	}
	if n := s.gate.running(); n != 0 {
		t.Fatalf("%d calls running after Close returned", n)
	}
	if waited := closed.Sub(start); waited < delay/2 {
		t.Fatalf("Close returned after %v, while the Take (reply delayed %v) was running", waited, delay)
	}
	if err := take(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after Close: err = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestCloseDuringTakes closes the store while goroutines hammer it (run
// with -race): no Take may succeed after Close returned, every Take fails
// with ErrClosed once it starts after Close, and nothing races.
func TestCloseDuringTakes(t *testing.T) {
	addr := redistest.Server(t)
	client := newClient(t, addr, func(o *redis.Options) { o.ContextTimeoutEnabled = false })
	for round := 0; round < 5; round++ {
		s := newStore(t, client, &Config{Timeout: 2 * time.Second})
		p := mustPolicy(t, core.Rule{Name: "close", Limit: 1 << 30, Window: time.Hour})
		var closedAt atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out [1]core.Decision
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					err := s.Take(ctx, time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
					cancel()
					if err != nil && !errors.Is(err, ErrClosed) {
						t.Errorf("Take: %v", err)
						return
					}
					if errors.Is(err, ErrClosed) && closedAt.Load() == 0 {
						// Close has begun; it must not have returned yet
						// if another Take is still running.
						continue
					}
				}
			}()
		}
		eventually(t, 5*time.Second, "Takes to run", func() bool { return s.gate.running() > 0 })
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		closedAt.Store(time.Now().UnixNano())
		close(stop)
		wg.Wait()
		if n := s.gate.running(); n != 0 {
			t.Fatalf("round %d: %d calls counted running after every Take returned", round, n)
		}
	}
}

// TestCloseBoundedByTimeout gives up on a slow call at its deadline (a
// client without ContextTimeoutEnabled, whose ReadTimeout is long) and
// checks that Close waits no longer than the store's Timeout for it, and
// says that a call was still running.
func TestCloseBoundedByTimeout(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	client := newClient(t, px.Addr(), func(o *redis.Options) {
		o.MaxRetries = 0
		o.ContextTimeoutEnabled = false
		o.ReadTimeout = 3 * time.Second
	})
	const timeout = 100 * time.Millisecond
	s := newStore(t, client, &Config{Timeout: timeout, Breaker: &BreakerConfig{Disabled: true}})
	p := mustPolicy(t, core.Rule{Name: "close", Limit: 10, Window: time.Hour})
	var out [1]core.Decision
	take := func() error {
		return s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	px.delay.Store(int64(time.Second))
	if err := take(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow call: err = %v, want a timeout", err)
	}
	start := time.Now()
	err := s.Close()
	waited := time.Since(start)
	if !errors.Is(err, ErrCloseTimeout) {
		t.Fatalf("Close with an abandoned call running: err = %v, want ErrCloseTimeout", err)
	}
	if waited > timeout+400*time.Millisecond {
		t.Fatalf("Close waited %v, more than the store's Timeout %v", waited, timeout)
	}
	if err := take(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after Close: err = %v, want ErrClosed", err)
	}
	px.delay.Store(0)
	eventually(t, 5*time.Second, "the abandoned call to end", func() bool { return s.gate.running() == 0 })
}

// TestCallerGone checks that a Take whose caller's context ended returns
// an error matching the context's error, that such errors never open the
// breaker nor go to the Fallback or the Observer, and that Redis keeps
// deciding afterwards.
func TestCallerGone(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	client := newClient(t, px.Addr(), func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = 0 })
	fallback := core.MustMemoryStore(nil)
	rec := &errorRecorder{}
	s := newStore(t, client, &Config{Timeout: 5 * time.Second, Fallback: fallback, Observer: rec,
		Breaker: &BreakerConfig{Failures: 2, OpenFor: time.Hour}})
	p := mustPolicy(t, core.Rule{Name: "gone", Limit: 100, Window: time.Hour})
	req := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	var out [1]core.Decision
	if err := s.Take(context.Background(), time.Now(), req, out[:]); err != nil {
		t.Fatal(err)
	}
	// Canceled before the call.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 5; i++ {
		err := s.Take(ctx, time.Now(), req, out[:])
		if !errors.Is(err, context.Canceled) || !IsCallerGone(err) {
			t.Fatalf("canceled context: err = %v, want context.Canceled", err)
		}
	}
	// Canceled and timed out during the call (the reply is delayed): a
	// client without ContextTimeoutEnabled is abandoned at cancellation,
	// one with it fails at the caller's deadline.
	abandoning := newClient(t, px.Addr(), func(o *redis.Options) { o.ContextTimeoutEnabled = false; o.MaxRetries = 0 })
	s2 := newStore(t, abandoning, &Config{Prefix: s.prefix, Timeout: 5 * time.Second, Fallback: fallback, Observer: rec,
		Breaker: &BreakerConfig{Failures: 2, OpenFor: time.Hour}})
	if err := s2.Take(context.Background(), time.Now(), req, out[:]); err != nil {
		t.Fatal(err)
	}
	px.delay.Store(int64(200 * time.Millisecond))
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		err := s2.Take(ctx, time.Now(), req, out[:])
		if !errors.Is(err, context.Canceled) || !IsCallerGone(err) {
			t.Fatalf("context canceled during the call: err = %v, want context.Canceled", err)
		}
		for _, st := range []*Store{s, s2} {
			ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
			err = st.Take(ctx, time.Now(), req, out[:])
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || !IsCallerGone(err) {
				t.Fatalf("caller's deadline during the call: err = %v, want context.DeadlineExceeded", err)
			}
		}
	}
	if st := s2.State(); st != BreakerClosed {
		t.Fatalf("breaker %v after callers went away, want closed", st)
	}
	px.delay.Store(0)
	if st := s.State(); st != BreakerClosed {
		t.Fatalf("breaker %v after callers went away, want closed", st)
	}
	rec.mu.Lock()
	reported := append([]error(nil), rec.errs...)
	rec.mu.Unlock()
	if len(reported) != 0 {
		t.Fatalf("%d errors reported to the Observer for callers that went away: %v", len(reported), reported)
	}
	// Nothing was decided by the fallback: its key is whole.
	var fo [1]core.Decision
	if err := fallback.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, fo[:]); err != nil {
		t.Fatal(err)
	}
	if fo[0].Remaining != 99 {
		t.Fatalf("fallback remaining %d, want 99 (untouched before)", fo[0].Remaining)
	}
	if err := s.Take(context.Background(), time.Now(), req, out[:]); err != nil || !out[0].Allowed {
		t.Fatalf("after: %+v, %v", out[0], err)
	}
}
