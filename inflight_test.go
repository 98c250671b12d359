package ratelimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// watchedSlots is a SlotTable that reports every release on a channel.
type watchedSlots struct {
	*core.SlotTable
	released chan struct{}
	acquired atomic.Int64
}

func newWatchedSlots() *watchedSlots {
	return &watchedSlots{SlotTable: core.NewSlotTable(0), released: make(chan struct{}, 1024)}
}

func (w *watchedSlots) Acquire(ctx context.Context, reqs []core.SlotRequest, out []core.SlotDecision) (func(), error) {
	release, err := w.SlotTable.Acquire(ctx, reqs, out)
	if release == nil {
		return nil, err
	}
	w.acquired.Add(1)
	return func() {
		release()
		w.released <- struct{}{}
	}, err
}

// waitReleased waits for one release.
func (w *watchedSlots) waitReleased(t *testing.T) {
	t.Helper()
	select {
	case <-w.released:
	case <-time.After(10 * time.Second):
		t.Fatal("the slot was never released")
	}
}

// inFlightLayer is a concurrency layer of n per client IP named "in-flight".
func inFlightLayer(n int64) ratelimit.Layer {
	return ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: n}
}

func getFrom(ip string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/slow", nil)
	r.RemoteAddr = ip + ":1234"
	return r
}

func TestInFlightReleasedOnReturn(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(2)}, ratelimit.WithSlotStore(slots),
		ratelimit.WithHeaders(ratelimit.XRateLimitHeaders|ratelimit.IETFHeaders))
	gate := make(chan struct{})
	started := make(chan struct{}, 2)
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-gate
	}))
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, getFrom("192.0.2.1"))
			codes[i] = rec.Code
		}()
	}
	<-started
	<-started
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 2 {
		t.Fatalf("in flight = %d, want 2", got)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, getFrom("192.0.2.1"))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: %d, want 429", rec.Code)
	}
	for name, want := range map[string]string{
		"Retry-After":           "1",
		"X-Ratelimit-Limit":     "2",
		"X-Ratelimit-Remaining": "0",
		"Ratelimit-Policy":      `"in-flight";q=2;qu="concurrent-requests"`,
		"Ratelimit":             `"in-flight";r=0;t=1`,
	} {
		if got := rec.Header().Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	// Another client has slots of its own.
	other := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(other, getFrom("192.0.2.2")); close(done) }()
	<-started
	close(gate)
	wg.Wait()
	<-done
	if codes[0] != 200 || codes[1] != 200 || other.Code != 200 {
		t.Fatalf("codes %v and %d, want 200s", codes, other.Code)
	}
	if n := slots.Len(); n != 0 {
		t.Fatalf("%d keys still hold slots after every request returned", n)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, getFrom("192.0.2.1"))
	if rec.Code != 200 {
		t.Fatalf("request after the others finished: %d, want 200", rec.Code)
	}
}

func TestInFlightReleasedOnPanic(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(slots))
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), getFrom("192.0.2.1"))
	}()
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 0 {
		t.Fatalf("in flight after a panic = %d, want 0", got)
	}
	rec := httptest.NewRecorder()
	mwOKHandler := l.Handler(mwOK)
	mwOKHandler.ServeHTTP(rec, getFrom("192.0.2.1"))
	if rec.Code != 200 {
		t.Fatalf("after the panic: %d, want 200", rec.Code)
	}
}

// TestInFlightReleasedOnDisconnect serves over a real connection: the client
// goes away, the handler sees its context end and returns, and the slot is
// given back.
func TestInFlightReleasedOnDisconnect(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1}},
		ratelimit.WithSlotStore(slots))
	started := make(chan struct{})
	srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	})))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	if got := slots.InFlight("in-flight", "127.0.0.1"); got != 1 {
		t.Fatalf("in flight = %d, want 1", got)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want a cancelled request", err)
	}
	slots.waitReleased(t)
	if got := slots.InFlight("in-flight", "127.0.0.1"); got != 0 {
		t.Fatalf("in flight after the client went away = %d, want 0", got)
	}
}

func TestInFlightReleasedOnHijack(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(slots))
	srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		_ = rw.Flush()
		go func() { // the connection outlives the handler
			time.AfterFunc(50*time.Millisecond, func() { conn.Close() })
		}()
	})))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("hijacked response %d", resp.StatusCode)
	}
	slots.waitReleased(t)
	if got := slots.InFlight("in-flight", "127.0.0.1"); got != 0 {
		t.Fatalf("in flight after a hijacked request returned = %d, want 0", got)
	}
}

