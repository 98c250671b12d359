package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// The fault tests run against private servers they may stop, and bound
// their own duration: waits for real network time (a breaker's open
// period, a server coming back) poll with a deadline.

// eventually polls cond every few milliseconds until it holds or limit
// passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// transitions records breaker state changes.
type transitions struct {
	mu sync.Mutex
	s  []string
}

func (tr *transitions) record(from, to BreakerState) {
	tr.mu.Lock()
	tr.s = append(tr.s, from.String()+">"+to.String())
	tr.mu.Unlock()
}

func (tr *transitions) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.s...)
}

func TestFaultRedisKilled(t *testing.T) {
	for _, tc := range []struct {
		withFallback, ctxTimeout bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		withFallback := tc.withFallback
		name := "Errors"
		if withFallback {
			name = "Fallback"
		}
		if tc.ctxTimeout {
			// ContextTimeoutEnabled: the store pipelines by default
			name += "/ContextTimeout"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			client := newClient(t, srv.Addr(), func(o *redis.Options) {
				o.MaxRetries = 0 // go-redis defaults otherwise
				o.ContextTimeoutEnabled = tc.ctxTimeout
			})
			var tr transitions
			var fallback *core.MemoryStore
			cfg := &Config{
				Timeout:       100 * time.Millisecond,
				Breaker:       &BreakerConfig{Failures: 3, OpenFor: 100 * time.Millisecond},
				OnStateChange: tr.record,
			}
			if withFallback {
				fallback = core.MustMemoryStore(nil)
				cfg.Fallback = fallback
			}
			s := newStore(t, client, cfg)
			p := mustPolicy(t, core.Rule{Name: "killed", Limit: 1000, Window: 24 * time.Hour})

			var stop atomic.Bool
			var ok, failed, slow atomic.Int64
			var firstErr atomic.Pointer[error]
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var out [1]core.Decision
					for !stop.Load() {
						start := time.Now()
						err := s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
						if time.Since(start) > 100*time.Millisecond+400*time.Millisecond {
							slow.Add(1)
						}
						if err != nil {
							failed.Add(1)
							firstErr.CompareAndSwap(nil, &err)
							continue
						}
						ok.Add(1)
					}
				}()
			}
			eventually(t, 5*time.Second, "traffic before the kill", func() bool { return ok.Load() >= 50 })
			srv.Stop() // SIGKILL in the middle of the traffic
			okAtKill := ok.Load()
			if withFallback {
				eventually(t, 5*time.Second, "fallback decisions", func() bool { return ok.Load() >= okAtKill+200 })
			} else {
				eventually(t, 5*time.Second, "errors after the kill", func() bool { return failed.Load() >= 200 })
			}
			eventually(t, 5*time.Second, "breaker open", func() bool { return s.State() == BreakerOpen })
			srv.Restart(t)
			eventually(t, 10*time.Second, "breaker closed after the restart", func() bool { return s.State() == BreakerClosed })
			stop.Store(true)
			wg.Wait()

			if slow.Load() > 0 {
				t.Errorf("%d decisions took longer than the timeout allows", slow.Load())
			}
			if withFallback {
				if failed.Load() != 0 {
					t.Fatalf("%d errors with a fallback: %v", failed.Load(), *firstErr.Load())
				}
				if fallback.Len() == 0 {
					t.Fatal("the fallback decided nothing")
				}
			} else {
				if firstErr.Load() == nil {
					t.Fatal("no error while Redis was down")
				}
				if err := *firstErr.Load(); !errors.Is(err, ErrUnavailable) && !strings.HasPrefix(err.Error(), "redisstore: ") {
					t.Fatalf("error %v is neither ErrUnavailable nor a redisstore backend error", err)
				}
			}
			// Redis decides again, on the restarted (empty) server.
			d := take(t, s, time.Now(), p, "k", 1)
			key := redisKey(s.prefix, "killed", "", &core.Request{Key: "k"})
			if n, err := client.Exists(context.Background(), key).Result(); err != nil || n != 1 || !d.Allowed {
				t.Fatalf("after the restart: %+v, key in Redis: %d %v", d, n, err)
			}
			got := tr.list()
			if len(got) < 3 || got[0] != "closed>open" {
				t.Fatalf("breaker transitions %v, want closed>open first", got)
			}
			if got[len(got)-1] != "half-open>closed" {
				t.Fatalf("breaker transitions %v, want half-open>closed last", got)
			}
			t.Logf("ok %d, failed %d, transitions %v", ok.Load(), failed.Load(), got)
		})
	}
}

