package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

var trT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// trBase is a base RoundTripper that answers every request with the
// response its reply function builds, and records the requests it saw.
type trBase struct {
	mu    sync.Mutex
	hosts []string
	reply func(r *http.Request) *http.Response
}

func (b *trBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.hosts = append(b.hosts, r.URL.Host)
	b.mu.Unlock()
	if r.Body != nil {
		_ = r.Body.Close()
	}
	if b.reply != nil {
		return b.reply(r), nil
	}
	return trResp(http.StatusOK), nil
}

func (b *trBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.hosts)
}

func trResp(status int, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: http.NoBody}
}

// trEnv is a Transport on a fake clock whose waits advance the clock and
// are recorded.
type trEnv struct {
	clk   *core.FakeClock
	base  *trBase
	tr    *ratelimit.Transport
	mu    sync.Mutex
	waits []time.Duration
}

func trNew(t testing.TB, rule core.Rule, cfg *ratelimit.TransportConfig) *trEnv {
	t.Helper()
	e := &trEnv{clk: core.NewFakeClock(trT0), base: &trBase{}}
	lim, err := core.New(rule, core.WithClock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	var c ratelimit.TransportConfig
	if cfg != nil {
		c = *cfg
	}
	c.Base = e.base
	e.tr, err = ratelimit.NewTransport(lim, &c)
	if err != nil {
		t.Fatal(err)
	}
	ratelimit.SetTransportSleep(e.tr, func(ctx context.Context, d time.Duration) error {
		e.mu.Lock()
		e.waits = append(e.waits, d)
		e.mu.Unlock()
		e.clk.Advance(d)
		return nil
	})
	return e
}

func (e *trEnv) recorded() []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.waits)
}

func (e *trEnv) get(ctx context.Context, rawURL string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		panic(err)
	}
	return e.tr.RoundTrip(req)
}

// trackBody records whether it was closed.
type trackBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackBody) Close() error { b.closed.Store(true); return nil }

func TestTransportWaitsThenProceeds(t *testing.T) {
	e := trNew(t, core.PerMinute(2), nil) // a token every 30s, bursts of 2
	for i := range 4 {
		res, err := e.get(context.Background(), "https://api.example.com/v1")
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %v, %v", i, res, err)
		}
	}
	if got, want := e.recorded(), []time.Duration{30 * time.Second, 30 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if e.base.sent() != 4 {
		t.Errorf("%d requests sent, want 4", e.base.sent())
	}
	if got := e.clk.Now().Sub(trT0); got != time.Minute {
		t.Errorf("clock moved %v, want 1m", got)
	}
}

func TestTransportFailFast(t *testing.T) {
	e := trNew(t, core.PerMinute(2).Named("outbound"), &ratelimit.TransportConfig{FailFast: true})
	for range 2 {
		if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
			t.Fatal(err)
		}
	}
	body := &trackBody{Reader: strings.NewReader("payload")}
	req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/", body)
	client := &http.Client{Transport: e.tr}
	_, err := client.Do(req)
	if !errors.Is(err, ratelimit.ErrOutboundLimited) {
		t.Fatalf("error %v, want ErrOutboundLimited", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Errorf("error %T is not a *url.Error from the client", err)
	}
	var le *ratelimit.OutboundLimitError
	if !errors.As(err, &le) {
		t.Fatalf("error %v carries no OutboundLimitError", err)
	}
	if le.Key != "api.example.com" || le.Wait != 30*time.Second || le.Decision.Allowed ||
		le.Decision.RetryAfter != 30*time.Second || le.Decision.Policy.Rule().Name != "outbound" || !le.PausedUntil.IsZero() || le.Err != nil {
		t.Errorf("error details %+v", le)
	}
	if !body.closed.Load() {
		t.Error("the refused request's body was not closed")
	}
	if e.base.sent() != 2 || len(e.recorded()) != 0 {
		t.Errorf("sent %d, waited %v; want 2 sent and no wait", e.base.sent(), e.recorded())
	}
	if !strings.Contains(err.Error(), `ratelimit: outgoing request over its rate limit: key "api.example.com": rate limit "outbound", 30s to wait`) {
		t.Errorf("message %q", err)
	}
}

func TestTransportMaxWait(t *testing.T) {
	for _, tc := range []struct {
		maxWait time.Duration
		waited  bool
	}{{29 * time.Second, false}, {30 * time.Second, true}} {
		t.Run(tc.maxWait.String(), func(t *testing.T) {
			e := trNew(t, core.PerMinute(2), &ratelimit.TransportConfig{MaxWait: tc.maxWait})
			for range 2 {
				if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
					t.Fatal(err)
				}
			}
			_, err := e.get(context.Background(), "https://api.example.com/")
			if tc.waited {
				if err != nil || !slices.Equal(e.recorded(), []time.Duration{30 * time.Second}) {
					t.Errorf("error %v, waits %v; want a 30s wait and success", err, e.recorded())
				}
				return
			}
			if !errors.Is(err, ratelimit.ErrOutboundLimited) || len(e.recorded()) != 0 || e.base.sent() != 2 {
				t.Errorf("error %v, waits %v, sent %d; want an immediate refusal", err, e.recorded(), e.base.sent())
			}
		})
	}
}

