package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestPipelineExactUnderLoad(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	h := newHoldHook()
	client.AddHook(h)
	stressPipelined(t, client, h)
}

// stressPipelined decides from 32 goroutines on 8 keys through a store
// with one lane of client, whose hook h holds the first call until the
// other 31 goroutines' first calls queue behind it (so at least one
// pipeline is sent): each key admits exactly its limit, and every
// decision is right.
func stressPipelined(t *testing.T, client redis.UniversalClient, h *holdHook) {
	const (
		goroutines = 32
		each       = 40
		keys       = 8
		limit      = 100 // of goroutines*each/keys = 160 requests per key
	)
	s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1})
	p := mustPolicy(t, core.Rule{Name: "stress", Algorithm: core.FixedWindow, Limit: limit, Window: time.Hour})
	var mu sync.Mutex
	allowed := map[string]int{}
	remaining := map[string]map[int64]bool{}
	run := func(g int) error {
		for i := range each {
			key := string(rune('a' + (g+i)%keys))
			d, err := takeOne(s, context.Background(), p, key)
			if err != nil {
				return err
			}
			mu.Lock()
			if d.Allowed {
				allowed[key]++
				if remaining[key] == nil {
					remaining[key] = map[int64]bool{}
				}
				if remaining[key][d.Remaining] {
					mu.Unlock()
					return fmt.Errorf("key %s: two admissions left %d", key, d.Remaining)
				}
				remaining[key][d.Remaining] = true
			} else if d.Remaining != 0 {
				mu.Unlock()
				return fmt.Errorf("key %s: refused with %d remaining", key, d.Remaining)
			}
			mu.Unlock()
		}
		return nil
	}
	var next atomic.Int64
	errs := queueBehindHeld(t, s, h, goroutines-1, func() error { return run(int(next.Add(1))) })
	close(h.release)
	for range goroutines {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		key := string(rune('a' + k))
		if allowed[key] != limit {
			t.Errorf("key %s admitted %d, want %d", key, allowed[key], limit)
		}
	}
	sizes := h.sizes()
	// The first pipeline holds the 31 queued calls, and the held
	// goroutine's second if it queued before the pipeline left.
	if len(sizes) == 0 || sizes[0] < goroutines-1 || sizes[0] > goroutines {
		t.Fatalf("pipelines sent: %v, want a first one of %d or %d calls", sizes, goroutines-1, goroutines)
	}
	t.Logf("%d pipelines, %d calls each at most", len(sizes), slices.Max(sizes))
}

// holdHook blocks the first script call sent alone until release is
// closed, and records the script pipelines sent (their sizes and their
// contexts' deadlines). Before the first pipeline it runs beforePipeline,
// if set; a pipeline fails with failPipeline, if set, without reaching
// the server; and if holdPipeline is set, each pipeline, once recorded,
// closes pipelineHeld (the first time) and waits for holdPipeline.
type holdHook struct {
	mu             sync.Mutex
	held           bool
	holding        chan struct{} // closed once the first call is held
	release        chan struct{}
	pipelines      []int
	deadlines      []time.Time
	beforePipeline func()
	failPipeline   error
	holdPipeline   chan struct{}
	pipelineHeld   chan struct{}
}

func newHoldHook() *holdHook {
	return &holdHook{holding: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.mu.Lock()
			first := !h.held
			h.held = true
			h.mu.Unlock()
			if first {
				close(h.holding)
				<-h.release
			}
		}
		return next(ctx, cmd)
	}
}

func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if name := cmds[0].Name(); name != "evalsha" && name != "eval" {
			return next(ctx, cmds) // the connection's setup
		}
		h.mu.Lock()
		h.pipelines = append(h.pipelines, len(cmds))
		dl, _ := ctx.Deadline()
		h.deadlines = append(h.deadlines, dl)
		before, fail, hold := h.beforePipeline, h.failPipeline, h.holdPipeline
		h.beforePipeline = nil
		if hold != nil && len(h.pipelines) == 1 {
			close(h.pipelineHeld)
		}
		h.mu.Unlock()
		if before != nil {
			before()
		}
		if hold != nil {
			<-hold
		}
		if fail != nil {
			return fail // the commands' own errors left unset
		}
		return next(ctx, cmds)
	}
}

func (h *holdHook) sizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.pipelines...)
}

// waitIdle yields until no call of s runs (no pipeline is out).
func waitIdle(t *testing.T, s *Store) {
	t.Helper()
	for i := 0; s.gate.running() > 0; i++ {
		if i > 10_000_000 {
			t.Fatalf("%d calls still running", s.gate.running())
		}
		runtime.Gosched()
	}
}