// TestInFlightComposes checks both directions: a request the rate layer
// refuses holds no slot, and one the concurrency layer refuses charges no
// rate layer.
func TestInFlightComposes(t *testing.T) {
	slots := newWatchedSlots()
	rate := ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 3, Window: time.Hour}}
	l := mwLimiter(t, []ratelimit.Layer{rate, inFlightLayer(1)}, ratelimit.WithSlotStore(slots))
	gate := make(chan struct{})
	started := make(chan struct{})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-gate
		}
	}))
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, getFrom("192.0.2.1"))
		done <- rec.Code
	}()
	<-started
	// Refused by the concurrency layer: the rate layer is not charged.
	for range 5 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, getFrom("192.0.2.1"))
		if rec.Code != http.StatusTooManyRequests {
			t.Fatalf("while one is in flight: %d, want 429", rec.Code)
		}
	}
	res := l.Decide(getFrom("192.0.2.1"))
	if res.Proceed || len(res.Layers) != 1 || res.Layers[0].Decision.Policy.Name() != "in-flight" || !res.Layers[0].Refused {
		t.Fatalf("Decide while one is in flight: %+v, want a refusal by the in-flight layer alone", res)
	}
	close(gate)
	if code := <-done; code != 200 {
		t.Fatalf("slow request: %d", code)
	}
	// The rate layer was charged once: two more pass, then it refuses.
	fast := func() int {
		r := getFrom("192.0.2.1")
		r.URL.Path = "/fast"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	for i := range 2 {
		if code := fast(); code != 200 {
			t.Fatalf("fast request %d: %d, want 200 (the concurrency refusals must not charge the rate layer)", i, code)
		}
	}
	before := slots.acquired.Load()
	if code := fast(); code != http.StatusTooManyRequests {
		t.Fatalf("over the rate: %d, want 429", code)
	}
	// Refused by the rate layer: it took a slot and gave it back at once.
	if slots.acquired.Load() != before+1 {
		t.Fatalf("acquisitions %d, want %d", slots.acquired.Load(), before+1)
	}
	slots.waitReleased(t) // the two fast requests' and this one's
	if n := slots.Len(); n != 0 {
		t.Fatalf("%d keys hold slots after a rate refusal", n)
	}
	// Decide too: a Result the rate layer refused holds nothing.
	res = l.Decide(getFrom("192.0.2.1"))
	if res.Proceed || len(res.Layers) != 2 || !res.Layers[0].Refused || res.Layers[1].Refused {
		t.Fatalf("Decide over the rate: %+v, want the rate layer refusing, in layer order", res)
	}
	if n := slots.Len(); n != 0 {
		t.Fatalf("%d keys hold slots after Decide was refused by the rate layer", n)
	}
}

// TestInFlightExactUnderConcurrency: 64 goroutines, one key, a limit of 5:
// exactly 5 hold a slot at once.
func TestInFlightExactUnderConcurrency(t *testing.T) {
	const goroutines, limit = 64, 5
	slots := core.NewSlotTable(0)
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(limit)}, ratelimit.WithSlotStore(slots))
	gate := make(chan struct{})
	var served, refused atomic.Int64
	allRefused := make(chan struct{})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		<-gate
	}))
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, getFrom("192.0.2.1"))
			if rec.Code == http.StatusTooManyRequests && refused.Add(1) == goroutines-limit {
				close(allRefused)
			}
		}()
	}
	select {
	case <-allRefused:
	case <-time.After(10 * time.Second):
		t.Fatalf("refused %d, want %d", refused.Load(), goroutines-limit)
	}
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != limit {
		t.Fatalf("in flight %d, want %d", got, limit)
	}
	close(gate)
	wg.Wait()
	if served.Load() != limit || refused.Load() != goroutines-limit {
		t.Fatalf("served %d refused %d, want %d and %d", served.Load(), refused.Load(), limit, goroutines-limit)
	}
	if slots.Len() != 0 {
		t.Fatalf("%d keys hold slots after every request", slots.Len())
	}

	// The same through Decide, with the Results released afterwards.
	results := make([]ratelimit.Result, goroutines)
	for i := range goroutines {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = l.Decide(getFrom("192.0.2.1")) }()
	}
	wg.Wait()
	proceeded := 0
	for i := range results {
		if results[i].Proceed {
			proceeded++
		}
	}
	if proceeded != limit {
		t.Fatalf("Decide admitted %d, want %d", proceeded, limit)
	}
	for i := range results {
		results[i].Release()
		results[i].Release() // a second release gives nothing back
	}
	if slots.Len() != 0 {
		t.Fatalf("%d keys hold slots after Release", slots.Len())
	}
}

func TestInFlightAdmit(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(slots),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(err, ratelimit.ErrConfig) || !errors.Is(err, ratelimit.ErrNoRelease) {
				t.Errorf("error %v, want ErrConfig and ErrNoRelease", err)
			}
		}))

	t.Run("context that never ends", func(t *testing.T) {
		rec := httptest.NewRecorder()
		if l.Admit(rec, getFrom("192.0.2.1")) {
			t.Fatal("Admit admitted a request whose slot it could never give back")
		}
		if rec.Code != http.StatusInternalServerError {
			t.Fatalf("code %d, want 500", rec.Code)
		}
		if slots.Len() != 0 {
			t.Fatal("a slot was taken")
		}
	})
	t.Run("released when the context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		r := getFrom("192.0.2.1").WithContext(ctx)
		if !l.Admit(httptest.NewRecorder(), r) {
			t.Fatal("refused")
		}
		if l.Admit(httptest.NewRecorder(), getFrom("192.0.2.1").WithContext(ctx)) {
			t.Fatal("a second request was admitted while the first holds the only slot")
		}
		cancel()
		slots.waitReleased(t)
		if slots.Len() != 0 {
			t.Fatal("the slot was kept after the context ended")
		}
	})
	t.Run("AdmitFunc", func(t *testing.T) {
		ok, done := l.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
		if !ok {
			t.Fatal("refused")
		}
		ok2, done2 := l.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
		if ok2 {
			t.Fatal("admitted over the limit")
		}
		done2()
		if got := slots.InFlight("in-flight", "192.0.2.1"); got != 1 {
			t.Fatalf("in flight %d after the refused request's done, want 1", got)
		}
		done()
		done()
		if got := slots.InFlight("in-flight", "192.0.2.1"); got != 0 {
			t.Fatalf("in flight %d after done, want 0", got)
		}
	})
}