func TestTransportContextEndsWait(t *testing.T) {
	clk := core.NewFakeClock(trT0)
	lim := core.Must(core.New(core.PerMinute(1), core.WithClock(clk)))
	base := &trBase{}
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan time.Duration, 1)
	ratelimit.SetTransportSleep(tr, func(ctx context.Context, d time.Duration) error {
		entered <- d
		<-ctx.Done()
		return ctx.Err()
	})
	client := &http.Client{Transport: tr}
	if _, err := client.Get("http://svc.internal/"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	body := &trackBody{Reader: strings.NewReader("x")}
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://svc.internal/", body)
		_, err := client.Do(req)
		done <- err
	}()
	if d := <-entered; d != time.Minute {
		t.Errorf("waiting %v, want 1m", d)
	}
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ratelimit.ErrOutboundLimited) {
		t.Errorf("error %v, want context.Canceled and ErrOutboundLimited", err)
	}
	if base.sent() != 1 || !body.closed.Load() {
		t.Errorf("sent %d (want 1), body closed %v", base.sent(), body.closed.Load())
	}

	// A deadline before the slot fails at once, without waiting.
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	req, _ := http.NewRequestWithContext(dctx, http.MethodGet, "http://svc.internal/", nil)
	_, err = client.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ratelimit.ErrOutboundLimited) || len(entered) != 0 {
		t.Errorf("error %v (waits started: %d), want an immediate DeadlineExceeded", err, len(entered))
	}

	// A context that has already ended charges nothing.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	req, _ = http.NewRequestWithContext(cctx, http.MethodGet, "http://other.internal/", nil)
	if _, err := client.Do(req); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if _, err := client.Get("http://other.internal/"); err != nil || base.sent() != 2 {
		t.Errorf("other host after a cancelled request: %v, sent %d", err, base.sent())
	}
}

// TestTransportLearns checks each way a server can ask for a pause: the
// response pauses its key for the time named, and the next request to that
// key waits exactly that long before it is sent.
func TestTransportLearns(t *testing.T) {
	epoch := func(d time.Duration) string { return fmt.Sprint(trT0.Add(d).Unix()) }
	for _, tc := range []struct {
		name   string
		status int
		kv     []string
		pause  time.Duration
	}{
		{"429 Retry-After seconds", 429, []string{"Retry-After", "7"}, 7 * time.Second},
		{"429 Retry-After date", 429, []string{"Retry-After", trT0.Add(20 * time.Second).Format(http.TimeFormat)}, 20 * time.Second},
		{"429 Retry-After date in the past", 429, []string{"Retry-After", trT0.Add(-time.Hour).Format(http.TimeFormat)}, 0},
		{"503 Retry-After", 503, []string{"Retry-After", "5"}, 5 * time.Second},
		{"503 without Retry-After", 503, nil, 0},
		{"200 Retry-After is not a pause", 200, []string{"Retry-After", "5"}, 0},
		{"RateLimit r=0", 200, []string{"RateLimit", `"default";r=0;t=9`}, 9 * time.Second},
		{"RateLimit token name, spaces", 200, []string{"RateLimit", `default; r=0; t=9`}, 9 * time.Second},
		{"RateLimit exhausted policy among others", 200, []string{"RateLimit", `"a";r=3;t=50, "b";r=0;t=4;pk=:aGVsbG8=:`}, 4 * time.Second},
		{"RateLimit two lines", 200, []string{"RateLimit", `"a";r=0;t=2`, "RateLimit", `"b";r=0;t=6`}, 6 * time.Second},
		{"RateLimit r>0", 200, []string{"RateLimit", `"default";r=1;t=9`}, 0},
		{"RateLimit r=0 without t", 200, []string{"RateLimit", `"default";r=0`}, 0},
		{"X-RateLimit epoch", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(12 * time.Second)}, 12 * time.Second},
		{"X-RateLimit epoch fraction", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(12*time.Second) + ".25"}, 12250 * time.Millisecond},
		{"X-RateLimit delta", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "6"}, 6 * time.Second},
		{"X-RateLimit delta fraction", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5.5"}, 5500 * time.Millisecond},
		{"X-RateLimit remaining 1", 200, []string{"X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "6"}, 0},
		{"X-RateLimit epoch in the past", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(-time.Minute)}, 0},
		{"draft-06 fields", 200, []string{"RateLimit-Remaining", "0", "RateLimit-Reset", "8"}, 8 * time.Second},
		{"latest hint wins", 200, []string{"RateLimit", `"a";r=0;t=3`, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "11"}, 11 * time.Second},
		{"Retry-After takes precedence", 429, []string{"Retry-After", "3", "RateLimit", `"a";r=0;t=30`}, 3 * time.Second},
		{"429 hints without Retry-After", 429, []string{"RateLimit", `"a";r=0;t=30`}, 30 * time.Second},
		{"429 without any hint", 429, nil, ratelimit.NoHintPause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := trNew(t, core.PerSecond(100), nil)
			e.base.reply = func(*http.Request) *http.Response { return trResp(tc.status, tc.kv...) }
			res, err := e.get(context.Background(), "https://api.example.com/")
			if err != nil || res.StatusCode != tc.status {
				t.Fatalf("first request: %v, %v", res, err)
			}
			if got := e.tr.PausedFor("api.example.com"); got != tc.pause {
				t.Errorf("paused for %v, want %v", got, tc.pause)
			}
			e.base.reply = nil
			if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
				t.Fatal(err)
			}
			var want []time.Duration
			if tc.pause > 0 {
				want = []time.Duration{tc.pause}
			}
			if got := e.recorded(); !slices.Equal(got, want) {
				t.Errorf("second request waited %v, want %v", got, want)
			}
			if e.base.sent() != 2 {
				t.Errorf("%d sent, want 2", e.base.sent())
			}
		})
	}
}