// waitQueued yields until n calls wait in s's pipeline queue.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := 0; ; i++ {
		s.pipe.mu.Lock()
		q := len(s.pipe.queue)
		s.pipe.mu.Unlock()
		if q == n {
			return
		}
		if i > 10_000_000 {
			t.Fatalf("%d calls queued, want %d", q, n)
		}
		runtime.Gosched()
	}
}

// pipelinedStore returns a store with one lane over a client whose first
// script call is held by the returned hook.
func pipelinedStore(t *testing.T, opts ...func(*redis.Options)) (*Store, *holdHook) {
	t.Helper()
	client := newClient(t, redistest.Server(t), opts...)
	h := newHoldHook()
	client.AddHook(h)
	return newStore(t, client, &Config{ClientTime: true, Pipeline: 1}), h
}

func takeOne(s *Store, ctx context.Context, p *core.Policy, key string) (core.Decision, error) {
	out := make([]core.Decision, 1)
	err := s.Take(ctx, storetest.T0, []core.Request{{Policy: p, Key: key, Cost: 1}}, out)
	return out[0], err
}

// queueBehindHeld starts one run, whose script call h holds on the only
// lane of s, then n more, and returns once those n wait in the queue. The
// channel receives the n+1 runs' errors once h releases the first.
func queueBehindHeld(t *testing.T, s *Store, h *holdHook, n int, run func() error) <-chan error {
	t.Helper()
	errs := make(chan error, n+1)
	go func() { errs <- run() }()
	<-h.holding
	for range n {
		go func() { errs <- run() }()
	}
	waitQueued(t, s, n)
	return errs
}

// queueLeaverBehindHeld starts a Take of p's key "k", whose script call h
// holds on the only lane of s, then a second one, with a context that
// cancel ends, and returns once the second waits in the queue. first and
// left receive the two Takes' errors.
func queueLeaverBehindHeld(t *testing.T, s *Store, h *holdHook, p *core.Policy) (first, left <-chan error, cancel context.CancelFunc) {
	t.Helper()
	firstErr, leftErr := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := takeOne(s, context.Background(), p, "k")
		firstErr <- err
	}()
	<-h.holding
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_, err := takeOne(s, ctx, p, "k")
		leftErr <- err
	}()
	waitQueued(t, s, 1)
	return firstErr, leftErr, cancel
}

// takeQueuedBehindHeld takes p's key "k" once through a call h holds on
// the only lane of s and n times queued behind it, then lets them all go;
// every Take must succeed.
func takeQueuedBehindHeld(t *testing.T, s *Store, h *holdHook, p *core.Policy, n int) {
	t.Helper()
	errs := queueBehindHeld(t, s, h, n, func() error {
		_, err := takeOne(s, context.Background(), p, "k")
		return err
	})
	close(h.release)
	for range n + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestPipelineSendsWaitingCallsTogether(t *testing.T) {
	s, h := pipelinedStore(t)
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 100, Window: time.Minute})
	ctx := context.Background()
	const waiting = 10
	results := make(chan core.Decision, waiting+1)
	errs := queueBehindHeld(t, s, h, waiting, func() error {
		d, err := takeOne(s, ctx, p, "k")
		results <- d
		return err
	})
	// Every queued Take started, and set its deadline (the store's
	// Timeout), before this point.
	latest := time.Now().Add(s.timeout)
	close(h.release)
	seen := map[int64]bool{}
	for range waiting + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		d := <-results
		if !d.Allowed || seen[d.Remaining] {
			t.Fatalf("decision %+v (remaining values seen %v)", d, seen)
		}
		seen[d.Remaining] = true
	}
	for r := int64(100 - waiting - 1); r < 100; r++ {
		if !seen[r] {
			t.Fatalf("no decision left %d remaining: %v", r, seen)
		}
	}
	if got := h.sizes(); len(got) != 1 || got[0] != waiting {
		t.Fatalf("pipelines sent: %v, want one of %d calls", got, waiting)
	}
	// The pipeline's I/O ends with its callers' deadlines, not a Timeout
	// after it was sent.
	if dl := h.deadlines[0]; dl.IsZero() || dl.After(latest) {
		t.Fatalf("pipeline deadline %v, want one no later than its callers' (%v)", dl, latest)
	}
}