func TestFaultScriptFlush(t *testing.T) {
	addr := redistest.Server(t)
	client := newClient(t, addr)
	s := newStore(t, client, &Config{ClientTime: true})
	evalsBefore := commandCalls(t, client, "eval")
	for _, a := range core.Algorithms() {
		t.Run(a.Name(), func(t *testing.T) {
			p := mustPolicy(t, withBurst(core.Rule{Name: "flush-" + a.Name(), Algorithm: a, Limit: 300, Window: time.Hour}))
			var done atomic.Bool
			var flushes atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !done.Load() {
					if err := client.ScriptFlush(context.Background()).Err(); err != nil {
						t.Error(err)
						return
					}
					flushes.Add(1)
					time.Sleep(200 * time.Microsecond)
				}
			}()
			var errs atomic.Int64
			admitted := hammer(t, 16, 40, func(w, i int) bool {
				var out [1]core.Decision
				err := s.Take(context.Background(), storetest.T0, []core.Request{{Policy: p, Key: "hot", Cost: 1}}, out[:])
				if err != nil {
					errs.Add(1)
					return false
				}
				return out[0].Allowed
			})
			done.Store(true)
			wg.Wait()
			if errs.Load() != 0 || admitted != 300 {
				t.Fatalf("with %d SCRIPT FLUSHes: admitted %d (want exactly 300), %d errors", flushes.Load(), admitted, errs.Load())
			}
		})
	}
	if evals := commandCalls(t, client, "eval") - evalsBefore; evals < 5 {
		t.Fatalf("only %d EVALs after NOSCRIPT: the flushes did not hit", evals)
	}
}

// commandCalls returns the number of calls of a command from INFO
// commandstats.
func commandCalls(t testing.TB, c redis.UniversalClient, cmd string) int64 {
	t.Helper()
	stats, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	v := redistest.ParseInfo(stats)["cmdstat_"+cmd]
	// "calls=12,usec=..."
	for _, f := range splitComma(v) {
		if len(f) > 6 && f[:6] == "calls=" {
			n, _ := strconv.ParseInt(f[6:], 10, 64)
			return n
		}
	}
	return 0
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

func TestFaultLatency(t *testing.T) {
	for _, ctxBound := range []bool{false, true} {
		name := "GoroutineBound"
		if ctxBound {
			name = "ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			addr := redistest.Server(t)
			px := newProxy(t, addr)
			client := newClient(t, px.Addr(), func(o *redis.Options) {
				o.MaxRetries = 0
				o.ContextTimeoutEnabled = ctxBound
			})
			var tr transitions
			const timeout = 40 * time.Millisecond
			s := newStore(t, client, &Config{
				Timeout:       timeout,
				Breaker:       &BreakerConfig{Failures: 3, OpenFor: 150 * time.Millisecond},
				OnStateChange: tr.record,
			})
			if s.ctxBound != ctxBound {
				t.Fatalf("ctxBound = %v", s.ctxBound)
			}
			if err := s.Warm(context.Background()); err != nil {
				t.Fatal(err)
			}
			p := mustPolicy(t, core.Rule{Name: "slow", Limit: 1000, Window: time.Hour})
			try := func() (time.Duration, error) {
				var out [1]core.Decision
				start := time.Now()
				err := s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
				return time.Since(start), err
			}
			if _, err := try(); err != nil {
				t.Fatal(err)
			}
			px.delay.Store(int64(300 * time.Millisecond))
			for i := 0; i < 3; i++ {
				lat, err := try()
				if err == nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("slow Redis, decision %d: err = %v, want a timeout", i, err)
				}
				if lat > timeout+60*time.Millisecond {
					t.Fatalf("slow Redis, decision %d took %v, timeout %v", i, lat, timeout)
				}
			}
			if st := s.State(); st != BreakerOpen {
				t.Fatalf("after 3 timeouts the breaker is %v", st)
			}
			lat, err := try()
			if !errors.Is(err, ErrUnavailable) || lat > 10*time.Millisecond {
				t.Fatalf("open breaker: err %v after %v, want ErrUnavailable at once", err, lat)
			}
			px.delay.Store(0)
			eventually(t, 3*time.Second, "breaker closing once latency is gone", func() bool {
				_, err := try()
				return err == nil && s.State() == BreakerClosed
			})
			want := []string{"closed>open", "open>half-open", "half-open>closed"}
			got := tr.list()
			// A probe that met the last delayed replies may reopen it once.
			if len(got) < 3 || got[0] != want[0] || got[len(got)-1] != want[2] {
				t.Fatalf("transitions %v, want %v", got, want)
			}
		})
	}
}