// TestTransportHostileHeaders feeds malformed, huge and hostile values: none
// panics, malformed fields are ignored, and no pause exceeds MaxPause.
func TestTransportHostileHeaders(t *testing.T) {
	const hour = ratelimit.DefaultMaxPause
	long := strings.Repeat("9", 5000)
	for _, tc := range []struct {
		name   string
		status int
		kv     []string
		pause  time.Duration
	}{
		{"huge Retry-After", 429, []string{"Retry-After", "99999999999999999999999999"}, hour},
		{"Retry-After just above the cap", 429, []string{"Retry-After", "3601"}, hour},
		{"very long Retry-After", 429, []string{"Retry-After", long}, ratelimit.NoHintPause},
		{"negative Retry-After", 429, []string{"Retry-After", "-5"}, ratelimit.NoHintPause},
		{"Retry-After with junk", 429, []string{"Retry-After", "5s"}, ratelimit.NoHintPause},
		{"Retry-After float", 503, []string{"Retry-After", "1.5"}, 0},
		{"two Retry-After", 503, []string{"Retry-After", "5", "Retry-After", "7"}, 0},
		{"Retry-After year 9999", 503, []string{"Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT"}, hour},
		{"Retry-After control bytes", 503, []string{"Retry-After", "\x00\x01\xff"}, 0},
		{"RateLimit huge t", 200, []string{"RateLimit", `"a";r=0;t=999999999999999`}, hour},
		{"RateLimit t of 16 digits", 200, []string{"RateLimit", `"a";r=0;t=9999999999999999`}, 0},
		{"RateLimit negative t", 200, []string{"RateLimit", `"a";r=0;t=-5`}, 0},
		{"RateLimit decimal t", 200, []string{"RateLimit", `"a";r=0;t=5.5`}, 0},
		{"RateLimit empty t", 200, []string{"RateLimit", `"a";r=0;t=`}, 0},
		{"RateLimit exponent", 200, []string{"RateLimit", `"a";r=0;t=1e9`}, 0},
		{"RateLimit unterminated string", 200, []string{"RateLimit", `"a;r=0;t=5`}, 0},
		{"RateLimit bad escape", 200, []string{"RateLimit", `"a\x";r=0;t=5`}, 0},
		{"RateLimit trailing comma", 200, []string{"RateLimit", `"a";r=0;t=5,`}, 0},
		{"RateLimit draft-07 dictionary", 200, []string{"RateLimit", `limit=100, remaining=0, reset=5`}, 0},
		{"RateLimit uppercase key", 200, []string{"RateLimit", `"a";R=0;T=5`}, 0},
		{"RateLimit one bad item spoils the field", 200, []string{"RateLimit", `"a";r=0;t=5, "b";r=0;t=x y`}, 0},
		{"RateLimit empty", 200, []string{"RateLimit", ``}, 0},
		{"RateLimit with a Date parameter", 200, []string{"RateLimit", `"a";r=0;t=30;at=@1767225600`}, 30 * time.Second},
		{"RateLimit with a Display String parameter", 200, []string{"RateLimit", `"a";r=0;t=30;d=%"caf%c3%a9"`}, 30 * time.Second},
		{"RateLimit Date as t", 200, []string{"RateLimit", `"a";r=0;t=@30`}, 0},
		{"RateLimit decimal Date", 200, []string{"RateLimit", `"a";r=0;t=30;at=@1.5`}, 0},
		{"RateLimit empty Date", 200, []string{"RateLimit", `"a";r=0;t=30;at=@`}, 0},
		{"RateLimit Display String not UTF-8", 200, []string{"RateLimit", `"a";r=0;t=30;d=%"%ff"`}, 0},
		{"RateLimit Display String upper-case hex", 200, []string{"RateLimit", `"a";r=0;t=30;d=%"caf%C3%A9"`}, 0},
		{"RateLimit Display String short escape", 200, []string{"RateLimit", `"a";r=0;t=30;d=%"%c"`}, 0},
		{"RateLimit unterminated Display String", 200, []string{"RateLimit", `"a";r=0;t=30;d=%"abc`}, 0},
		{"RateLimit bare percent", 200, []string{"RateLimit", `"a";r=0;t=30;d=%abc`}, 0},
		{"RateLimit control bytes", 200, []string{"RateLimit", "\"a\x00\";r=0;t=5"}, 0},
		{"RateLimit very long", 200, []string{"RateLimit", `"a";r=0;t=5, ` + strings.Repeat(`"b";r=1, `, 1000) + `"c";r=2`}, 0},
		{"X-RateLimit-Reset huge", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", long[:40]}, hour},
		{"X-RateLimit-Reset far epoch", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "99999999999"}, hour},
		{"X-RateLimit-Reset exponent", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1e10"}, 0},
		{"X-RateLimit-Reset dot", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5."}, 0},
		{"X-RateLimit-Reset long fraction", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5.1234567891"}, 0},
		{"X-RateLimit-Reset negative", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "-5"}, 0},
		{"X-RateLimit-Remaining negative", 200, []string{"X-RateLimit-Remaining", "-0", "X-RateLimit-Reset", "5"}, 0},
		{"X-RateLimit-Remaining huge", 200, []string{"X-RateLimit-Remaining", long, "X-RateLimit-Reset", "5"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for i := 0; i+1 < len(tc.kv); i += 2 {
				h.Add(tc.kv[i], tc.kv[i+1])
			}
			if got := ratelimit.ServerPause(tc.status, h, trT0, hour); got != tc.pause {
				t.Errorf("pause %v, want %v", got, tc.pause)
			}
		})
	}

	// MaxPause caps every pause, and a pause never outlives it.
	e := trNew(t, core.PerSecond(100), &ratelimit.TransportConfig{MaxPause: 2 * time.Minute})
	e.base.reply = func(*http.Request) *http.Response { return trResp(429, "Retry-After", "86400") }
	if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
		t.Fatal(err)
	}
	if got := e.tr.PausedFor("api.example.com"); got != 2*time.Minute {
		t.Errorf("paused for %v, want the 2m cap", got)
	}
	e.clk.Advance(2 * time.Minute)
	if got := e.tr.PausedFor("api.example.com"); got != 0 {
		t.Errorf("still paused for %v after the cap", got)
	}
}

// FuzzServerPause: no response header makes the parser panic or return a
// pause outside [0, MaxPause].
func FuzzServerPause(f *testing.F) {
	f.Add(429, "120", `"a";r=0;t=5`, "0", "1767225612")
	f.Add(200, "Thu, 01 Jan 2026 00:00:10 GMT", `"a";r=0;t=5;pk=:YWJj:, b;r=1;t=?1`, "0", "5.5")
	f.Add(503, "-1", `"\"";r=0;t=1.5`, "00", "99999999999999999999")
	f.Fuzz(func(t *testing.T, status int, retry, rl, rem, reset string) {
		h := http.Header{"Retry-After": {retry}, "Ratelimit": {rl}, "X-Ratelimit-Remaining": {rem}, "X-Ratelimit-Reset": {reset}}
		const maxPause = 10 * time.Minute
		if d := ratelimit.ServerPause(status, h, trT0, maxPause); d < 0 || d > maxPause {
			t.Fatalf("pause %v outside [0, %v]", d, maxPause)
		}
	})
}

func TestTransportPerHostKeys(t *testing.T) {
	e := trNew(t, core.PerMinute(1), &ratelimit.TransportConfig{FailFast: true})
	e.base.reply = func(r *http.Request) *http.Response {
		if r.URL.Host == "a.example" {
			return trResp(429, "Retry-After", "600")
		}
		return trResp(200)
	}
	for _, tc := range []struct {
		url     string
		limited bool
	}{
		{"https://a.example/", false},      // sent, answered 429: a.example paused
		{"https://b.example/", false},      // its own quota, and not paused
		{"https://a.example/x", true},      // paused by the server
		{"https://B.EXAMPLE:443/y", true},  // the same host as b.example: its quota is spent
		{"http://b.example/", true},        // the same host on another scheme
		{"https://b.example:8443/", false}, // another port is another key
		{"http://[2001:db8::1]/", false},   // IPv6 hosts keep their brackets
		{"http://[2001:DB8::1]:80/", true}, // ...and are lower-cased
		{"https://c.example/", false},      // a third host, unaffected by both
		{"https://xn--bcher-kva.example/", false},
	} {
		_, err := e.get(context.Background(), tc.url)
		if got := errors.Is(err, ratelimit.ErrOutboundLimited); got != tc.limited {
			t.Errorf("%s: limited %v (%v), want %v", tc.url, got, err, tc.limited)
		}
	}
	var le *ratelimit.OutboundLimitError
	_, err := e.get(context.Background(), "https://a.example/")
	if !errors.As(err, &le) || !le.PausedUntil.Equal(trT0.Add(10*time.Minute)) || le.Wait != 10*time.Minute || le.Decision.Policy != nil {
		t.Errorf("paused key's error: %+v", le)
	}
	if got, want := e.base.hosts, []string{"a.example", "b.example", "b.example:8443", "[2001:db8::1]", "c.example", "xn--bcher-kva.example"}; !slices.Equal(got, want) {
		t.Errorf("sent to %v, want %v", got, want)
	}
	if got, err := ratelimit.TargetHost(&http.Request{URL: &url.URL{Path: "/relative"}}); err == nil {
		t.Errorf("TargetHost of a request without a host: %q, want an error", got)
	}
	// One host, one key, however it is spelt: a fully qualified name's
	// trailing dot, the case, the default port, an IPv6 address's zeros.
	for want, urls := range map[string][]string{
		"api.example.com":      {"https://api.example.com/", "https://api.example.com./", "https://API.EXAMPLE.COM.:443/"},
		"[2001:db8::1]":        {"http://[2001:db8::1]/", "http://[2001:DB8:0:0:0:0:0:1]:80/", "http://[2001:0db8::0001]/"},
		"192.0.2.1:8080":       {"http://192.0.2.1:8080/", "http://[::ffff:192.0.2.1]:8080/"},
		"192.0.2.1":            {"http://192.0.2.1/", "http://[::ffff:c000:201]/"},
		"api.example.com:80":   {"https://api.example.com.:80/", "https://api.example.com:0080/"},
		"api.example.com:8443": {"https://api.example.com:8443/", "https://api.example.com:008443/"},
		"api.example.com#443":  {"https://api.example.com:0443/", "https://api.example.com:00443/"},
	} {
		want, _, _ = strings.Cut(want, "#") // "#": the default port, left out
		for _, u := range urls {
			r, err := http.NewRequest("GET", u, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := ratelimit.TargetHost(r); err != nil || got != want {
				t.Errorf("TargetHost(%s) = %q, %v; want %q", u, got, err, want)
			}
		}
	}
	// Hosts net/http would dial by an IDNA mapping (fullwidth letters,
	// Unicode names), and ports that are not port numbers, are errors:
	// never a key of their own.
	for _, u := range []string{"https://ａｐｉ.example.com/", "https://bücher.example/", "https://api.example.com:0/", "https://api.example.com:65536/", "https://api.example.com:99999999999999999999/"} {
		r, err := http.NewRequest("GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ratelimit.TargetHost(r); err == nil {
			t.Errorf("TargetHost(%s) = %q, want an error", u, got)
		}
	}
}

// TestTransportAbsentKeyLogged: a Key that finds no key on every one of the
// first AbsentKeyLogAfter requests sends them all unlimited, and the
// Transport's Logger hears of it once; one that finds a key among them is
// not reported.
func TestTransportAbsentKeyLogged(t *testing.T) {
	for _, found := range []bool{false, true} {
		var logs bytes.Buffer
		n := 0
		key := func(r *http.Request) (string, error) {
			if n++; found && n == ratelimit.AbsentKeyLogAfter/2 {
				return "k", nil
			}
			return "", ratelimit.ErrNoKey
		}
		e := trNew(t, core.PerMinute(1), &ratelimit.TransportConfig{Key: key, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		for range 2 * ratelimit.AbsentKeyLogAfter {
			if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Count(logs.String(), "found no key on every one of its first requests"); got != map[bool]int{false: 1, true: 0}[found] {
			t.Errorf("a key found on one of the first requests %v: logged %d times: %s", found, got, logs.String())
		}
	}
}

func TestTransportKeyFunc(t *testing.T) {
	errBoom := errors.New("boom")
	key := func(r *http.Request) (string, error) {
		switch r.URL.Path {
		case "/free":
			return "", fmt.Errorf("health checks: %w", ratelimit.ErrNoKey)
		case "/broken":
			return "", errBoom
		case "/empty":
			return "", nil
		}
		return "tenant-" + r.URL.Query().Get("t"), nil
	}
	e := trNew(t, core.PerMinute(1), &ratelimit.TransportConfig{FailFast: true, Key: key})
	for _, tc := range []struct {
		url  string
		want error
	}{
		{"https://x.example/?t=1", nil},
		{"https://y.example/?t=1", ratelimit.ErrOutboundLimited}, // same key, another host
		{"https://x.example/?t=2", nil},
		{"https://x.example/free", nil},
		{"https://x.example/free", nil}, // never limited
		{"https://x.example/broken", errBoom},
		{"https://x.example/empty", ratelimit.ErrEmptyKey},
	} {
		body := &trackBody{Reader: strings.NewReader("b")}
		req, _ := http.NewRequest(http.MethodPost, tc.url, body)
		_, err := e.tr.RoundTrip(req)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: error %v, want %v", tc.url, err, tc.want)
		}
		if !body.closed.Load() {
			t.Errorf("%s: body not closed", tc.url)
		}
	}
	if e.base.sent() != 4 {
		t.Errorf("%d sent, want 4", e.base.sent())
	}
}

// TestTransportConcurrentFailFast: 64 callers at once through one Transport
// with a quota of 10 send exactly 10 requests.
func TestTransportConcurrentFailFast(t *testing.T) {
	e := trNew(t, core.PerMinute(10), &ratelimit.TransportConfig{FailFast: true})
	var wg sync.WaitGroup
	var limited atomic.Int64
	start := make(chan struct{})
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.get(context.Background(), "https://api.example.com/")
			if errors.Is(err, ratelimit.ErrOutboundLimited) {
				limited.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if e.base.sent() != 10 || limited.Load() != 54 {
		t.Errorf("sent %d and limited %d, want exactly 10 and 54", e.base.sent(), limited.Load())
	}
}

// trTicker runs a fake clock for waiting goroutines: it advances the clock
// to the earliest wake-up only when every active caller is asleep, so the
// clock never moves between a caller's admission and its request reaching
// the base RoundTripper.
type trTicker struct {
	clk     *core.FakeClock
	mu      sync.Mutex
	cond    *sync.Cond
	active  int
	waiters []trWaiter
}

type trWaiter struct {
	wake time.Time
	ch   chan struct{}
}

func (k *trTicker) sleep(ctx context.Context, d time.Duration) error {
	ch := make(chan struct{})
	k.mu.Lock()
	k.waiters = append(k.waiters, trWaiter{k.clk.Now().Add(d), ch})
	k.cond.Broadcast()
	k.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *trTicker) done() {
	k.mu.Lock()
	k.active--
	k.cond.Broadcast()
	k.mu.Unlock()
}

func (k *trTicker) run() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		for k.active > 0 && len(k.waiters) < k.active {
			k.cond.Wait()
		}
		if k.active == 0 {
			return
		}
		next := k.waiters[0].wake
		for _, w := range k.waiters {
			if w.wake.Before(next) {
				next = w.wake
			}
		}
		if next.After(k.clk.Now()) {
			k.clk.Set(next)
		}
		k.waiters = slices.DeleteFunc(k.waiters, func(w trWaiter) bool {
			if w.wake.After(next) {
				return false
			}
			close(w.ch)
			return true
		})
	}
}

// TestTransportConcurrentWaiting: 64 callers wait their turn through one
// Transport with a token bucket of 8 refilled at 1 per second. Every request
// is sent, and the arrivals follow the rule exactly: 8 at once, then one
// per second, never one more.
func TestTransportConcurrentWaiting(t *testing.T) {
	clk := core.NewFakeClock(trT0)
	lim := core.Must(core.New(core.Rule{Limit: 8, Window: 8 * time.Second}, core.WithClock(clk)))
	var mu sync.Mutex
	perSecond := map[int64]int{}
	base := &trBase{reply: func(*http.Request) *http.Response {
		mu.Lock()
		perSecond[int64(clk.Now().Sub(trT0)/time.Second)]++
		mu.Unlock()
		return trResp(200)
	}}
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	k := &trTicker{clk: clk, active: 64}
	k.cond = sync.NewCond(&k.mu)
	ratelimit.SetTransportSleep(tr, k.sleep)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer k.done()
			req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
			if _, err := tr.RoundTrip(req); err != nil {
				t.Error(err)
			}
		}()
	}
	k.run()
	wg.Wait()
	if base.sent() != 64 {
		t.Fatalf("%d sent, want 64", base.sent())
	}
	want := map[int64]int{0: 8}
	for s := int64(1); s <= 56; s++ {
		want[s] = 1
	}
	if len(perSecond) != len(want) {
		t.Errorf("arrivals in %d distinct seconds, want %d: %v", len(perSecond), len(want), perSecond)
	}
	for s, n := range want {
		if perSecond[s] != n {
			t.Errorf("second %d: %d arrivals, want %d", s, perSecond[s], n)
		}
	}
}

func TestTransportPauseMemoryBounded(t *testing.T) {
	e := trNew(t, core.PerSecond(1), &ratelimit.TransportConfig{PauseCapacity: 100})
	e.base.reply = func(*http.Request) *http.Response { return trResp(429, "Retry-After", "60") }
	for i := range 1000 {
		if _, err := e.get(context.Background(), fmt.Sprintf("https://h%d.example/", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := ratelimit.TransportPauses(e.tr); n != 100 {
		t.Errorf("%d pauses remembered, want the capacity, 100", n)
	}
	if e.tr.PausedFor("h999.example") != time.Minute || e.tr.PausedFor("h0.example") != 0 {
		t.Error("the most recent pause should be kept and the oldest forgotten")
	}
}

func TestTransportStoreFailure(t *testing.T) {
	lim := core.Must(core.New(core.PerSecond(1), core.WithStore(trFailStore{})))
	base := &trBase{}
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, ratelimit.ErrStoreFailure) || !errors.Is(err, errTrBackend) {
		t.Errorf("error %v, want ErrStoreFailure wrapping the backend's error", err)
	}
	if base.sent() != 0 {
		t.Error("a request was sent without a decision")
	}
	// A policy the store cannot decide, picked unlisted by a Resolver: a
	// configuration error, not a store failure; nothing sent either.
	pro := core.MustPolicy(core.PerMinute(13).Named("pro"))
	res := core.ResolverFunc(func(context.Context, string) (*core.Policy, error) { return pro, nil })
	lim = core.Must(core.New(core.PerMinute(5).Named("api"), core.WithStore(pickyStore{core.MustMemoryStore(nil)}), core.WithResolver(res)))
	if tr, err = ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.RoundTrip(req); !errors.Is(err, ratelimit.ErrConfig) || !errors.Is(err, core.ErrUnsupportedPolicy) || errors.Is(err, ratelimit.ErrStoreFailure) {
		t.Errorf("error %v, want ErrConfig wrapping core.ErrUnsupportedPolicy", err)
	}
	if base.sent() != 0 {
		t.Error("a request was sent without a decision")
	}
}

var errTrBackend = errors.New("backend down")

type trFailStore struct{}

func (trFailStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return errTrBackend
}

func TestTransportDryRun(t *testing.T) {
	clk := core.NewFakeClock(trT0)
	obs := &trCountObserver{}
	lim := core.Must(core.New(core.PerMinute(1), core.WithClock(clk), core.WithDryRun(), core.WithObserver(obs)))
	base := &trBase{reply: func(*http.Request) *http.Response { return trResp(429, "Retry-After", "60") }}
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base, FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if base.sent() != 3 || obs.refused.Load() != 2 {
		t.Errorf("sent %d, refusals observed %d; want 3 and 2", base.sent(), obs.refused.Load())
	}
}

type trCountObserver struct {
	core.NopObserver
	refused atomic.Int64
}

func (o *trCountObserver) ObserveDecision(e core.DecisionEvent) {
	if !e.Decision.Allowed {
		o.refused.Add(1)
	}
}

// trSleepClock is a fake clock with a Sleep method: the Transport waits by
// calling it.
type trSleepClock struct {
	*core.FakeClock
	slept atomic.Int64
}

func (c *trSleepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.slept.Add(int64(d))
	c.Advance(d)
	return nil
}

func TestTransportClockSleep(t *testing.T) {
	clk := &trSleepClock{FakeClock: core.NewFakeClock(trT0)}
	lim := core.Must(core.New(core.PerMinute(1), core.WithClock(clk)))
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: &trBase{}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if got := time.Duration(clk.slept.Load()); got != time.Minute {
		t.Errorf("slept %v on the clock, want 1m", got)
	}
}

func TestNewTransportValidation(t *testing.T) {
	lim := core.Must(core.New(core.PerSecond(1)))
	takeOnly := core.Must(core.NewWithPolicy(nil))
	for _, tc := range []struct {
		name string
		lim  *core.Limiter
		cfg  *ratelimit.TransportConfig
		ok   bool
	}{
		{"defaults", lim, nil, true},
		{"nil limiter", nil, nil, false},
		{"limiter without policy", takeOnly, nil, false},
		{"negative MaxWait", lim, &ratelimit.TransportConfig{MaxWait: -1}, false},
		{"FailFast and MaxWait", lim, &ratelimit.TransportConfig{FailFast: true, MaxWait: time.Second}, false},
		{"negative MaxPause", lim, &ratelimit.TransportConfig{MaxPause: -time.Second}, false},
		{"negative PauseCapacity", lim, &ratelimit.TransportConfig{PauseCapacity: -1}, false},
		{"everything set", lim, &ratelimit.TransportConfig{Base: http.DefaultTransport, Key: ratelimit.TargetHost, MaxWait: time.Minute, MaxPause: time.Minute, PauseCapacity: 5}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ratelimit.NewTransport(tc.lim, tc.cfg)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ratelimit.ErrInvalidTransport)) || (tr == nil) == tc.ok {
				t.Errorf("NewTransport: %v, %v", tr, err)
			}
		})
	}
}