func TestPipelineDeadline(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) context.Context {
		ctx, cancel := context.WithDeadline(context.Background(), t0.Add(d))
		t.Cleanup(cancel)
		return ctx
	}
	calls := func(ctxs ...context.Context) []*pipeCall {
		var cs []*pipeCall
		for _, ctx := range ctxs {
			cs = append(cs, &pipeCall{ctx: ctx})
		}
		return cs
	}
	p := &pipeliner{timeout: time.Hour}
	if dl, ok := p.deadline(calls(at(time.Second), at(3*time.Second), at(2*time.Second))); !ok || !dl.Equal(t0.Add(3*time.Second)) {
		t.Errorf("deadline %v %v, want the latest, %v", dl, ok, t0.Add(3*time.Second))
	}
	if dl, ok := p.deadline(calls(at(time.Second), context.Background())); !ok || dl.Before(t0.Add(time.Hour)) || dl.After(time.Now().Add(time.Hour)) {
		t.Errorf("deadline %v %v with a call without one, want an hour (the timeout) from now", dl, ok)
	}
	if dl, ok := p.deadline(calls(at(2 * time.Hour))); !ok || dl.After(time.Now().Add(time.Hour)) {
		t.Errorf("deadline %v %v, want at most the timeout from now", dl, ok)
	}
	none := &pipeliner{timeout: -1}
	if dl, ok := none.deadline(calls(at(time.Second), context.Background())); ok {
		t.Errorf("deadline %v without a timeout and a call without a deadline, want none", dl)
	}
	if dl, ok := none.deadline(calls(at(time.Second))); !ok || !dl.Equal(t0.Add(time.Second)) {
		t.Errorf("deadline %v %v without a timeout, want the call's", dl, ok)
	}
}

func TestPipelineSplitsLongQueue(t *testing.T) {
	// The pool lets more decisions talk to Redis at once than a pipeline
	// carries.
	s, h := pipelinedStore(t, func(o *redis.Options) { o.PoolSize = 2 * maxPipeline })
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.TokenBucket, Limit: 1000, Window: time.Minute})
	const waiting = maxPipeline + 2
	takeQueuedBehindHeld(t, s, h, p, waiting)
	if got := h.sizes(); len(got) != 2 || got[0] != maxPipeline || got[1] != 2 {
		t.Fatalf("pipelines sent: %v, want %d then 2", got, maxPipeline)
	}
}

func TestPipelineErrorReachesEveryCall(t *testing.T) {
	// A pipeline that fails before it reaches the server (here in a hook)
	// fails each of its calls with its error, none with an empty answer.
	s, h := pipelinedStore(t)
	failQueued(t, s, h, 3)
}

// failQueued queues n calls behind the call h holds on the only lane of s,
// makes their pipeline fail in h, and checks that the held call succeeds
// and each queued one fails with the pipeline's error.
func failQueued(t *testing.T, s *Store, h *holdHook, n int) {
	t.Helper()
	fail := errors.New("pipeline refused by a hook")
	h.failPipeline = fail
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.TokenBucket, Limit: 100, Window: time.Minute})
	errs := queueBehindHeld(t, s, h, n, func() error {
		_, err := takeOne(s, context.Background(), p, "k")
		return err
	})
	close(h.release)
	failed := 0
	for range n + 1 {
		if err := <-errs; errors.Is(err, fail) {
			failed++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if failed != n {
		t.Fatalf("%d calls failed with the pipeline's error, want %d", failed, n)
	}
}

func TestPipelineCallerLeavesAfterSend(t *testing.T) {
	// A caller whose context ends while its pipeline is out returns at
	// once; the call, sent, still runs once. (With ContextTimeoutEnabled
	// the store waits for the call itself, not in a goroutine of its own.)
	s, h := pipelinedStore(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	h.holdPipeline, h.pipelineHeld = make(chan struct{}), make(chan struct{})
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	first, left, cancel := queueLeaverBehindHeld(t, s, h, p)
	close(h.release)
	<-h.pipelineHeld // the pipeline carrying the second call is out
	cancel()
	select {
	case err := <-left:
		if !IsCallerGone(err) || !errors.Is(err, context.Canceled) {
			t.Fatalf("caller gone: %v, want its cancellation", err)
		}
	case <-time.After(10 * time.Second): // a watchdog, not a measure: the pipeline is held
		t.Fatal("the caller waited for its pipeline after its context ended")
	}
	close(h.holdPipeline)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
	if d := take(t, s, storetest.T0, p, "k", 1); d.Remaining != 7 {
		t.Fatalf("remaining %d, want 7: the sent call ran once", d.Remaining)
	}
}

func TestPipelineDoesNotReloadForCallerGone(t *testing.T) {
	// The server has lost the script (NOSCRIPT: nothing ran) and the
	// caller has left meanwhile: its call is not sent again with EVAL.
	s, h := pipelinedStore(t)
	addr := s.client.(*redis.Client).Options().Addr
	h.holdPipeline, h.pipelineHeld = make(chan struct{}), make(chan struct{})
	h.beforePipeline = func() { redistest.Do(t, addr, "SCRIPT", "FLUSH") }
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	first, left, cancel := queueLeaverBehindHeld(t, s, h, p)
	close(h.release)
	<-h.pipelineHeld
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller gone: %v, want its cancellation", err)
	}
	close(h.holdPipeline)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
	if got := h.sizes(); len(got) != 1 {
		t.Fatalf("pipelines sent: %v, want only the first (EVALSHA)", got)
	}
	if d := take(t, s, storetest.T0, p, "k", 1); d.Remaining != 8 {
		t.Fatalf("remaining %d, want 8: the gone caller's call ran", d.Remaining)
	}
}

// panicHook panics in the first script call it sees.
type panicHook struct{ once *sync.Once }

func (panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.once.Do(func() { panic("a hook's bug") })
		}
		return next(ctx, cmd)
	}
}