// TestNoBlindRetry cuts the connection after Redis has run a script and
// answered: the store reports an error and the request is charged once,
// although go-redis, left to itself, retries a command whose connection
// broke (MaxRetries defaults to 3).
func TestNoBlindRetry(t *testing.T) {
	addr := redistest.Server(t)
	px := newProxy(t, addr)
	proxied := newClient(t, px.Addr(), func(o *redis.Options) { o.MaxRetries = 0 }) // go-redis default: 3 retries
	direct := newClient(t, addr)
	prefix := uniquePrefix(t)
	s := newStore(t, proxied, &Config{Prefix: prefix, ClientTime: true})
	check := newStore(t, direct, &Config{Prefix: prefix, ClientTime: true})
	p := mustPolicy(t, core.Rule{Name: "once", Limit: 10, Window: time.Hour})

	take(t, s, storetest.T0, p, "k", 1) // the script is cached; 9 left
	px.cut.Store(true)
	var out [1]core.Decision
	err := s.Take(context.Background(), storetest.T0, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:])
	px.cut.Store(false)
	if err == nil {
		t.Fatal("a cut connection reported no error")
	}
	if px.cuts.Load() != 1 {
		t.Fatalf("the script was sent %d times on cut connections, want 1 (no retry)", px.cuts.Load())
	}
	// The cut request ran once: 10 - 1 - 1 = 8 left before this one.
	if d := take(t, check, storetest.T0, p, "k", 1); d.Remaining != 7 {
		t.Fatalf("after the cut: Remaining %d, want 7 (the cut script charged exactly once)", d.Remaining)
	}

	// For comparison, redis.Script.Run on the same client re-sends the
	// script after the cut, and it runs again.
	px.cut.Store(true)
	key := redisKey(prefix, "once", "", &core.Request{Key: "k"})
	args := []any{"T", strconv.FormatInt(storetest.T0.UnixMicro(), 10), 0, 60000, infoOf(p).args, 1, 0}
	_ = takeScript.Run(context.Background(), proxied, []string{key}, args...).Err()
	px.cut.Store(false)
	t.Logf("redis.Script.Run sent the script %d times on cut connections", px.cuts.Load()-1)
	if d := take(t, check, storetest.T0, p, "k", 1); d.Remaining >= 6 {
		t.Logf("Script.Run did not retry here (Remaining %d)", d.Remaining)
	}
}

// TestServerTimeSkew runs two stores whose callers' clocks are hours apart
// against one Redis in server-time mode: the store decides at the server's
// time, so they admit exactly what one store would.
func TestServerTimeSkew(t *testing.T) {
	addr := redistest.Server(t)
	prefix := uniquePrefix(t)
	a := newStore(t, newClient(t, addr), &Config{Prefix: prefix})
	b := newStore(t, newClient(t, addr), &Config{Prefix: prefix})
	p := mustPolicy(t, core.Rule{Name: "skew", Limit: 50, Window: 24 * time.Hour})
	count := func(key string, skewA, skewB time.Duration) int {
		return hammer(t, 16, 10, func(w, i int) bool {
			s, skew := a, skewA
			if w%2 == 1 {
				s, skew = b, skewB
			}
			var out [1]core.Decision
			err := s.Take(context.Background(), time.Now().Add(skew), []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:])
			return err == nil && out[0].Allowed
		})
	}
	skewed := count("skewed", -5*time.Hour, 7*time.Hour)
	plain := count("plain", 0, 0)
	if skewed != 50 || plain != 50 {
		t.Fatalf("admitted %d with clocks 12h apart and %d without skew, want 50 and 50", skewed, plain)
	}
}

// TestManyStores hammers one key from several Store instances, each with
// its own client (as separate processes would), in server-time mode.
func TestManyStores(t *testing.T) {
	addr := redistest.Server(t)
	prefix := uniquePrefix(t)
	var stores []*Store
	for i := 0; i < 4; i++ {
		stores = append(stores, newStore(t, newClient(t, addr), &Config{Prefix: prefix}))
	}
	for _, a := range core.Algorithms() {
		t.Run(a.Name(), func(t *testing.T) {
			// Window algorithms align to the epoch: a 50-year window keeps
			// the test inside one window (2020-2070).
			w := 24 * time.Hour
			if a == core.FixedWindow || a == core.SlidingWindowLog || a == core.SlidingWindowCounter {
				w = core.MaxWindow
			}
			p := mustPolicy(t, withBurst(core.Rule{Name: "many-" + a.Name(), Algorithm: a, Limit: 100, Window: w}))
			admitted := hammer(t, 64, 5, func(w, i int) bool {
				var out [1]core.Decision
				err := stores[w%len(stores)].Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "hot", Cost: 1}}, out[:])
				if err != nil {
					t.Error(err)
				}
				return err == nil && out[0].Allowed
			})
			if admitted != 100 {
				t.Fatalf("4 stores x 16 goroutines admitted %d, want exactly 100", admitted)
			}
		})
	}
}