// BenchmarkTransport measures what the Transport adds to a request: key,
// pause lookup, decision and header reading, on a base that answers at once.
func BenchmarkTransport(b *testing.B) {
	lim := core.Must(core.New(core.Rule{Limit: core.MaxLimit, Window: time.Second}))
	resp := trResp(200, "RateLimit", `"default";r=99;t=1`, "X-RateLimit-Remaining", "99", "X-RateLimit-Reset", "1")
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: trFunc(func(*http.Request) (*http.Response, error) { return resp, nil })})
	if err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/v1/items", nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tr.RoundTrip(req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

type trFunc func(*http.Request) (*http.Response, error)

func (f trFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestTransportRealTimer runs the default wait, a real timer, for a few
// milliseconds: the request waits, then goes; a cancelled context ends the
// wait.
func TestTransportRealTimer(t *testing.T) {
	lim := core.Must(core.New(core.Rule{Limit: 1, Window: 20 * time.Millisecond}))
	base := &trBase{}
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 15*time.Millisecond {
		t.Errorf("two requests in %v; the second should have waited about 20ms", took)
	}

	// A wait of an hour, ended by its context after a few milliseconds.
	hourly, err := ratelimit.NewTransport(core.Must(core.New(core.PerHour(1))), &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		if i == 1 {
			time.AfterFunc(5*time.Millisecond, cancel)
		}
		start = time.Now()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/", nil)
		_, err = hourly.RoundTrip(req)
	}
	if !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second || base.sent() != 3 {
		t.Errorf("hourly second request: %v after %v, %d sent; want context.Canceled at once and 3 sent", err, time.Since(start), base.sent())
	}
}

// A shaping LeakyBucket admits a request on condition that it waits
// Decision.Delay: the Transport holds each request for it, and a request
// that may not wait is not sent and keeps its charge (a refund would give
// back a later request's slot).
func TestTransportShapingDelay(t *testing.T) {
	rule := core.Rule{Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}
	e := trNew(t, rule, nil)
	for i := range 5 {
		if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if got := e.clk.Now().Sub(trT0); got != 4*time.Second {
		t.Errorf("5 requests under a 1/s shaping rule sent within %v (waits %v), want 4s", got, e.recorded())
	}
	if n := e.base.sent(); n != 5 {
		t.Errorf("sent %d, want 5", n)
	}

	ff := trNew(t, rule, &ratelimit.TransportConfig{FailFast: true})
	if _, err := ff.get(context.Background(), "https://api.example.com/"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_, err := ff.get(context.Background(), "https://api.example.com/")
		var le *ratelimit.OutboundLimitError
		if want := time.Duration(i+1) * time.Second; !errors.As(err, &le) || le.Wait != want || !le.Decision.Allowed {
			t.Fatalf("FailFast, a request admitted with a delay: %v, want an OutboundLimitError for %v of delay (each attempt keeps its slot)", err, want)
		}
	}
	if n := ff.base.sent(); n != 1 {
		t.Errorf("FailFast sent %d, want 1", n)
	}
	// The three that were not sent keep their slots: three seconds on, a
	// request is still delayed (and books a slot); five seconds on, it goes
	// at once.
	ff.clk.Advance(3 * time.Second)
	if _, err := ff.get(context.Background(), "https://api.example.com/"); err == nil {
		t.Error("three seconds on, with three slots booked after the one sent: sent, want a delay")
	}
	ff.clk.Advance(2 * time.Second)
	if _, err := ff.get(context.Background(), "https://api.example.com/"); err != nil {
		t.Errorf("five seconds on: %v, want it sent at once", err)
	}
}

// TestTransportShapingWaitsPauseBegunDuringDelay: a request admitted by a
// shaping rule with a delay, during which a 429 to an earlier request of
// the key pauses it, is sent when the pause ends, not when its delay does;
// one that may not wait that long fails, naming the pause.
func TestTransportShapingWaitsPauseBegunDuringDelay(t *testing.T) {
	rule := core.Rule{Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}
	for _, maxWait := range []time.Duration{0, 30 * time.Second} {
		e := trNew(t, rule, &ratelimit.TransportConfig{MaxWait: maxWait})
		release, atServer, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var sentAt []time.Duration
		e.base.reply = func(r *http.Request) *http.Response {
			mu.Lock()
			sentAt = append(sentAt, e.clk.Now().Sub(trT0))
			first := len(sentAt) == 1
			mu.Unlock()
			if first {
				close(atServer)
				<-release // answered late: a 429 asking for a minute's pause
				return trResp(http.StatusTooManyRequests, "Retry-After", "60")
			}
			return trResp(http.StatusOK)
		}
		delays := 0
		ratelimit.SetTransportSleep(e.tr, func(ctx context.Context, d time.Duration) error {
			e.clk.Advance(d)
			if delays++; delays == 1 { // b's shaping delay: a's 429 arrives meanwhile
				close(release)
				<-aDone
			}
			return nil
		})
		go func() {
			defer close(aDone)
			if _, err := e.get(context.Background(), "https://api.example.com/a"); err != nil {
				t.Error(err)
			}
		}()
		<-atServer
		_, err := e.get(context.Background(), "https://api.example.com/b")
		mu.Lock()
		if maxWait == 0 {
			if err != nil || len(sentAt) != 2 || sentAt[1] != 61*time.Second {
				t.Errorf("b: %v, sent at %v; want it sent at 61s (its 1s delay, then the pause the 429 at 1s asked for)", err, sentAt)
			}
		} else {
			var le *ratelimit.OutboundLimitError
			if !errors.As(err, &le) || le.PausedUntil.IsZero() || len(sentAt) != 1 {
				t.Errorf("MaxWait %v: b: %v, sent at %v; want an OutboundLimitError naming the pause, nothing sent", maxWait, err, sentAt)
			}
		}
		mu.Unlock()
	}
}

// A MaxPause of centuries (math.MaxInt64: no cap) keeps the server's pause
// instead of wrapping its end into the past.
func TestTransportHugeMaxPause(t *testing.T) {
	e := trNew(t, core.PerSecond(100), &ratelimit.TransportConfig{MaxPause: math.MaxInt64})
	e.base.reply = func(*http.Request) *http.Response { return trResp(429, "Retry-After", "99999999999") }
	if _, err := e.get(context.Background(), "https://api.example.com/"); err != nil {
		t.Fatal(err)
	}
	if got := e.tr.PausedFor("api.example.com"); got < 200*365*24*time.Hour {
		t.Errorf("paused for %v after Retry-After: 99999999999 with no cap, want centuries", got)
	}
}

// delay-seconds is 1*DIGIT: leading zeros count for nothing, however many.
func TestTransportZeroPaddedSeconds(t *testing.T) {
	h := http.Header{"Retry-After": {"0000000000000005"}}
	if got := ratelimit.ServerPause(429, h, trT0, time.Hour); got != 5*time.Second {
		t.Errorf("Retry-After: 0000000000000005: pause %v, want 5s", got)
	}
	h = http.Header{"X-Ratelimit-Remaining": {"0000000000000000"}, "X-Ratelimit-Reset": {"7"}}
	if got := ratelimit.ServerPause(200, h, trT0, time.Hour); got != 7*time.Second {
		t.Errorf("X-RateLimit-Remaining: 0000000000000000: pause %v, want 7s", got)
	}
	h = http.Header{"Retry-After": {"0001000000000000000"}}
	if got := ratelimit.ServerPause(429, h, trT0, time.Hour); got != time.Hour {
		t.Errorf("Retry-After: 0001000000000000000: pause %v, want the cap, 1h", got)
	}
}

// A clock before 1970 (a zero FakeClock is year 1) pauses as any other:
// the pause's end is not taken for an overflow, and a pause that has ended
// lets the request go.
func TestTransportPauseBefore1970(t *testing.T) {
	for _, start := range []time.Time{time.Unix(-10, 0), {}} {
		clk := core.NewFakeClock(start)
		lim := core.Must(core.New(core.PerSecond(100), core.WithClock(clk)))
		calls := 0
		tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{
			FailFast: true,
			Base: trFunc(func(*http.Request) (*http.Response, error) {
				calls++
				return trResp(429, "Retry-After", "1"), nil
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if got := tr.PausedFor("api.example.com"); got != time.Second {
			t.Errorf("clock at %v: paused for %v after Retry-After: 1, want 1s", start, got)
		}
		clk.Advance(2 * time.Second)
		req, _ = http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := tr.RoundTrip(req); err != nil || calls != 2 {
			t.Errorf("clock at %v: 2s after a 1s pause: %v (sent %d), want the request sent", start, err, calls)
		}
	}
}

type trGiveUpMark struct{}

// TestTransportShapingGiveUpKeepsCharge: a shaped request whose context
// ends while it waits keeps its charge, so that a request scheduled behind
// it meanwhile keeps its slot to itself: no two requests are sent less
// than a second apart under a 1-per-second shaping rule.
func TestTransportShapingGiveUpKeepsCharge(t *testing.T) {
	clk := core.NewFakeClock(trT0)
	lim := core.Must(core.New(core.Rule{Name: "partner", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}, core.WithClock(clk)))
	var sends []time.Duration // send time of each request sent, from trT0
	base := trFunc(func(r *http.Request) (*http.Response, error) { return trResp(200), nil })
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/", nil)
		_, err := tr.RoundTrip(req)
		return err
	}
	var last time.Duration
	ratelimit.SetTransportSleep(tr, func(ctx context.Context, d time.Duration) error {
		if ctx.Value(trGiveUpMark{}) != nil {
			last = 0
			// B: while it waits its delay, C is scheduled behind it;
			// then B's caller gives up.
			if err := get(context.Background()); err != nil {
				t.Errorf("C: %v", err)
			}
			sends = append(sends, clk.Now().Sub(trT0)+last) // C's send time
			return context.Canceled
		}
		last = d
		return nil // the clock stays: the send is at now + d
	})
	// A: sent at once.
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	sends = append(sends, 0)
	// B: admitted with a 1s delay, gives up during it (after C was scheduled at 2s).
	if err := get(context.WithValue(context.Background(), trGiveUpMark{}, true)); err == nil {
		t.Fatal("B was sent")
	}
	// D: scheduled now.
	var dDelay time.Duration
	ratelimit.SetTransportSleep(tr, func(ctx context.Context, d time.Duration) error { dDelay = d; return nil })
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	sends = append(sends, clk.Now().Sub(trT0)+dDelay)
	t.Logf("sends %v", sends)
	slices.Sort(sends)
	for i := 1; i < len(sends); i++ {
		if sends[i]-sends[i-1] < time.Second {
			t.Fatalf("send times %v under a 1/s shaping rule: two requests %v apart", sends, sends[i]-sends[i-1])
		}
	}
}

// trHookStore wraps a MemoryStore and runs after, once, right after a Take
// returns: what another goroutine (or another process on a shared Redis
// store) does between this Take and what the caller does next.
type trHookStore struct {
	*core.MemoryStore
	after func()
}

func (s *trHookStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	err := s.MemoryStore.Take(ctx, now, reqs, out)
	if f := s.after; f != nil {
		s.after = nil
		f()
	}
	return err
}

// TestTransportShapingNoWaitKeepsCharge: B is admitted with a 1s delay
// its deadline (0.5s) forbids; between B's charge and its failure, C
// (another goroutine, or another process on a shared store) is booked
// behind B at +2s. B keeps its charge, so D is booked at +3s: no two
// requests are sent less than a second apart under a 1-per-second
// shaping rule.
func TestTransportShapingNoWaitKeepsCharge(t *testing.T) {
	clk := core.NewFakeClock(trT0)
	mem, err := core.NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &trHookStore{MemoryStore: mem}
	lim := core.Must(core.New(core.Rule{Name: "partner", Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: 10 * time.Second}, core.WithClock(clk), core.WithStore(st)))
	base := trFunc(func(r *http.Request) (*http.Response, error) { return trResp(200), nil })
	tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	var delay time.Duration
	ratelimit.SetTransportSleep(tr, func(ctx context.Context, d time.Duration) error { delay = d; return nil })
	get := func(ctx context.Context) (time.Duration, error) {
		delay = 0
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/", nil)
		_, err := tr.RoundTrip(req)
		return clk.Now().Sub(trT0) + delay, err
	}
	var sends []time.Duration
	// A: sent at once.
	if at, err := get(context.Background()); err != nil {
		t.Fatal(err)
	} else {
		sends = append(sends, at)
	}
	// B: a 0.5s deadline; admitted with a 1s delay. Right after B's charge,
	// C is booked (behind B).
	st.after = func() {
		at, err := get(context.Background())
		if err != nil {
			t.Errorf("C: %v", err)
			return
		}
		sends = append(sends, at)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := get(ctx); err == nil {
		t.Fatal("B was sent")
	} else {
		t.Logf("B: %v", err)
	}
	// D: booked now.
	if at, err := get(context.Background()); err != nil {
		t.Fatal(err)
	} else {
		sends = append(sends, at)
	}
	t.Logf("sends %v", sends)
	slices.Sort(sends)
	for i := 1; i < len(sends); i++ {
		if sends[i]-sends[i-1] < time.Second {
			t.Fatalf("send times %v under a 1/s shaping rule: two requests %v apart", sends, sends[i]-sends[i-1])
		}
	}
}

// trErrObserver counts the store errors a Limiter reports.
type trErrObserver struct {
	core.NopObserver
	errs atomic.Int64
}

func (o *trErrObserver) ObserveError(core.ErrorEvent) { o.errs.Add(1) }

// TestTransportDryRunStoreFailure checks that a Transport over a dry-run
// Limiter sends a request whose decision the store failed, as the
// middleware's dry-run serves it (dry-run enforces nothing), while the
// failure reaches the Limiter's Observer; without dry-run it fails.
func TestTransportDryRunStoreFailure(t *testing.T) {
	for _, dry := range []bool{true, false} {
		obs := &trErrObserver{}
		opts := []core.Option{core.WithStore(trFailStore{}), core.WithObserver(obs)}
		if dry {
			opts = append(opts, core.WithDryRun())
		}
		lim := core.Must(core.New(core.PerSecond(1), opts...))
		base := &trBase{}
		tr, err := ratelimit.NewTransport(lim, &ratelimit.TransportConfig{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		switch {
		case dry && (err != nil || base.sent() != 1):
			t.Errorf("dry-run, store down: err %v, sent %d; want the request sent", err, base.sent())
		case !dry && (!errors.Is(err, ratelimit.ErrStoreFailure) || base.sent() != 0):
			t.Errorf("store down: err %v, sent %d; want ErrStoreFailure and nothing sent", err, base.sent())
		}
		if obs.errs.Load() != 1 {
			t.Errorf("dry-run %v: the Observer saw %d store errors, want 1", dry, obs.errs.Load())
		}
	}
}