func (panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestPipelinePanicFreesLane(t *testing.T) {
	client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	client.AddHook(panicHook{new(sync.Once)})
	s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1})
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the hook's panic did not reach the caller")
			}
		}()
		takeOne(s, context.Background(), p, "k")
	}()
	s.pipe.mu.Lock()
	busy := s.pipe.busy
	s.pipe.mu.Unlock()
	if busy != 0 {
		t.Fatalf("%d lanes busy after the panic, want 0", busy)
	}
	if _, err := takeOne(s, context.Background(), p, "k"); err != nil {
		t.Fatal(err)
	}
}

func TestPipelineDropsCallWhoseCallerLeft(t *testing.T) {
	s, h := pipelinedStore(t)
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	first, left, cancel := queueLeaverBehindHeld(t, s, h, p)
	cancel()
	if err := <-left; !IsCallerGone(err) || !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call: %v, want the caller's cancellation", err)
	}
	waitQueued(t, s, 0)
	close(h.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	d, err := takeOne(s, context.Background(), p, "k")
	if err != nil {
		t.Fatal(err)
	}
	// charged twice (the first call and this one), not three times
	if d.Remaining != 8 {
		t.Fatalf("remaining %d after two charges, want 8: the abandoned call was sent", d.Remaining)
	}
	if got := h.sizes(); len(got) != 0 {
		t.Fatalf("pipelines sent: %v, want none", got)
	}
}

// endedCtx is a context that reports itself canceled without closing its
// Done channel: only the pipeline can notice, not its waiting caller.
type endedCtx struct{ context.Context }

func (endedCtx) Err() error { return context.Canceled }

func TestPipelineDoesNotSendCallWhoseContextEnded(t *testing.T) {
	s, h := pipelinedStore(t)
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute})
	first := make(chan error, 1)
	go func() {
		_, err := takeOne(s, context.Background(), p, "k")
		first <- err
	}()
	<-h.holding
	ended := make(chan error, 1)
	go func() {
		// s.pipe directly: Take checks the context before it queues
		_, err := s.pipe.do(endedCtx{context.Background()}, s.script, []any{nil, nil, 0})
		ended <- err
	}()
	waitQueued(t, s, 1)
	close(h.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("call whose context ended: %v, want context.Canceled", err)
	}
	if got := h.sizes(); len(got) != 0 {
		t.Fatalf("pipelines sent: %v, want none", got)
	}
}

func TestPipelineReloadsFlushedScript(t *testing.T) {
	s, h := pipelinedStore(t)
	addr := s.client.(*redis.Client).Options().Addr
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.TokenBucket, Limit: 100, Window: time.Minute})
	h.beforePipeline = func() { redistest.Do(t, addr, "SCRIPT", "FLUSH") }
	const waiting = 5
	takeQueuedBehindHeld(t, s, h, p, waiting)
	// EVALSHA's pipeline found no script; EVAL's ran every call once
	if got := h.sizes(); len(got) != 2 || got[0] != waiting || got[1] != waiting {
		t.Fatalf("pipelines sent: %v, want two of %d calls", got, waiting)
	}
	d, err := takeOne(s, context.Background(), p, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 100-waiting-2 {
		t.Fatalf("remaining %d, want %d: a call ran twice or not at all", d.Remaining, 100-waiting-2)
	}
}

func TestPipelineFailureReachesEveryCall(t *testing.T) {
	// The connections are cut once the server has run the scripts and
	// answered: every call of the pipeline fails, and none is sent again,
	// although the client allows go-redis its default retries.
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	proxied := newClient(t, px.Addr(), func(o *redis.Options) { o.MaxRetries = 3 })
	prefix := uniquePrefix(t)
	s := newStore(t, proxied, &Config{Prefix: prefix, ClientTime: true, Pipeline: 1})
	check := newStore(t, newClient(t, addr), &Config{Prefix: prefix, ClientTime: true})
	p := mustPolicy(t, core.Rule{Name: "pipe", Algorithm: core.TokenBucket, Limit: 100, Window: time.Hour})
	take(t, s, storetest.T0, p, "k", 1) // the script is cached
	h := newHoldHook()
	proxied.AddHook(h)
	const waiting = 4
	errs := queueBehindHeld(t, s, h, waiting, func() error {
		_, err := takeOne(s, context.Background(), p, "k")
		return err
	})
	px.cut.Store(true)
	close(h.release)
	for range waiting + 1 {
		if err := <-errs; err == nil || IsCallerGone(err) {
			t.Fatalf("error %v, want the connection's failure", err)
		}
	}
	px.cut.Store(false)
	if got := h.sizes(); len(got) != 1 || got[0] != waiting {
		t.Fatalf("pipelines sent: %v, want one of %d calls", got, waiting)
	}
	if n := px.cuts.Load(); n != 2 {
		t.Fatalf("%d connections cut, want 2 (the call alone, then the pipeline): a retry", n)
	}
	// 1 before, 1 alone, 4 in the pipeline: each ran once
	if d := take(t, check, storetest.T0, p, "k", 1); d.Remaining != 100-waiting-3 {
		t.Fatalf("remaining %d, want %d: a call ran twice or not at all", d.Remaining, 100-waiting-3)
	}
}