func TestInFlightConfig(t *testing.T) {
	cases := []struct {
		name  string
		layer ratelimit.Layer
		want  string
	}{
		{"negative", ratelimit.Layer{Key: ratelimit.MustClientIP(), InFlight: -1}, "InFlight must not be negative"},
		{"with a rate", ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Limit: 5, Window: time.Second}, InFlight: 1}, "takes only Rule.Name"},
		{"with a cost", ratelimit.Layer{Key: ratelimit.MustClientIP(), InFlight: 1, Cost: func(*http.Request) int64 { return 2 }}, "takes no Cost"},
		{"too large", ratelimit.Layer{Key: ratelimit.MustClientIP(), InFlight: core.MaxLimit + 1}, "exceeds core.MaxLimit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ratelimit.New([]ratelimit.Layer{c.layer})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ratelimit: layer ") {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 5, Window: time.Second}},
		inFlightLayer(2),
	})
	if err := l.SetRules(map[string]core.Rule{"in-flight": {Limit: 9, Window: time.Second}}); err == nil {
		t.Fatal("SetRules changed a concurrency layer")
	}
	if rules := l.Rules(); len(rules) != 1 || rules["rate"].Limit != 5 {
		t.Fatalf("Rules() = %v, want the rate layer only", rules)
	}
	if _, err := ratelimit.New([]ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(nil)); err == nil {
		t.Fatal("New accepted a nil SlotStore")
	}
	// A SlotTable too small for one request's concurrency layers would
	// refuse every request with a Retry-After never kept.
	two := []ratelimit.Layer{inFlightLayer(5), {Key: ratelimit.Global("all"), Rule: core.Rule{Name: "global-in-flight"}, InFlight: 100}}
	if _, err := ratelimit.New(two, ratelimit.WithSlotStore(core.NewSlotTable(1))); err == nil || !strings.Contains(err.Error(), "fewer than one request's 2 concurrency layers") {
		t.Fatalf("New with a SlotTable of 1 key for 2 concurrency layers: %v", err)
	}
	if _, err := ratelimit.New(two, ratelimit.WithSlotStore(core.NewSlotTable(2))); err != nil {
		t.Fatalf("a SlotTable of 2 keys: %v", err)
	}
}

// failingSlots fails every acquisition.
type failingSlots struct{}

func (failingSlots) Acquire(context.Context, []core.SlotRequest, []core.SlotDecision) (func(), error) {
	return nil, errors.New("backend down")
}

func TestInFlightStoreFailure(t *testing.T) {
	closed := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithFailClosed())
	rec := httptest.NewRecorder()
	closed.Handler(mwOK).ServeHTTP(rec, getFrom("192.0.2.1"))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed: %d, want 503", rec.Code)
	}
	full := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "a"}, InFlight: 1},
	}, ratelimit.WithSlotStore(core.NewSlotTable(1)))
	gate := make(chan struct{})
	started := make(chan struct{})
	h := full.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { close(started); <-gate }))
	go h.ServeHTTP(httptest.NewRecorder(), getFrom("192.0.2.1"))
	<-started
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, getFrom("192.0.2.2"))
	close(gate)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("a new key in a full table: %d Retry-After %q, want 429 and 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// inFlightObserver records the decisions of the in-flight policy.
type inFlightObserver struct {
	core.NopObserver
	mu       sync.Mutex
	admitted []bool
	errs     int
}

func (o *inFlightObserver) ObserveDecision(e core.DecisionEvent) {
	if e.Decision.Policy.Name() != "in-flight" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.admitted = append(o.admitted, e.Admitted)
}

func (o *inFlightObserver) ObserveError(core.ErrorEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs++
}

func TestInFlightObserved(t *testing.T) {
	obs := &inFlightObserver{}
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithObserver(obs))
	ok, done := l.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
	ok2, _ := l.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
	done()
	if !ok || ok2 {
		t.Fatalf("admitted %v %v", ok, ok2)
	}
	if len(obs.admitted) != 2 || !obs.admitted[0] || obs.admitted[1] {
		t.Fatalf("observed %v, want [true false]", obs.admitted)
	}
	failing := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithObserver(obs), ratelimit.WithSlotStore(failingSlots{}))
	failing.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
	if obs.errs != 1 {
		t.Fatalf("observed %d errors, want 1", obs.errs)
	}
	// A slot store failing because the request's context ended (its
	// client went away) is no store failure.
	gone := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithObserver(obs), ratelimit.WithSlotStore(ctxSlots{}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1").WithContext(ctx))
	if obs.errs != 1 {
		t.Fatalf("observed %d errors after a client went away, want still 1", obs.errs)
	}
}

// ctxSlots fails an acquisition with its context's error.
type ctxSlots struct{}

func (ctxSlots) Acquire(ctx context.Context, _ []core.SlotRequest, _ []core.SlotDecision) (func(), error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestInFlightObservedAfterRateLayers checks that a concurrency layer's
// decision is reported as admitted only when its slot stays taken: a
// request a rate layer refuses gives its slot back, and its concurrency
// layer's event says not admitted (promlimit's not_charged); in dry-run
// mode the refused request is served and keeps its slot (admitted).
func TestInFlightObservedAfterRateLayers(t *testing.T) {
	for _, dry := range []bool{false, true} {
		obs := &mwObserver{}
		opts := []ratelimit.Option{ratelimit.WithObserver(obs)}
		if dry {
			opts = append(opts, ratelimit.WithDryRun())
		}
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("rate")},
			inFlightLayer(5),
		}, opts...)
		for range 3 {
			_, done := l.AdmitFunc(httptest.NewRecorder(), getFrom("192.0.2.1"))
			done()
		}
		var got []string
		for _, ev := range obs.decisions {
			got = append(got, fmt.Sprintf("%s:%v:%v", ev.Decision.Policy.Name(), ev.Decision.Allowed, ev.Admitted))
		}
		want := []string{
			"rate:true:true", "in-flight:true:true",
			"rate:false:false", "in-flight:true:false",
			"rate:false:false", "in-flight:true:false",
		}
		if dry {
			want[3], want[5] = "in-flight:true:true", "in-flight:true:true"
		}
		if !slices.Equal(got, want) {
			t.Fatalf("dry-run %v: events %v, want %v", dry, got, want)
		}
	}
}