// TestBreakerCountsServerErrors feeds the breaker real error replies of a
// redis-server: replies about one call's own content (a script's runtime
// error, WRONGTYPE) never open it, however many in a row, and neither do
// they close a streak of failures; replies that say the server cannot
// serve (OOM) and errors on the way to it do.
func TestBreakerCountsServerErrors(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	ctx := context.Background()
	scriptErr := client.Eval(ctx, "return redis.call('nosuchcommand')", nil).Err()
	luaErr := client.Eval(ctx, "return KEYS[1] < 1", []string{"k"}).Err()
	client.Set(ctx, "str", "x", 0)
	typeErr := client.LPush(ctx, "str", "y").Err()
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	oomErr := client.Eval(ctx, "return redis.call('SET', KEYS[1], 'v')", []string{"k"}).Err()
	if err := client.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"script": scriptErr, "lua": luaErr, "type": typeErr, "oom": oomErr} {
		var re redis.Error
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v is not an error reply", name, err)
		}
	}
	if !strings.HasPrefix(oomErr.Error(), "OOM ") {
		t.Fatalf("a script's SET past maxmemory replied %v, want OOM", oomErr)
	}

	mk, err := newBreaker(&BreakerConfig{Failures: 3, OpenFor: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cb := mk("test")
	fail := func(err error) {
		t.Helper()
		_, got := cb.Execute(func() (struct{}, error) { return struct{}{}, fmt.Errorf("redisstore: %w", err) })
		if !errors.Is(got, err) {
			t.Fatalf("Execute returned %v, want %v", got, err)
		}
	}
	for i := 0; i < 10; i++ {
		fail(scriptErr)
		fail(luaErr)
		fail(typeErr)
	}
	if st := fromGobreaker(cb.State()); st != BreakerClosed {
		t.Fatalf("after 30 replies about calls' content: breaker %v, want closed", st)
	}
	down := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	fail(down)
	fail(oomErr)
	fail(scriptErr) // neither a failure nor a success: the streak goes on
	fail(down)
	if st := fromGobreaker(cb.State()); st != BreakerOpen {
		t.Fatalf("after three server failures in a row (one content error between them): breaker %v, want open", st)
	}
}

// eventRecorder records the ErrorEvents it observes.
type eventRecorder struct {
	core.NopObserver
	mu  sync.Mutex
	evs []core.ErrorEvent
}

func (r *eventRecorder) ObserveError(e core.ErrorEvent) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

// unknownClient hides a client's type, so that the store groups a batch by
// hash tag, as on a Ring: one script call per tag.
type unknownClient struct{ redis.UniversalClient }

// failRefunds fails, after 20 ms, every refund script call while on.
type failRefunds struct{ on atomic.Bool }

func (h *failRefunds) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failRefunds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failRefunds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && slices.Contains(cmd.Args(), any(modeRefund)) {
			time.Sleep(20 * time.Millisecond)
			err := errors.New("refund refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestSpreadRefundFailureReport: a batch spanning two script calls whose
// second layer is refused at the charge (another request took its last unit
// between the check and the charge) refunds the first; when that refund
// fails, the report names the first layer's policy alone, with the time
// the refund took.
func TestSpreadRefundFailureReport(t *testing.T) {
	c := newClient(t, redistest.Server(t))
	hook := &failRefunds{}
	c.AddHook(hook)
	rec := &eventRecorder{}
	s := newStore(t, unknownClient{c}, &Config{ClientTime: true, HashTag: TagByKey, Observer: rec})
	a := mustPolicy(t, core.Rule{Name: "sa", Limit: 5, Window: time.Hour})
	b := mustPolicy(t, core.Rule{Name: "sb", Limit: 1, Window: time.Hour})
	at := storetest.T0.Add(time.Hour)
	s.betweenPhases = func() {
		s.betweenPhases = nil
		if d := take(t, s, at, b, "k2", 1); !d.Allowed {
			t.Errorf("the interleaved take was refused")
		}
		hook.on.Store(true)
	}
	var out [2]core.Decision
	if err := s.Take(context.Background(), at, []core.Request{{Policy: a, Key: "k1", Cost: 1}, {Policy: b, Key: "k2", Cost: 1}}, out[:]); err != nil || out[1].Allowed {
		t.Fatalf("the batch: %v %+v, want sb refusing", err, out)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.evs) != 1 || len(rec.evs[0].Policies) != 1 || rec.evs[0].Policies[0] != a || rec.evs[0].Latency < 20*time.Millisecond {
		t.Fatalf("reported %+v, want one error naming sa alone, of 20ms or more", rec.evs)
	}
}

// The breaker asks callError about every call it runs, successes
// included: a success must cost no allocation (it used to cost one, a
// tenth of a decision's).
func TestCallErrorOfSuccessAllocatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	if n := testing.AllocsPerRun(100, func() {
		if callError(nil) {
			t.Fatal("a success is a call error")
		}
	}); n != 0 {
		t.Fatalf("callError(nil) allocates %v times", n)
	}
}