func TestPipelineConfig(t *testing.T) {
	client := newClient(t, "127.0.0.1:1", func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	// The default pipelines adaptively on a client that bounds its I/O by
	// the context's deadline; a negative value not at all.
	if s, err := New(client, nil); err != nil || s.pipe == nil || s.pipe.lanes != autoLanes || s.pipe.linger != autoLinger {
		t.Fatalf("default: %v, pipeliner %+v, want an adaptive one", err, s.pipe)
	}
	unbounded := newClient(t, "127.0.0.1:1")
	if s, err := New(unbounded, nil); err != nil || s.pipe != nil {
		t.Fatalf("default without ContextTimeoutEnabled: %v, pipeliner %+v, want none", err, s.pipe)
	}
	if s, err := New(unbounded, &Config{Pipeline: 2}); err != nil || s.pipe == nil {
		t.Fatalf("Pipeline 2 without ContextTimeoutEnabled: %v, pipeliner %+v, want one", err, s.pipe)
	}
	if s, err := New(client, &Config{Pipeline: -1}); err != nil || s.pipe != nil {
		t.Fatalf("Pipeline -1: %v, pipeliner %+v, want none", err, s.pipe)
	}
	if s, err := New(client, &Config{Pipeline: 2}); err != nil || s.pipe == nil || s.pipe.lanes != 2 || s.pipe.linger != 0 {
		t.Fatalf("Pipeline 2: %v, pipeliner %+v, want 2 lanes, always", err, s.pipe)
	}
	// A pipeline spanning nodes waits for the slowest.
	cluster := newClusterClient(t, []string{"127.0.0.1:1"})
	if _, err := New(cluster, &Config{Pipeline: 2}); err == nil || !strings.Contains(err.Error(), "single-node") {
		t.Fatalf("Pipeline on a Cluster client: %v, want an error", err)
	}
	if s, err := New(cluster, nil); err != nil || s.pipe != nil {
		t.Fatalf("default on a Cluster client: %v, pipeliner %+v, want none", err, s.pipe)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { ring.Close() })
	if _, err := New(ring, &Config{Pipeline: 2}); err == nil || !strings.Contains(err.Error(), "single-node") {
		t.Fatalf("Pipeline on a Ring: %v, want an error", err)
	}
	if s, err := New(ring, nil); err != nil || s.pipe != nil {
		t.Fatalf("default on a Ring: %v, pipeliner %+v, want none", err, s.pipe)
	}
}

// fakeMono is a monotonic clock for the adaptive pipeliner that moves only
// when told to.
type fakeMono struct{ t atomic.Int64 }

func newFakeMono() *fakeMono {
	f := &fakeMono{}
	f.t.Store(int64(time.Second))
	return f
}

func (f *fakeMono) now() time.Duration  { return time.Duration(f.t.Load()) }
func (f *fakeMono) add(d time.Duration) { f.t.Add(int64(d)) }

// frees records n lanes of p coming free, interval apart on f.
func frees(p *pipeliner, f *fakeMono, interval time.Duration, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range n {
		f.add(interval)
		p.freed()
	}
}

func TestPipelineAdaptiveRule(t *testing.T) {
	f := newFakeMono()
	p := &pipeliner{lanes: 1, linger: 100 * time.Microsecond, now: f.now}
	if p.soon(f.now()) {
		t.Fatal("soon before any lane came free")
	}
	// Lanes come free every 50µs: within a few dozen, a call may wait.
	n := 0
	for !p.soon(f.now()) {
		if n++; n > 40 {
			t.Fatalf("lanes free every 50µs, gap %v after %d: never soon", p.gap, n)
		}
		frees(p, f, 50*time.Microsecond, 1)
	}
	if n < 2 {
		t.Fatalf("soon after %d lanes came free, want an average of several", n)
	}
	last := f.now()
	if !p.soon(last + 100*time.Microsecond) {
		t.Fatal("not soon 100µs after a lane came free")
	}
	if p.soon(last + 101*time.Microsecond) {
		t.Fatal("soon 101µs after the last lane came free")
	}
	// Lanes come free every 300µs: soon no longer, even right after one.
	frees(p, f, 300*time.Microsecond, 12)
	if p.soon(f.now()) {
		t.Fatalf("soon with lanes free every 300µs (gap %v)", p.gap)
	}
	// After an idle second, frequent lanes make it soon again within a
	// few dozen (the intervals are counted at most 16 lingers long).
	f.add(time.Second)
	n = 0
	for !p.soon(f.now()) {
		if n++; n > 40 {
			t.Fatalf("after an idle spell, gap %v after %d lanes free every 10µs", p.gap, n)
		}
		frees(p, f, 10*time.Microsecond, 1)
	}
}

// adaptiveStore returns an adaptive store of one lane, on the fake clock
// f, over a client whose first script call is held by the returned hook.
func adaptiveStore(t *testing.T, f *fakeMono) (*Store, *holdHook) {
	t.Helper()
	client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	h := newHoldHook()
	client.AddHook(h)
	s := newStore(t, client, &Config{ClientTime: true})
	if s.pipe == nil || s.pipe.linger == 0 {
		t.Fatal("the default store does not pipeline adaptively")
	}
	s.pipe.lanes, s.pipe.now = 1, f.now
	if err := s.Warm(context.Background()); err != nil { // so that no pipeline is sent again with EVAL
		t.Fatal(err)
	}
	return s, h
}

// within returns ch's value, failing t if none comes in 10 seconds.
func within(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
		return nil
	}
}