// TestInFlightWithResult checks that the Result-carrying entry points give
// the slots back: HandlerWithResult when the handler returns (a panic
// included), AdmitWithResult when the request's context ends, and at once
// for a request they refuse.
func TestInFlightWithResult(t *testing.T) {
	slots := newWatchedSlots()
	l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithSlotStore(slots))
	var seen bool
	h := l.HandlerWithResult(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, seen = ratelimit.ResultFromContext(r.Context())
		if r.Header.Get("X-Panic") != "" {
			panic(http.ErrAbortHandler)
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), getFrom("192.0.2.1"))
	if !seen {
		t.Fatal("the handler saw no Result")
	}
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 0 {
		t.Fatalf("after HandlerWithResult returned: %d in flight, want 0", got)
	}
	func() {
		defer func() { _ = recover() }()
		r := getFrom("192.0.2.1")
		r.Header.Set("X-Panic", "1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 0 {
		t.Fatalf("after a panic: %d in flight, want 0", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	r := getFrom("192.0.2.1").WithContext(ctx)
	if _, ok := l.AdmitWithResult(httptest.NewRecorder(), r); !ok {
		t.Fatal("AdmitWithResult refused a free slot")
	}
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 1 {
		t.Fatalf("while the request runs: %d in flight, want 1", got)
	}
	if _, ok := l.AdmitWithResult(httptest.NewRecorder(), getFrom("192.0.2.1").WithContext(ctx)); ok {
		t.Fatal("AdmitWithResult admitted a second request for one slot")
	}
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 1 {
		t.Fatalf("after a refusal: %d in flight, want 1", got)
	}
	for len(slots.released) > 0 {
		<-slots.released // the releases above
	}
	cancel()
	slots.waitReleased(t)
	if got := slots.InFlight("in-flight", "192.0.2.1"); got != 0 {
		t.Fatalf("after the context ended: %d in flight, want 0", got)
	}
}

// TestInFlightStoreFailureKeepsRateLayers checks that a failing slot store
// under fail-open drops only the concurrency layers: the rate layer still
// limits every request.
func TestInFlightStoreFailureKeepsRateLayers(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Hour}},
		inFlightLayer(5),
	}, ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithLogger(nil))
	served := 0
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	for range 50 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, getFrom("192.0.2.1"))
		if served <= 2 && rec.Code == http.StatusOK && rec.Header().Get("X-Ratelimit-Limit") != "2" {
			t.Fatalf("an admitted request has X-RateLimit-Limit %q, want the rate layer's 2", rec.Header().Get("X-Ratelimit-Limit"))
		}
	}
	if served != 2 {
		t.Fatalf("served %d of 50 requests with the slot store down, want 2 (the rate layer still limits)", served)
	}
}

// panicObserver panics on the decisions of the layer named "in-flight".
type panicObserver struct{ core.NopObserver }

func (panicObserver) ObserveDecision(e core.DecisionEvent) {
	if e.Decision.Policy.Name() == "in-flight" {
		panic("observer fails")
	}
}

// A user callback that panics while a request holds its in-flight slots (an
// error handler under fail-open, an Observer) must not keep them for good:
// net/http recovers the panic, and the client would be refused from then on.
func TestInFlightSlotsGivenBackOnPanic(t *testing.T) {
	serveRecovered := func(h http.Handler, r *http.Request) {
		defer func() { _ = recover() }() // as net/http does
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	t.Run("error handler", func(t *testing.T) {
		slots := core.NewSlotTable(0)
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 100, Window: time.Hour}},
			inFlightLayer(1),
		}, ratelimit.WithStore(&mwFailStore{}), ratelimit.WithSlotStore(slots),
			ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { panic("error handler fails") }))
		serveRecovered(l.Handler(mwOK), getFrom("192.0.2.1"))
		if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
			t.Fatalf("after the request ended (its error handler panicked): %d slots held, want 0", n)
		}
	})
	t.Run("observer", func(t *testing.T) {
		slots := core.NewSlotTable(0)
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Hour}},
			inFlightLayer(1),
		}, ratelimit.WithSlotStore(slots), ratelimit.WithObserver(panicObserver{}))
		for range 2 { // admitted, then refused by "rate": both panic in the Observer
			serveRecovered(l.Handler(mwOK), getFrom("192.0.2.1"))
		}
		if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
			t.Fatalf("after both requests ended: %d slots held, want 0", n)
		}
	})
}

// A concurrency layer whose slot is given back because a rate layer refused
// reports Remaining without it, as a rate layer whose cost another layer
// refused does: in the Result, in the headers and to the Observer.
func TestInFlightRemainingAfterRateRefusal(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Hour}},
		inFlightLayer(1),
	}, ratelimit.WithHeaders(ratelimit.IETFHeaders))
	h := l.Handler(mwOK)
	h.ServeHTTP(httptest.NewRecorder(), getFrom("192.0.2.1"))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, getFrom("192.0.2.1")) // refused by "rate"; no slot held
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", rec.Code)
	}
	if got, want := rec.Header().Get("RateLimit"), `"rate";r=0;t=3600, "in-flight";r=1;t=0`; got != want {
		t.Errorf("RateLimit: %s, want %s (the in-flight layer's one slot is free)", got, want)
	}
	res := l.Decide(getFrom("192.0.2.1"))
	defer res.Release()
	for _, lr := range res.Layers {
		if lr.Decision.Policy.Name() == "in-flight" && lr.Decision.Remaining != 1 {
			t.Errorf("Decide: in-flight layer Remaining %d with no slot held, want 1", lr.Decision.Remaining)
		}
	}
}