func TestPipelineAdaptiveSendsAloneWhileLanesAreSlow(t *testing.T) {
	f := newFakeMono()
	s, h := adaptiveStore(t, f)
	p := mustPolicy(t, core.Rule{Name: "adaptive", Limit: 100, Window: time.Minute})
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { _, err := takeOne(s, context.Background(), p, "k"); first <- err }()
	<-h.holding
	// The only lane is held, and lanes come free every 300µs: a call
	// would wait long, so it goes alone.
	frees(s.pipe, f, 300*time.Microsecond, 20)
	go func() { _, err := takeOne(s, context.Background(), p, "k"); second <- err }()
	if err := within(t, second, "the second call, with the lane held"); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	if err := within(t, first, "the held call"); err != nil {
		t.Fatal(err)
	}
	if got := h.sizes(); len(got) != 0 {
		t.Fatalf("pipelines sent: %v, want none", got)
	}
}

// queueAdaptive returns an adaptive store of one lane on the fake clock f,
// on which lanes have come free every 20µs, with 3 calls queued behind the
// call its hook h holds (the clock standing still since). errs receives
// the 4 calls' errors, p is their policy.
func queueAdaptive(t *testing.T) (s *Store, h *holdHook, f *fakeMono, p *core.Policy, errs <-chan error) {
	t.Helper()
	f = newFakeMono()
	s, h = adaptiveStore(t, f)
	p = mustPolicy(t, core.Rule{Name: "adaptive", Limit: 100, Window: time.Minute})
	frees(s.pipe, f, 20*time.Microsecond, 40)
	errs = queueBehindHeld(t, s, h, 3, func() error { _, err := takeOne(s, context.Background(), p, "k"); return err })
	return s, h, f, p, errs
}

// wantOnePipeline fails t unless h saw one pipeline, of n calls.
func wantOnePipeline(t *testing.T, h *holdHook, n int) {
	t.Helper()
	if got := h.sizes(); len(got) != 1 || got[0] != n {
		t.Fatalf("pipelines sent: %v, want one of %d calls", got, n)
	}
}

func TestPipelineAdaptiveQueuesWhileLanesFreeOften(t *testing.T) {
	// The clock stands still: the queue has not waited a linger when the
	// held lane comes free.
	_, h, _, _, errs := queueAdaptive(t)
	close(h.release)
	for range 4 {
		if err := within(t, errs, "a call"); err != nil {
			t.Fatal(err)
		}
	}
	wantOnePipeline(t, h, 3)
}

func TestPipelineAdaptiveSendsQueueThatWaitedALinger(t *testing.T) {
	s, h, f, p, errs := queueAdaptive(t)
	// The queue waits a linger without a lane: it goes out on a lane of
	// its own while the held call still holds the first.
	f.add(s.pipe.linger)
	for range 3 {
		if err := within(t, errs, "a queued call, after a linger"); err != nil {
			t.Fatal(err)
		}
	}
	wantOnePipeline(t, h, 3)
	close(h.release)
	if err := within(t, errs, "the held call"); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
	if s.pipe.busy != 0 {
		t.Fatalf("%d lanes busy after every call, want 0", s.pipe.busy)
	}
	if d, err := takeOne(s, context.Background(), p, "k"); err != nil || d.Remaining != 100-5 {
		t.Fatalf("after 4 calls: %+v, %v; want 95 remaining", d, err)
	}
}

// TestPipelineAdaptiveExactUnderLoad decides from 64 goroutines through a
// default store: pipelined or not, each key admits exactly its limit.
func TestPipelineAdaptiveExactUnderLoad(t *testing.T) {
	client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	h := newHoldHook()
	close(h.release) // nothing held
	client.AddHook(h)
	s := newStore(t, client, nil)
	const (
		goroutines = 64
		each       = 50
		keys       = 8
		limit      = 300 // of goroutines*each/keys = 400 requests per key
	)
	p := mustPolicy(t, core.Rule{Name: "stress", Limit: limit, Window: time.Hour})
	var allowed [keys]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				k := (g + i) % keys
				d, err := takeOne(s, context.Background(), p, string(rune('a'+k)))
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if n := allowed[k].Load(); n != limit {
			t.Errorf("key %c admitted %d, want %d", 'a'+k, n, limit)
		}
	}
	t.Logf("%d pipelines", len(h.sizes()))
}

// lateCtx has a deadline in the past and does not report it yet, as the
// store's timeout contexts may for a moment.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

func TestEnded(t *testing.T) {
	if err := ended(context.Background()); err != nil {
		t.Errorf("ended(Background) = %v", err)
	}
	if err := ended(lateCtx{context.Background()}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ended(a passed deadline) = %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ended(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("ended(canceled) = %v, want Canceled", err)
	}
}

func TestPipelineFailureCountsOnceAgainstBreaker(t *testing.T) {
	// A pipeline of 5 calls fails: one round trip failed, so a breaker
	// opening at 2 consecutive failures stays closed, and one opening at 1
	// opens. Every caller still gets the pipeline's error.
	for _, failures := range []uint32{1, 2} {
		t.Run(fmt.Sprint(failures), func(t *testing.T) {
			client := newClient(t, redistest.Server(t))
			h := newHoldHook()
			client.AddHook(h)
			s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1, Breaker: &BreakerConfig{Failures: failures, OpenFor: time.Hour}})
			failQueued(t, s, h, 5)
			want := BreakerClosed
			if failures == 1 {
				want = BreakerOpen
			}
			if got := s.State(); got != want {
				t.Fatalf("breaker %v after one failed pipeline, want %v", got, want)
			}
		})
	}
}

func TestPipelineTimeoutCountsOnceAgainstBreaker(t *testing.T) {
	// A pipeline outlasts the Timeout of its 4 calls: each caller leaves
	// with a timeout, and the breaker counts one failure (two if the held
	// call, sent alone, timed out too on a slow machine), not four.
	client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	h := newHoldHook()
	h.holdPipeline, h.pipelineHeld = make(chan struct{}), make(chan struct{})
	client.AddHook(h)
	s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1, Timeout: 50 * time.Millisecond, Breaker: &BreakerConfig{Failures: 3, OpenFor: time.Hour}})
	p := mustPolicy(t, core.Rule{Name: "pipe", Limit: 100, Window: time.Minute})
	const waiting = 4
	errs := queueBehindHeld(t, s, h, waiting, func() error {
		_, err := takeOne(s, context.Background(), p, "k")
		return err
	})
	close(h.release) // the held call returns; its lane sends the queue, held
	<-h.pipelineHeld
	timedOut := 0
	for range waiting + 1 {
		err := <-errs
		switch {
		case errors.Is(err, context.DeadlineExceeded) && !IsCallerGone(err):
			timedOut++
		case err != nil:
			t.Fatal(err)
		}
	}
	close(h.holdPipeline)
	if timedOut < waiting {
		t.Fatalf("%d calls timed out, want at least %d", timedOut, waiting)
	}
	if got := s.State(); got != BreakerClosed {
		t.Fatalf("breaker %v after one pipeline timed out, want closed (one failure)", got)
	}
	waitIdle(t, s)
}