// A slot store that fails under fail-open, beside rate layers that decide,
// reaches the error handler, as every store error does; a handler that
// writes a response stops the request, one that does not lets it be served.
func TestInFlightSlotStoreFailureReachesErrorHandler(t *testing.T) {
	for _, withRate := range []bool{false, true} {
		for _, stop := range []bool{false, true} {
			layers := []ratelimit.Layer{inFlightLayer(1)}
			if withRate {
				layers = append(layers, ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 100, Window: time.Minute}})
			}
			var seen []error
			e := mwNew(t, layers, ratelimit.WithSlotStore(failingSlots{}),
				ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
					seen = append(seen, err)
					if stop {
						http.Error(w, "busy", http.StatusServiceUnavailable)
					}
				}))
			rec := e.do(t, getFrom("192.0.2.1"))
			if len(seen) != 1 || !errors.Is(seen[0], ratelimit.ErrStoreFailure) {
				t.Errorf("rate layers %v: the error handler saw %v, want one error wrapping ErrStoreFailure", withRate, seen)
			}
			if want := map[bool]int{false: http.StatusOK, true: http.StatusServiceUnavailable}[stop]; rec.Code != want {
				t.Errorf("rate layers %v, handler writes %v: status %d, want %d", withRate, stop, rec.Code, want)
			}
		}
	}
}

// An error handler that stops a request whose slot store failed open gives
// back the waiting-room slot a shaping delay reserved for it.
func TestInFlightSlotStoreFailureStoppedReleasesWaitingRoom(t *testing.T) {
	layers := []ratelimit.Layer{
		inFlightLayer(1),
		{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second, MaxDelay: 10 * time.Second}},
	}
	e := mwNew(t, layers, ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithMaxWaiting(1),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}))
	ratelimit.SetWaitFunc(e.l, func(context.Context, time.Duration) error { return nil })
	e.do(t, getFrom("192.0.2.1")) // no delay
	e.do(t, getFrom("192.0.2.1")) // admitted with a delay, stopped by the error handler
	if w := ratelimit.Waiting(e.l); w != 0 {
		t.Errorf("%d waiting after the error handler stopped the request, want 0", w)
	}
}

// A request whose slot store failed open and that the error handler stops
// after its rate layers admitted it is not served, so it is charged
// nothing, as under the fail-closed policy.
func TestInFlightSlotStoreFailureStoppedChargesNothing(t *testing.T) {
	layers := []ratelimit.Layer{
		inFlightLayer(1),
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 2, Window: time.Hour}},
	}
	for _, tc := range []struct {
		name string
		opt  ratelimit.Option
	}{
		{"fail-closed", ratelimit.WithFailClosed()},
		{"error handler stops", ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mwNew(t, layers, ratelimit.WithSlotStore(failingSlots{}), tc.opt)
			for i := 0; i < 3; i++ {
				if rec := e.do(t, getFrom("192.0.2.1")); rec.Code != http.StatusServiceUnavailable {
					t.Fatalf("request %d: %d, want 503", i, rec.Code)
				}
			}
			if e.served.Load() != 0 {
				t.Fatalf("served %d", e.served.Load())
			}
			p := e.l.Peek(getFrom("192.0.2.1"))
			// Peek's Remaining counts the request it peeks for.
			if len(p.Layers) != 1 || !p.Layers[0].Decision.Allowed || p.Layers[0].Decision.Remaining != 1 {
				t.Fatalf("after three unserved requests the rate layer says %+v, want 1 remaining after a request (nothing charged)", p.Layers)
			}
		})
	}
}

// A slot store failure reaches the error handler when the rate layers
// refuse the request too; a handler that writes nothing lets the refusal
// (429) follow.
func TestInFlightSlotStoreFailureOnRateRefusal(t *testing.T) {
	var seen []error
	e := mwNew(t, []ratelimit.Layer{
		inFlightLayer(1),
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Hour}},
	}, ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		seen = append(seen, err)
	}))
	if rec := e.do(t, getFrom("192.0.2.1")); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}
	if rec := e.do(t, getFrom("192.0.2.1")); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", rec.Code)
	}
	if len(seen) != 2 || !errors.Is(seen[1], ratelimit.ErrStoreFailure) {
		t.Fatalf("the error handler saw %v for 2 failed acquisitions", seen)
	}
}

// In dry-run, a slot store failure leaves the rate layers deciding, as an
// enforcing Limiter's fail-open does, so that dry-run previews enforcing.
func TestInFlightSlotStoreFailureDryRun(t *testing.T) {
	layers := []ratelimit.Layer{
		inFlightLayer(1),
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 1, Window: time.Hour}},
	}
	for _, dry := range []bool{false, true} {
		opts := []ratelimit.Option{ratelimit.WithSlotStore(failingSlots{})}
		if dry {
			opts = append(opts, ratelimit.WithDryRun())
		}
		e := mwNew(t, layers, opts...)
		e.do(t, getFrom("192.0.2.1"))
		res := e.l.Decide(getFrom("192.0.2.1"))
		if len(res.Layers) != 1 || !res.Layers[0].Refused || !errors.Is(res.Err, ratelimit.ErrStoreFailure) && res.Err != nil {
			t.Errorf("dry-run %v: second request's rate layer: %+v (err %v), want it decided and refused", dry, res.Layers, res.Err)
		}
		if res.Proceed != dry {
			t.Errorf("dry-run %v: Proceed %v", dry, res.Proceed)
		}
		res.Release()
	}
}

// nopWriter is a ResponseWriter that discards everything.
type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (nopWriter) WriteHeader(int)             {}