// TestPipelineCallerGoneDoesNotHideTimeout: a pipeline carries A, whose
// caller's own deadline is short, and B, bounded by the store's Timeout
// alone, and Redis does not answer. A leaves first (its caller gone: not
// counted), and B's timeout still counts: the round trip's failure is the
// first the breaker would count.
func TestPipelineCallerGoneDoesNotHideTimeout(t *testing.T) {
	for _, withA := range []bool{false, true} {
		t.Run(fmt.Sprint("A=", withA), func(t *testing.T) {
			client := newClient(t, redistest.Server(t), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
			h := newHoldHook()
			h.holdPipeline, h.pipelineHeld = make(chan struct{}), make(chan struct{})
			client.AddHook(h)
			s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1, Timeout: 400 * time.Millisecond,
				Breaker: &BreakerConfig{Failures: 1, OpenFor: time.Hour}})
			p := mustPolicy(t, core.Rule{Name: "pipe", Limit: 100, Window: time.Minute})
			first, aErr, bErr := make(chan error, 1), make(chan error, 1), make(chan error, 1)
			go func() { _, err := takeOne(s, context.Background(), p, "k"); first <- err }()
			<-h.holding
			n := 0
			if withA {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				go func() { _, err := takeOne(s, ctx, p, "k"); aErr <- err }()
				n++
				waitQueued(t, s, n)
			}
			go func() { _, err := takeOne(s, context.Background(), p, "k"); bErr <- err }()
			waitQueued(t, s, n+1)
			close(h.release)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			<-h.pipelineHeld
			if withA {
				if err := <-aErr; !IsCallerGone(err) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("A: %v, want its caller gone at its deadline", err)
				}
			}
			if err := <-bErr; err == nil || IsCallerGone(err) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("B: %v, want the store's timeout", err)
			}
			close(h.holdPipeline)
			waitIdle(t, s)
			if got := h.sizes(); len(got) != 1 || got[0] != n+1 {
				t.Fatalf("pipelines %v, want one of %d", got, n+1)
			}
			if got := s.State(); got != BreakerOpen {
				t.Fatalf("breaker %v after B timed out (Failures 1), want open", got)
			}
		})
	}
}

// goneCtx reports itself canceled once gone is set, without closing its
// Done channel: a caller canceled between the pipeline's answer and the
// store's look at its context.
type goneCtx struct {
	context.Context
	gone *atomic.Bool
}

func (c goneCtx) Err() error {
	if c.gone.Load() {
		return context.Canceled
	}
	return nil
}

// TestPipelineCallerGoneDoesNotHideFailure: a pipeline of A and B fails
// (a hook's error, as a broken connection would), and A's caller is gone
// by the time the answer arrives: B's failure counts.
func TestPipelineCallerGoneDoesNotHideFailure(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	h := newHoldHook()
	client.AddHook(h)
	s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1, Breaker: &BreakerConfig{Failures: 1, OpenFor: time.Hour}})
	fail := errors.New("pipeline refused by a hook")
	h.failPipeline = fail
	var gone atomic.Bool
	h.beforePipeline = func() { gone.Store(true) }
	p := mustPolicy(t, core.Rule{Name: "pipe", Limit: 100, Window: time.Minute})
	first, aErr, bErr := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { _, err := takeOne(s, context.Background(), p, "k"); first <- err }()
	<-h.holding
	go func() { _, err := takeOne(s, goneCtx{context.Background(), &gone}, p, "k"); aErr <- err }()
	waitQueued(t, s, 1)
	go func() { _, err := takeOne(s, context.Background(), p, "k"); bErr <- err }()
	waitQueued(t, s, 2)
	close(h.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-aErr; !IsCallerGone(err) {
		t.Fatalf("A: %v, want its caller gone", err)
	}
	if err := <-bErr; !errors.Is(err, fail) || IsCallerGone(err) {
		t.Fatalf("B: %v, want the pipeline's failure", err)
	}
	if got := s.State(); got != BreakerOpen {
		t.Fatalf("breaker %v after B's pipeline failed (Failures 1), want open", got)
	}
}

// TestPipelineTwoFailedPipelinesCountTwice: two pipelines fail in turn on
// one lane: two round trips failed, each counted once.
func TestPipelineTwoFailedPipelinesCountTwice(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	h := newHoldHook()
	h.holdPipeline, h.pipelineHeld = make(chan struct{}), make(chan struct{})
	client.AddHook(h)
	s := newStore(t, client, &Config{ClientTime: true, Pipeline: 1, Breaker: &BreakerConfig{Failures: 5, OpenFor: time.Hour}})
	fail := errors.New("pipeline refused by a hook")
	h.failPipeline = fail
	p := mustPolicy(t, core.Rule{Name: "pipe", Limit: 100, Window: time.Minute})
	errs := queueBehindHeld(t, s, h, 2, func() error { _, err := takeOne(s, context.Background(), p, "k"); return err })
	close(h.release)
	<-h.pipelineHeld // the first pipeline, of 2 calls, is out
	more := make(chan error, 2)
	for i := range 2 {
		go func() { _, err := takeOne(s, context.Background(), p, "k"); more <- err }()
		waitQueued(t, s, i+1)
	}
	close(h.holdPipeline)
	for range 3 {
		<-errs
	}
	for range 2 {
		if err := <-more; !errors.Is(err, fail) {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	if got := h.sizes(); len(got) != 2 || got[0] != 2 || got[1] != 2 {
		t.Fatalf("pipelines %v, want two of 2 calls", got)
	}
	if c := s.breaker.Counts(); c.TotalFailures != 2 || c.TotalExclusions != 2 {
		t.Fatalf("breaker counts %+v, want 2 failures and 2 exclusions", c)
	}
}