// TestInFlightWaitFailureReleases: a Result of Decide that Wait turns into
// a refusal (here its context ended) gives its in-flight slots back, as
// the built-in paths do; a later Release on it or on a copy does nothing.
func TestInFlightWaitFailureReleases(t *testing.T) {
	slots := core.NewSlotTable(0)
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}},
		inFlightLayer(3),
	}, ratelimit.WithSlotStore(slots))
	first := l.Decide(getFrom("192.0.2.1"))
	res := l.Decide(getFrom("192.0.2.1"))
	if !first.Proceed || !res.Proceed || res.Delay <= 0 {
		t.Fatalf("first %+v, shaped %+v", first, res)
	}
	if n := slots.InFlight("in-flight", "192.0.2.1"); n != 2 {
		t.Fatalf("%d slots held, want 2", n)
	}
	copyOf := res
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Wait(ctx, &res); err == nil || res.Proceed {
		t.Fatalf("Wait %v, proceed %v", err, res.Proceed)
	}
	l.Refuse(nopWriter{}, getFrom("192.0.2.1"), &res)
	if n := slots.InFlight("in-flight", "192.0.2.1"); n != 1 {
		t.Fatalf("%d slots held after the failed Wait, want 1 (the first request's)", n)
	}
	copyOf.Release()
	res.Release()
	if n := slots.InFlight("in-flight", "192.0.2.1"); n != 1 {
		t.Fatalf("%d slots after releasing the refused Result again, want 1", n)
	}
	first.Release()
	if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
		t.Fatalf("%d slots after every release", n)
	}
}

// TestInFlightNoReleaseDryRun: a request whose context never ends cannot
// give its slots back: Admit and AdmitWithResult refuse it with a
// configuration error, except in dry-run, which serves every
// configuration error (and gives its slots back at once).
func TestInFlightNoReleaseDryRun(t *testing.T) {
	for _, dry := range []bool{false, true} {
		slots := core.NewSlotTable(0)
		opts := []ratelimit.Option{ratelimit.WithSlotStore(slots)}
		if dry {
			opts = append(opts, ratelimit.WithDryRun())
		}
		l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, opts...)
		for range 2 {
			rec := httptest.NewRecorder()
			if ok := l.Admit(rec, getFrom("192.0.2.1")); ok != dry || (!dry && rec.Code != http.StatusInternalServerError) {
				t.Fatalf("dry-run %v: Admit %v, %d", dry, ok, rec.Code)
			}
			rec = httptest.NewRecorder()
			if _, ok := l.AdmitWithResult(rec, getFrom("192.0.2.1")); ok != dry || (!dry && rec.Code != http.StatusInternalServerError) {
				t.Fatalf("dry-run %v: AdmitWithResult %v, %d", dry, ok, rec.Code)
			}
		}
		if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
			t.Fatalf("dry-run %v: %d slots held", dry, n)
		}
	}
}

// slowSlots is a SlotTable whose every call takes 5ms on clk (a Redis
// round trip, say).
type slowSlots struct {
	clk *core.FakeClock
	t   *core.SlotTable
}

func (s slowSlots) Acquire(ctx context.Context, reqs []core.SlotRequest, out []core.SlotDecision) (func(), error) {
	s.clk.Advance(5 * time.Millisecond)
	return s.t.Acquire(ctx, reqs, out)
}

// TestInFlightRateLatencyExcludesSlots: a rate layer's latency is the time
// its store took, not the slot store's round trip before it; the rate
// layers are decided at the time the slots were taken.
func TestInFlightRateLatencyExcludesSlots(t *testing.T) {
	clk := core.NewFakeClock(mwT0)
	obs := &mwObserver{}
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100).Named("rate")},
		inFlightLayer(5),
	}, ratelimit.WithClock(clk), ratelimit.WithObserver(obs), ratelimit.WithSlotStore(slowSlots{clk, core.NewSlotTable(0)}))
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(httptest.NewRecorder(), getFrom("192.0.2.1"))
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.decisions) != 2 {
		t.Fatalf("%d decisions observed", len(obs.decisions))
	}
	for _, ev := range obs.decisions {
		want := time.Duration(0)
		if ev.Decision.Policy.Name() == "in-flight" {
			want = 5 * time.Millisecond
		}
		if ev.Latency != want {
			t.Errorf("%s: latency %v, want %v", ev.Decision.Policy.Name(), ev.Latency, want)
		}
	}
}

// TestInFlightDecideSlotFailOpenLogged: Decide with a failing slot store
// proceeds on its rate layers alone, and says so once in the log, as the
// handlers do.
func TestInFlightDecideSlotFailOpenLogged(t *testing.T) {
	logs, logOpt := newLogBuf()
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100).Named("rate")},
		inFlightLayer(1),
	}, ratelimit.WithSlotStore(failingSlots{}), logOpt)
	for range 3 {
		res := l.Decide(getFrom("192.0.2.1"))
		if !res.Proceed || len(res.Layers) != 1 {
			t.Fatalf("Decide: %+v", res)
		}
		res.Release()
	}
	if n := logs.count("in-flight slot store errors are being served fail-open"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs)
	}
}

// TestInFlightNoReleaseDryRunErrorHandler: in dry-run, the configuration
// error of a request whose context never ends reaches the error handler,
// which may stop the request; otherwise the request is served.
func TestInFlightNoReleaseDryRunErrorHandler(t *testing.T) {
	for _, stop := range []bool{false, true} {
		var seen []error
		l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, ratelimit.WithDryRun(),
			ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				seen = append(seen, err)
				if stop {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			}))
		rec := httptest.NewRecorder()
		if ok := l.Admit(rec, getFrom("192.0.2.1")); ok == stop {
			t.Fatalf("stop %v: Admit %v (%d)", stop, ok, rec.Code)
		}
		if len(seen) != 1 || !errors.Is(seen[0], ratelimit.ErrNoRelease) {
			t.Fatalf("stop %v: the error handler saw %v", stop, seen)
		}
	}
}

// cancelStore is a MemoryStore that ends ctxCancel's context once it has
// decided: the client leaves during the shaping delay.
type cancelStore struct {
	ms     *core.MemoryStore
	cancel func()
}

func (s *cancelStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	err := s.ms.Take(ctx, now, reqs, out)
	s.cancel()
	return err
}

// TestInFlightSlotFailOpenLoggedOnlyServed: a request decided without its
// concurrency layers (slot store down) whose shaping wait then fails is
// not served, and not logged as served fail-open.
func TestInFlightSlotFailOpenLoggedOnlyServed(t *testing.T) {
	rule := core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}
	ms := core.MustMemoryStore(nil)
	logs, logOpt := newLogBuf()
	ctx, cancel := context.WithCancel(context.Background())
	e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.Global("q"), Rule: rule}, inFlightLayer(1)},
		ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithStore(&cancelStore{ms: ms, cancel: cancel}), logOpt)
	var out [1]core.Decision // another process took the bucket's unit: this request must wait
	if err := ms.Take(context.Background(), e.clk.Now(), []core.Request{{Policy: core.MustPolicy(rule), Key: "q", Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
		t.Fatalf("pre-charge: %v %+v", err, out[0])
	}
	if rec := e.do(t, getFrom("192.0.2.1").WithContext(ctx)); e.served.Load() != 0 {
		t.Fatalf("served: %d", rec.Code)
	}
	if n := logs.count("in-flight slot store errors are being served fail-open"); n != 0 {
		t.Fatalf("nothing served, yet logged:\n%s", logs)
	}
}

// TestConfigErrorLogDryRun: in dry-run, the one-time line of a
// configuration error met at request time says the request was served.
func TestConfigErrorLogDryRun(t *testing.T) {
	for _, dry := range []bool{false, true} {
		logs, logOpt := newLogBuf()
		opts := []ratelimit.Option{logOpt}
		if dry {
			opts = append(opts, ratelimit.WithDryRun())
		}
		l := mwLimiter(t, []ratelimit.Layer{inFlightLayer(1)}, opts...)
		l.Admit(httptest.NewRecorder(), getFrom("192.0.2.1")) // a context that never ends
		want := "requests are answered 500"
		if dry {
			want = "requests are served (dry-run); enforcing would answer them 500"
		}
		if logs.count(want) != 1 {
			t.Fatalf("dry-run %v: logs:\n%s", dry, logs)
		}
	}
}

// TestTooCostlyNeverPromisedRetry checks that a request whose cost exceeds
// a rate layer's capacity is answered 413 without Retry-After (it can
// never be admitted), not 429 with a Retry-After, when a concurrency
// layer's slot is busy or the shaping waiting room is full: neither is
// asked before the cost is checked, and nothing is charged.
func TestTooCostlyNeverPromisedRetry(t *testing.T) {
	t.Run("busy slot", func(t *testing.T) {
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 5, Window: time.Minute}},
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1},
		}, ratelimit.WithCost(costBig))
		hd := newHolder()
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hd.wait(r) }))
		end := hd.hold(h)
		rec := serve(h, mwReq("192.0.2.1:1", "Big", "1"))
		end()
		if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("Retry-After") != "" {
			t.Fatalf("cost 10 under a capacity of 5, the slot busy: %d, Retry-After %q; want 413 and none", rec.Code, rec.Header().Get("Retry-After"))
		}
		// The refusal charged nothing: four more of the rate layer's five
		// fit beside the held request, and the fifth does not.
		for i := range 5 {
			want := http.StatusOK
			if i == 4 {
				want = http.StatusTooManyRequests
			}
			if c := serve(h, mwReq("192.0.2.1:1")).Code; c != want {
				t.Fatalf("request %d after the refusal: %d, want %d", i+1, c, want)
			}
		}
	})
	t.Run("full waiting room", func(t *testing.T) {
		e := mwNew(t, []ratelimit.Layer{
			{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: time.Minute}},
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "small", Limit: 2, Window: time.Minute}, Cost: costBig},
		}, ratelimit.WithMaxWaiting(1))
		entered, release := holdWait(e.l)
		e.do(t, mwReq("192.0.2.1:1")) // served at once
		done := make(chan struct{})
		go func() { e.do(t, mwReq("192.0.2.2:1")); close(done) }() // waits, in the room's one place
		<-entered
		rec := e.do(t, mwReq("192.0.2.3:1", "Big", "1"))
		close(release)
		<-done
		if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("Retry-After") != "" {
			t.Fatalf("cost 10 under a capacity of 2, the room full: %d, Retry-After %q; want 413 and none", rec.Code, rec.Header().Get("Retry-After"))
		}
	})
}

// TestTooCostlyWithStoreDownNotServed checks that a request too costly for
// a rate layer, which takes no concurrency slot, is not served by the
// fail-open policy when the store fails: it can never be admitted, store
// or not, so it is answered 413, and it never runs beside the request
// holding the only slot.
func TestTooCostlyWithStoreDownNotServed(t *testing.T) {
	for _, problem := range []bool{false, true} {
		opts := []ratelimit.Option{ratelimit.WithCost(costBig), ratelimit.WithStore(&mwFailStore{}), ratelimit.WithLogger(nil)}
		if problem {
			opts = append(opts, ratelimit.WithProblemDetails())
		}
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 5, Window: time.Minute}},
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1},
		}, opts...)
		var running, most atomic.Int64
		hd := newHolder()
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			hd.wait(r)
		}))
		end := hd.hold(h)
		rec := serve(h, mwReq("192.0.2.1:1", "Big", "1"))
		end()
		if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("Retry-After") != "" || most.Load() > 1 {
			t.Fatalf("problem details %v: cost 10 under a capacity of 5, the store down and the slot busy: %d (Retry-After %q), %d handlers at once; want 413, none, 1",
				problem, rec.Code, rec.Header().Get("Retry-After"), most.Load())
		}
	}
}

// TestTooCostlyWithStoreDownReachesErrorHandler checks that the store's
// failure behind a too costly request's 413 reaches the error handler, as
// every store error does (in dry-run too, where it may stop the request).
func TestTooCostlyWithStoreDownReachesErrorHandler(t *testing.T) {
	for _, dry := range []bool{false, true} {
		var seen []error
		opts := []ratelimit.Option{
			ratelimit.WithCost(costBig), ratelimit.WithStore(&mwFailStore{}), ratelimit.WithLogger(nil),
			ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { seen = append(seen, err) }),
		}
		if dry {
			opts = append(opts, ratelimit.WithDryRun())
		}
		l := mwLimiter(t, []ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 5, Window: time.Minute}},
		}, opts...)
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		serve(h, mwReq("192.0.2.1:1"))
		rec := serve(h, mwReq("192.0.2.1:1", "Big", "1"))
		want := http.StatusRequestEntityTooLarge
		if dry {
			want = http.StatusOK
		}
		if len(seen) != 2 || !errors.Is(seen[1], ratelimit.ErrStoreFailure) || rec.Code != want {
			t.Errorf("dry-run %v: the error handler saw %v, the too costly request was answered %d; want two store failures and %d", dry, seen, rec.Code, want)
		}
	}
}

// TestTooCostlyWithStoreDownByHand checks that Admit's parts (Decide,
// WriteHeaders, Refuse) show the error handler the store failure behind a
// too costly request's 413, as Admit does.
func TestTooCostlyWithStoreDownByHand(t *testing.T) {
	var seen []error
	l := mwLimiter(t, []ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "rate", Limit: 5, Window: time.Minute}},
	}, ratelimit.WithCost(costBig), ratelimit.WithStore(&mwFailStore{}), ratelimit.WithLogger(nil),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) { seen = append(seen, err) }))
	rec := httptest.NewRecorder()
	r := mwReq("192.0.2.1:1", "Big", "1")
	res := l.Decide(r)
	l.WriteHeaders(rec.Header(), &res)
	if !res.Proceed {
		l.Refuse(rec, r, &res)
	}
	if rec.Code != http.StatusRequestEntityTooLarge || len(seen) != 1 || !errors.Is(seen[0], ratelimit.ErrStoreFailure) {
		t.Fatalf("Decide, WriteHeaders, Refuse: %d, the error handler saw %v; want 413 and the store failure", rec.Code, seen)
	}
}

// costBig charges 10 for a request with a Big header, 1 for another.
func costBig(r *http.Request) int64 {
	if r.Header.Get("Big") != "" {
		return 10
	}
	return 1
}

// holder holds one request in its handler: the handler calls wait, which
// holds a request with a Hold header until the end hold returned is called.
type holder struct{ entered, release chan struct{} }

func newHolder() *holder {
	return &holder{entered: make(chan struct{}), release: make(chan struct{})}
}

// wait holds r in its handler if it has a Hold header.
func (hd *holder) wait(r *http.Request) {
	if r.Header.Get("Hold") != "" {
		close(hd.entered)
		<-hd.release
	}
}

// hold serves a request with a Hold header through h in the background and
// returns once its handler holds it, with the function that lets it end and
// waits for it.
func (hd *holder) hold(h http.Handler) (end func()) {
	done := make(chan struct{})
	go func() { serve(h, mwReq("192.0.2.1:1", "Hold", "1")); close(done) }()
	<-hd.entered
	return func() { close(hd.release); <-done }
}

// TestErrorHandlerPanicGivesBackWaitingRoomSlot: an error handler that
// panics (http.ErrAbortHandler, say) for a request whose slot store failed
// open and that reserved a waiting-room slot for its shaping delay gives
// the slot back, so later shaped requests do not meet a full room for good.
func TestErrorHandlerPanicGivesBackWaitingRoomSlot(t *testing.T) {
	layers := []ratelimit.Layer{
		inFlightLayer(1),
		{Key: ratelimit.Global("q"), Rule: core.Rule{Name: "shape", Algorithm: core.LeakyBucket, Limit: 2, Window: time.Second, MaxDelay: 10 * time.Second}},
	}
	e := mwNew(t, layers, ratelimit.WithSlotStore(failingSlots{}), ratelimit.WithMaxWaiting(1),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Header.Get("Abort") != "" {
				panic(http.ErrAbortHandler) // net/http recovers it
			}
		}))
	ratelimit.SetWaitFunc(e.l, func(context.Context, time.Duration) error { return nil })
	e.do(t, getFrom("192.0.2.1")) // no delay: served
	aborted := getFrom("192.0.2.1")
	aborted.Header.Set("Abort", "1") // admitted with a delay, its error handler panics
	func() {
		defer func() { _ = recover() }()
		e.do(t, aborted)
	}()
	if w := ratelimit.Waiting(e.l); w != 0 {
		t.Errorf("%d waiting after the error handler panicked, want 0", w)
	}
	e.clk.Advance(time.Hour)
	for i := 0; i < 3; i++ {
		if rec := e.do(t, getFrom("192.0.2.1")); rec.Code != http.StatusOK {
			t.Errorf("request %d after the panic: %d (%s), want 200", i, rec.Code, rec.Body.String())
		}
	}
}
