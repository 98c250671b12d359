package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/limitry/ratelimit/core"
)

// Defaults of [TransportConfig].
const (
	// DefaultMaxPause is the longest a Transport pauses a key on a server's
	// word when TransportConfig.MaxPause is 0.
	DefaultMaxPause = time.Hour

	// DefaultPauseCapacity is the number of keys whose server-imposed pause
	// a Transport remembers when TransportConfig.PauseCapacity is 0.
	DefaultPauseCapacity = 10_000

	// NoHintPause is how long a Transport pauses a key after a 429 response
	// that names no time at all (no usable Retry-After, RateLimit or
	// X-RateLimit-Reset), so that it does not send the next request into
	// the same refusal at once.
	NoHintPause = time.Second
)

var (
	// ErrOutboundLimited is wrapped by the error a [Transport] returns for
	// a request it did not send because of a rate limit: its own rule had
	// no slot, or the server had asked for a pause, and the request could
	// not wait (fail fast, the maximum wait, or the request's context).
	// errors.As with an [*OutboundLimitError] gives the details.
	ErrOutboundLimited = errors.New("ratelimit: outgoing request over its rate limit")

	// ErrInvalidTransport is wrapped by the errors of [NewTransport] for an
	// invalid configuration.
	ErrInvalidTransport = errors.New("ratelimit: invalid transport configuration")
)

// TransportConfig configures a [Transport]. A nil *TransportConfig is the
// zero value: every field at its default.
type TransportConfig struct {
	// Base sends the requests the Transport admits. The default value is
	// http.DefaultTransport.
	Base http.RoundTripper

	// Key maps a request to the key whose quota it is charged to. A key
	// function that returns an error wrapping ErrNoKey leaves the request
	// unlimited (it is sent at once, and nothing is learned from its
	// response; when that is so for every one of the first
	// [AbsentKeyLogAfter] requests, Logger hears of it once); any other
	// error, or an empty key, fails the request. The default value is
	// [TargetHost]: one quota per host and port.
	Key KeyFunc

	// MaxWait bounds how long one request may wait for a slot, in total.
	// A request that would have to wait longer fails at once with
	// ErrOutboundLimited instead of waiting part of the way. The default
	// value, 0, lets a request wait as long as its context allows.
	MaxWait time.Duration

	// FailFast makes a request that would have to wait fail at once with
	// ErrOutboundLimited. It cannot be combined with MaxWait. The default
	// value is false: requests wait.
	FailFast bool

	// MaxPause caps the pause a server's response can impose on a key
	// (Retry-After, RateLimit, X-RateLimit-Reset): a longer or absurd value
	// pauses the key for MaxPause. It must not be negative. The default
	// value is DefaultMaxPause (one hour).
	MaxPause time.Duration

	// PauseCapacity is the number of keys whose pause the Transport
	// remembers, least recently used first out. A key whose pause is
	// forgotten is still limited by the Limiter's rule. It must not be
	// negative. The default value is DefaultPauseCapacity.
	PauseCapacity int

	// Logger receives, once, a warning when the Key found no key on every
	// one of the first [AbsentKeyLogAfter] requests: they were all sent
	// unlimited (see Key). The default value, nil, is slog.Default(); give
	// a logger with a discard handler for none.
	Logger *slog.Logger
}

// Transport is an http.RoundTripper that limits outgoing requests: each
// request is charged, under its key, to a [core.Limiter] (the same rules,
// algorithms and stores as the middleware, so a Redis store shares one
// quota among a fleet of callers), and waits for a slot when there is none.
// It is safe for concurrent use.
//
// # Waiting
//
// A request the Limiter refuses waits for the decision's RetryAfter and
// asks again, until it is admitted, its context ends, or its total wait
// would pass TransportConfig.MaxWait; with TransportConfig.FailFast it never
// waits. A request that cannot wait, or whose context has a deadline
// earlier than the slot, fails at once, charging nothing, with an error
// wrapping [ErrOutboundLimited] (an [*OutboundLimitError]; through an
// http.Client, inside a *url.Error). A request whose context ends while it
// waits fails with an error wrapping both ErrOutboundLimited and the
// context's error. A Limiter in dry-run mode decides (and reports to its
// Observer) but never makes a request wait, and no server pause applies.
//
// A shaping rule (a LeakyBucket with MaxDelay) admits a request on
// condition that it is sent no sooner than Decision.Delay from now: the
// Transport waits that delay, under the same bounds, and then any pause
// the server asked for meanwhile (a 429 to another request of the key). A
// request admitted with a delay, or held by such a pause, that it may not
// wait (FailFast, MaxWait, a deadline, or its context ending) is not sent
// and fails as above, and keeps its charge, as the middleware's requests
// do: a refund gives back a bucket's latest
// units, not this request's, so that with a request booked behind it
// meanwhile (by this process or another) the next one would take a slot
// already taken. So each such attempt books a slot: give callers that may
// not wait a rule without MaxDelay (a meter refuses without charging).
//
// A store failure fails the request with an error wrapping
// [ErrStoreFailure]: the Transport never sends unlimited, except for a
// Limiter in dry-run mode, which enforces nothing and sends the request
// (the failure reaches the Limiter's Observer, as the HTTP middleware's
// dry-run serves it). A policy the
// store cannot decide (one the Limiter's Resolver picks without listing
// it, see core.PolicyChecker) fails it with an error wrapping [ErrConfig].
//
// A request refused with a time to retry is decided again once it has
// waited, and each decision reaches the Limiter's Observer: each refusal it
// waits out counts as a refusal there (promlimit's "denied"), so a request
// sent after n such refusals counts n refusals and one admission. Waiting
// out a shaping delay or a pause the server asked for is no decision, and
// counts none.
//
// Waits use a real timer, unless the Limiter's Clock has a method
// Sleep(ctx context.Context, d time.Duration) error, which is then called
// instead: tests give it a fake clock that advances when slept on.
//
// # Learning from the server
//
// Every response is read for the server's own limit, and the key is paused
// (no request sent, nothing charged) until the time it names, so that the
// application does not meet a 429 it could have avoided. The response
// itself is returned unchanged: the Transport never retries.
//
//   - 429 Too Many Requests or 503 Service Unavailable with Retry-After
//     (delay-seconds, or an HTTP-date compared with the Limiter's clock):
//     that time, which takes precedence over every other field.
//   - Otherwise, the latest of: the IETF RateLimit field
//     ("name";r=0;t=5, draft-ietf-httpapi-ratelimit-headers), t seconds
//     for each policy whose r is 0; X-RateLimit-Remaining: 0 (or draft-06
//     RateLimit-Remaining: 0) with X-RateLimit-Reset (RateLimit-Reset),
//     read as a Unix time in seconds when it is at least 1,000,000,000
//     (September 2001) and as seconds from now when it is smaller, since
//     servers send both (a delta of 31 years is no realistic reset).
//   - A 429 with none of those pauses the key for NoHintPause.
//
// Fields are parsed defensively: a malformed field is ignored (as the
// draft requires), a huge value never overflows, and no pause lasts longer
// than TransportConfig.MaxPause, so a hostile or broken server can delay a
// key by at most that much at a time, never forever. A pause only ever
// extends an earlier one. Unix times and HTTP-dates assume that the
// server's clock and the Limiter's agree; a far-off clock is bounded by the
// same cap.
type Transport struct {
	limiter  *core.Limiter
	clock    core.Clock
	base     http.RoundTripper
	key      KeyFunc
	maxWait  time.Duration
	failFast bool
	maxPause time.Duration
	dryRun   bool
	sleep    func(ctx context.Context, d time.Duration) error // replaced in tests
	logger   *slog.Logger
	absent   missCount // requests whose key was absent, until one had a key

	mu     sync.Mutex
	pauses *simplelru.LRU[string, int64] // key -> end of its pause, Unix ns; requires mu held
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport that charges each request to limiter,
// under the key cfg.Key gives it, and sends the requests it admits through
// cfg.Base. cfg may be nil. limiter must have a default policy (a Limiter
// for Take only is refused); its rule should have a Name of its own when
// its Store is shared with other limiters.
//
// An invalid configuration is an error wrapping ErrInvalidTransport.
func NewTransport(limiter *core.Limiter, cfg *TransportConfig) (*Transport, error) {
	var c TransportConfig
	if cfg != nil {
		c = *cfg
	}
	bad := func(format string, args ...any) (*Transport, error) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidTransport, fmt.Sprintf(format, args...))
	}
	switch {
	case limiter == nil:
		return bad("nil limiter")
	case limiter.Policy() == nil:
		return bad("the limiter has no policy")
	case c.MaxWait < 0:
		return bad("negative MaxWait %v", c.MaxWait)
	case c.FailFast && c.MaxWait > 0:
		return bad("FailFast and MaxWait %v contradict each other", c.MaxWait)
	case c.MaxPause < 0:
		return bad("negative MaxPause %v", c.MaxPause)
	case c.PauseCapacity < 0:
		return bad("negative PauseCapacity %d", c.PauseCapacity)
	}
	if c.Base == nil {
		c.Base = http.DefaultTransport
	}
	if c.Key == nil {
		c.Key = TargetHost
	}
	if c.MaxPause == 0 {
		c.MaxPause = DefaultMaxPause
	}
	if c.PauseCapacity == 0 {
		c.PauseCapacity = DefaultPauseCapacity
	}
	pauses, err := simplelru.NewLRU[string, int64](c.PauseCapacity, nil)
	if err != nil {
		return bad("%v", err)
	}
	t := &Transport{
		limiter:  limiter,
		clock:    limiter.Clock(),
		base:     c.Base,
		key:      c.Key,
		maxWait:  c.MaxWait,
		failFast: c.FailFast,
		maxPause: c.MaxPause,
		dryRun:   limiter.DryRun(),
		pauses:   pauses,
		sleep:    transportSleep,
		logger:   c.Logger,
	}
	if t.logger == nil {
		t.logger = slog.Default()
	}
	if s, ok := t.clock.(interface {
		Sleep(ctx context.Context, d time.Duration) error
	}); ok {
		t.sleep = s.Sleep
	}
	return t, nil
}

// TargetHost is the default key of a [Transport]: the request's host and
// port, lower-cased, without the trailing dot of a fully qualified name, and
// with the scheme's default port left out, so that https://API.example.com,
// https://api.example.com. and https://api.example.com:443 share a quota.
// An IP address is written in one form (IPv6 canonical; an IPv4-mapped
// IPv6 address as the IPv4 address it reaches), and so is a port
// (https://api.example.com:0443 is https://api.example.com). It returns an
// error for a request without a host, with a port that is not a number from
// 1 to 65535, or with a host that is not ASCII (net/http dials such a host
// by its IDNA mapping, under which many spellings reach one server: write
// it in its ASCII, xn--, form).
func TargetHost(r *http.Request) (string, error) {
	if r.URL == nil || r.URL.Host == "" {
		return "", errors.New("ratelimit: outgoing request without a host")
	}
	host, port := strings.TrimSuffix(r.URL.Hostname(), "."), r.URL.Port()
	for i := 0; i < len(host); i++ {
		if host[i] >= utf8.RuneSelf {
			// net/http dials its IDNA mapping, which has many spellings.
			return "", fmt.Errorf("ratelimit: outgoing request host %q is not ASCII: write it in its ASCII (xn--) form", host)
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String() // one spelling of each address
	}
	if port != "" {
		// One spelling of each port: net/http reads it as a number.
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("ratelimit: outgoing request port %q is not a port number", port)
		}
		port = strconv.Itoa(n)
	}
	if port == "" || (port == "443" && r.URL.Scheme == "https") || (port == "80" && r.URL.Scheme == "http") {
		if strings.Contains(host, ":") {
			return "[" + strings.ToLower(host) + "]", nil
		}
		return strings.ToLower(host), nil
	}
	return net.JoinHostPort(strings.ToLower(host), port), nil
}

// OutboundLimitError is the error a [Transport] returns for a request it
// did not send because of a rate limit. It wraps [ErrOutboundLimited] and,
// when the request's context ended while it waited or its deadline was too
// close, the context's error.
type OutboundLimitError struct {
	// Key is the key the request was charged to.
	Key string

	// Wait is how long the request would still have had to wait for a
	// slot when the Transport gave up.
	Wait time.Duration

	// Decision is the Limiter's refusing decision; its admitting decision
	// when a shaping rule (a LeakyBucket with MaxDelay) admitted the request
	// on condition that it waits Decision.Delay, and it could not wait that
	// long; or the zero Decision when the key was paused by the server.
	Decision core.Decision

	// PausedUntil is the end of the server's pause on Key (by the
	// Limiter's clock), or the zero time when the Limiter refused.
	PausedUntil time.Time

	// Err is the context's error when the request's context ended during
	// the wait or its deadline came before the slot; nil otherwise.
	Err error
}

// Error describes the refusal.
func (e *OutboundLimitError) Error() string {
	why := "rate limit " + outboundRuleName(e.Decision.Policy)
	if !e.PausedUntil.IsZero() {
		why = "paused at the server's request"
	}
	msg := fmt.Sprintf("%s: key %q: %s, %v to wait", ErrOutboundLimited, e.Key, why, e.Wait)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrOutboundLimited and, if set, Err.
func (e *OutboundLimitError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrOutboundLimited, e.Err}
	}
	return []error{ErrOutboundLimited}
}

func outboundRuleName(p *core.Policy) string {
	if p == nil {
		return `""`
	}
	return fmt.Sprintf("%q", p.Rule().Name)
}

// RoundTrip implements http.RoundTripper: it waits for a slot for req's
// key (see [Transport]), sends req through the base RoundTripper, and
// learns from the response. A request that is not sent has its body closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, err := t.key(req)
	if t.absent.note(!errors.Is(err, ErrNoKey), AbsentKeyLogAfter) {
		t.logger.Warn(msgTransportAbsentKey, "requests", AbsentKeyLogAfter)
	}
	switch {
	case errors.Is(err, ErrNoKey):
		return t.base.RoundTrip(req)
	case err != nil:
		closeRequestBody(req)
		return nil, fmt.Errorf("ratelimit: outgoing request key: %w", err)
	case key == "":
		closeRequestBody(req)
		return nil, ErrEmptyKey
	}
	if err := t.acquire(req.Context(), key); err != nil {
		closeRequestBody(req)
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp == nil || t.dryRun {
		return resp, err
	}
	now := t.clock.Now()
	if d := serverPause(resp.StatusCode, resp.Header, now, t.maxPause); d > 0 {
		t.pause(key, addNanos(now.UnixNano(), d))
	}
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, when it has such a method (http.Client.CloseIdleConnections
// calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// PausedFor returns how much longer key is paused at the server's request,
// by the Limiter's clock; 0 when it is not paused.
func (t *Transport) PausedFor(key string) time.Duration {
	now := t.clock.Now()
	if until, ok := t.pausedUntil(key, now.UnixNano()); ok {
		return untilNanos(until, now.UnixNano())
	}
	return 0
}

func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// acquire waits until key may send one request, and charges it.
func (t *Transport) acquire(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var waited time.Duration
	for {
		now := t.clock.Now()
		var (
			wait  time.Duration
			dec   core.Decision
			until int64
		)
		if u, ok := t.pausedUntil(key, now.UnixNano()); ok && !t.dryRun {
			until, wait = u, untilNanos(u, now.UnixNano())
		} else {
			d, err := t.limiter.AllowN(ctx, key, 1)
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return cerr // the caller gave up: not a store failure
				}
				if errors.Is(err, core.ErrUnsupportedPolicy) || errors.Is(err, core.ErrDuplicateRequest) {
					// A policy the store cannot decide: the Limiter's
					// configuration, not the store's health.
					return fmt.Errorf("%w: %w", ErrConfig, err)
				}
				if t.dryRun {
					return nil // dry-run enforces nothing: the request is sent
				}
				return fmt.Errorf("%w: %w", ErrStoreFailure, err)
			}
			if t.dryRun || (d.Allowed && d.Delay <= 0) {
				return nil
			}
			if d.Allowed {
				// A shaping rule admitted the request on condition that
				// it is sent no sooner than Delay from now. One that is
				// not sent keeps its charge: a bucket gives back its
				// latest units, not this request's, so that with a
				// request booked behind it meanwhile (by this process or
				// another) a refund would let the next one take a slot
				// already taken.
				if err := t.waitFor(ctx, key, &waited, d.Delay, d, 0); err != nil {
					return err
				}
				return t.waitPause(ctx, key, waited, d)
			}
			dec, wait = d, d.RetryAfter
			if wait <= 0 { // a store that refuses without a time: do not spin
				wait = time.Millisecond
			}
		}
		if err := t.waitFor(ctx, key, &waited, wait, dec, until); err != nil {
			return err
		}
	}
}

// waitFor waits wait for key, having waited *waited already, which it
// advances. It returns nil once it has waited, and otherwise the error of
// a request that may not wait, decided dec, or held by a pause until
// until (0: none).
func (t *Transport) waitFor(ctx context.Context, key string, waited *time.Duration, wait time.Duration, dec core.Decision, until int64) error {
	cause := t.wait(ctx, *waited, wait)
	if cause == nil {
		*waited += wait
		return nil
	}
	if cause == errNoWait {
		cause = nil
	}
	e := &OutboundLimitError{Key: key, Wait: wait, Decision: dec, Err: cause}
	if until != 0 {
		e.PausedUntil = time.Unix(0, until)
	}
	return e
}

// waitPause waits out a pause of key that began while a request admitted
// by a shaping rule (dec, charged) waited its delay (a 429 to another
// request of the key), having waited waited in all: the request is sent
// once no pause holds, or fails as a refusal does, keeping its charge.
func (t *Transport) waitPause(ctx context.Context, key string, waited time.Duration, dec core.Decision) error {
	for {
		now := t.clock.Now().UnixNano()
		u, ok := t.pausedUntil(key, now)
		if !ok {
			return nil
		}
		if err := t.waitFor(ctx, key, &waited, untilNanos(u, now), dec, u); err != nil {
			return err
		}
	}
}

// errNoWait is what wait returns when the Transport may not wait (FailFast,
// or MaxWait would pass).
var errNoWait = errors.New("ratelimit: the request may not wait")

// wait sleeps d, having waited waited already, when the request may wait
// that long. It returns nil after the sleep; errNoWait when FailFast or
// MaxWait forbid the wait; context.DeadlineExceeded when the context's
// deadline comes first; the context's error when it ends during the sleep.
func (t *Transport) wait(ctx context.Context, waited, d time.Duration) error {
	switch dl, hasDeadline := ctx.Deadline(); {
	case t.failFast || (t.maxWait > 0 && waited+d > t.maxWait):
		return errNoWait
	case hasDeadline && time.Until(dl) < d:
		return context.DeadlineExceeded
	}
	return t.sleep(ctx, d)
}

// addNanos returns the Unix nanosecond ns + d, for d >= 0, saturated at
// the largest: a MaxPause of centuries must not wrap into the past (ns + d
// cannot overflow for ns <= 0, a clock before 1970).
func addNanos(ns int64, d time.Duration) int64 {
	if ns > 0 && int64(d) > math.MaxInt64-ns {
		return math.MaxInt64
	}
	return ns + int64(d)
}

// untilNanos returns the time from the Unix nanosecond now to until, which
// is later, saturated at the longest Duration (a pause's end saturated by
// addNanos, seen from a clock before 1970).
func untilNanos(until, now int64) time.Duration {
	if now < 0 && until > math.MaxInt64+now {
		return math.MaxInt64
	}
	return time.Duration(until - now)
}

// pausedUntil returns the end of key's pause, if it is later than now.
func (t *Transport) pausedUntil(key string, now int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.pauses.Get(key)
	if !ok {
		return 0, false
	}
	if until <= now {
		t.pauses.Remove(key)
		return 0, false
	}
	return until, true
}

// pause pauses key until the Unix nanosecond until, unless it is already
// paused for longer.
func (t *Transport) pause(key string, until int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.pauses.Peek(key); ok && old >= until {
		return
	}
	t.pauses.Add(key, until)
}

// transportSleep waits for d or until ctx ends.
func transportSleep(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Bounds on the rate-limit fields a response may carry.
const (
	// maxPauseFieldLen is the longest field value parsed; a longer one is
	// ignored.
	maxPauseFieldLen = 4096
	// resetEpochThreshold separates a Unix-time X-RateLimit-Reset from a delta.
	resetEpochThreshold = 1_000_000_000
)

// serverPause returns how long a response asks its key to pause (at most
// maxPause), or 0. now is the time the response was read.
func serverPause(status int, h http.Header, now time.Time, maxPause time.Duration) time.Duration {
	limited := status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
	if limited {
		if v, ok := fieldOnce(h, "Retry-After"); ok {
			if d, ok := parseRetryAfter(v, now, maxPause); ok {
				return d
			}
		}
	}
	var d time.Duration
	hinted := false
	if vs := h["Ratelimit"]; len(vs) > 0 {
		if t, ok := parseRateLimitField(vs); ok {
			d, hinted = max(d, capPause(t, 0, maxPause)), true
		}
	}
	for _, p := range [...][2]string{
		{"X-Ratelimit-Remaining", "X-Ratelimit-Reset"},
		{"Ratelimit-Remaining", "Ratelimit-Reset"},
	} {
		rem, ok := fieldOnce(h, p[0])
		if !ok {
			continue
		}
		if n, ok := parseDelaySeconds(rem); !ok || n != 0 {
			continue
		}
		reset, ok := fieldOnce(h, p[1])
		if !ok {
			continue
		}
		if r, ok := parseReset(reset, now, maxPause); ok {
			d, hinted = max(d, r), true
		}
	}
	if !hinted && status == http.StatusTooManyRequests {
		return min(NoHintPause, maxPause)
	}
	return d
}

// fieldOnce returns the value of a field that appears exactly once; name
// is in canonical form.
func fieldOnce(h http.Header, name string) (string, bool) {
	vs := h[name]
	if len(vs) != 1 || len(vs[0]) > maxPauseFieldLen {
		return "", false
	}
	return strings.Trim(vs[0], " \t"), true
}

// capPause returns sec seconds plus frac nanoseconds, at most max.
func capPause(sec int64, frac int64, limit time.Duration) time.Duration {
	if sec < 0 {
		return 0
	}
	if sec >= int64(limit/time.Second)+1 {
		return limit
	}
	return min(time.Duration(sec)*time.Second+time.Duration(frac), limit)
}

// parseDelaySeconds parses a non-negative integer of 1 to 15 digits (the
// Structured Fields bound); a longer run of digits reads as "huge",
// math.MaxInt64.
func parseDelaySeconds(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	digits := 0 // significant digits: leading zeros are allowed and count for nothing
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if digits == 0 && c == '0' {
			continue
		}
		if digits++; digits > 15 {
			n = 1<<63 - 1
			continue
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// parseRetryAfter parses Retry-After: delay-seconds, or an HTTP-date
// compared with now. A date in the past is a pause of 0.
func parseRetryAfter(v string, now time.Time, maxPause time.Duration) (time.Duration, bool) {
	if n, ok := parseDelaySeconds(v); ok {
		return capPause(n, 0, maxPause), true
	}
	if len(v) > 64 {
		return 0, false
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(at.Sub(now), 0), maxPause), true
}

// parseReset parses an X-RateLimit-Reset value: seconds, with an optional
// fraction of up to 9 digits, read as a Unix time from resetEpochThreshold up
// and as a delta below it.
func parseReset(v string, now time.Time, maxPause time.Duration) (time.Duration, bool) {
	ip, fp, _ := strings.Cut(v, ".")
	sec, ok := parseDelaySeconds(ip)
	if !ok || len(fp) > 9 || (fp == "" && strings.HasSuffix(v, ".")) {
		return 0, false
	}
	var frac int64
	for i := 0; i < 9; i++ {
		frac *= 10
		if i < len(fp) {
			c := fp[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			frac += int64(c - '0')
		}
	}
	if sec < resetEpochThreshold {
		return capPause(sec, frac, maxPause), true
	}
	if sec-now.Unix() > int64(maxPause/time.Second)+1 {
		return maxPause, true
	}
	return min(max(time.Unix(sec, frac).Sub(now), 0), maxPause), true
}

// parseRateLimitField reads the IETF RateLimit field (a Structured Field
// List, its lines joined) and returns the largest t among the items whose r
// is 0. ok is false when the field is malformed (clients must then ignore
// it) or no item with r=0 has a t.
func parseRateLimitField(lines []string) (t int64, ok bool) {
	n := 0
	for _, l := range lines {
		n += len(l) + 2
	}
	if n > maxPauseFieldLen {
		return 0, false
	}
	p := rlFieldParser{s: lines[0]}
	if len(lines) > 1 {
		p.s = strings.Join(lines, ", ")
	}
	p.skipSP()
	if p.eof() {
		return 0, false
	}
	best, found := int64(0), false
	for {
		if !p.bareItem() {
			return 0, false
		}
		r, rOK, tv, tOK, valid := p.params()
		if !valid {
			return 0, false
		}
		if rOK && r == 0 && tOK && tv >= 0 && (!found || tv > best) {
			best, found = tv, true
		}
		p.skipOWS()
		if p.eof() {
			break
		}
		if p.s[p.i] != ',' {
			return 0, false
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return 0, false // trailing comma
		}
	}
	return best, found
}

// rlFieldParser is a minimal RFC 9651 parser for what the RateLimit field
// holds: a List of Items with Parameters. It validates the syntax and
// extracts the integer parameters r and t; it allocates nothing.
type rlFieldParser struct {
	s string
	i int
}

func (p *rlFieldParser) eof() bool { return p.i >= len(p.s) }

func (p *rlFieldParser) skipSP() {
	for !p.eof() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *rlFieldParser) skipOWS() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// bareItem skips one bare item.
func (p *rlFieldParser) bareItem() bool {
	_, _, ok := p.bareValue()
	return ok
}

// bareValue parses a bare item and returns its value when it is an
// Integer (isInt true).
func (p *rlFieldParser) bareValue() (num int64, isInt bool, ok bool) {
	if p.eof() {
		return 0, false, false
	}
	switch c := p.s[p.i]; {
	case c == '"':
		p.i++
		for !p.eof() {
			c := p.s[p.i]
			p.i++
			switch {
			case c == '\\':
				if p.eof() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return 0, false, false
				}
				p.i++
			case c == '"':
				return 0, false, true
			case c < 0x20 || c > 0x7e:
				return 0, false, false
			}
		}
		return 0, false, false
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return 0, false, true
		}
		return 0, false, false
	case c == ':':
		p.i++
		for !p.eof() {
			c := p.s[p.i]
			p.i++
			if c == ':' {
				return 0, false, true
			}
			if !sfBase64(c) {
				return 0, false, false
			}
		}
		return 0, false, false
	case c == '*' || sfAlpha(c):
		p.i++
		for !p.eof() && sfTokenChar(p.s[p.i]) {
			p.i++
		}
		return 0, false, true
	case c == '@': // a Date: an Integer of seconds, which is not an Integer item
		p.i++
		if p.eof() || (p.s[p.i] != '-' && !sfDigit(p.s[p.i])) {
			return 0, false, false
		}
		_, isInt, ok := p.number()
		return 0, false, ok && isInt
	case c == '%':
		return 0, false, p.displayString()
	}
	return 0, false, false
}

// displayString parses a Display String (%"...", its non-ASCII bytes
// percent-encoded in lower-case hexadecimal), which must decode to UTF-8.
func (p *rlFieldParser) displayString() bool {
	if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' {
		return false
	}
	p.i += 2
	var buf [maxPauseFieldLen]byte
	n := 0
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return utf8.Valid(buf[:n])
		case c == '%':
			if p.i+1 >= len(p.s) {
				return false
			}
			hi, lo := lowerHex(p.s[p.i]), lowerHex(p.s[p.i+1])
			if hi < 0 || lo < 0 {
				return false
			}
			c = byte(hi<<4 | lo)
			p.i += 2
		case c < 0x20 || c > 0x7e:
			return false
		}
		if n == len(buf) {
			return false
		}
		buf[n] = c
		n++
	}
	return false
}

// lowerHex returns the value of a lower-case hexadecimal digit, or -1.
func lowerHex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}

// number parses an Integer (at most 15 digits) or a Decimal (at most 12
// integer and 3 fraction digits).
func (p *rlFieldParser) number() (int64, bool, bool) {
	neg := false
	if p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	start := p.i
	var n int64
	for !p.eof() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		if p.i-start >= 15 {
			return 0, false, false
		}
		n = n*10 + int64(p.s[p.i]-'0')
		p.i++
	}
	digits := p.i - start
	if digits == 0 {
		return 0, false, false
	}
	if p.eof() || p.s[p.i] != '.' {
		if neg {
			n = -n
		}
		return n, true, true
	}
	if digits > 12 {
		return 0, false, false
	}
	p.i++
	fstart := p.i
	for !p.eof() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	if f := p.i - fstart; f < 1 || f > 3 {
		return 0, false, false
	}
	return 0, false, true
}

// params parses an item's Parameters and returns its integer r and t (the
// last occurrence of each wins, as RFC 9651 requires).
func (p *rlFieldParser) params() (r int64, rOK bool, t int64, tOK bool, ok bool) {
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		if p.eof() || !(p.s[p.i] == '*' || (p.s[p.i] >= 'a' && p.s[p.i] <= 'z')) {
			return 0, false, 0, false, false
		}
		start := p.i
		for !p.eof() && sfKeyChar(p.s[p.i]) {
			p.i++
		}
		key := p.s[start:p.i]
		var v int64
		isInt := false
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			var valid bool
			v, isInt, valid = p.bareValue()
			if !valid {
				return 0, false, 0, false, false
			}
		}
		switch key {
		case "r":
			r, rOK = v, isInt && v >= 0
		case "t":
			t, tOK = v, isInt && v >= 0
		}
	}
	return r, rOK, t, tOK, true
}

func sfAlpha(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

func sfDigit(c byte) bool { return c >= '0' && c <= '9' }

func sfKeyChar(c byte) bool {
	return (c >= 'a' && c <= 'z') || sfDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

func sfBase64(c byte) bool { return sfAlpha(c) || sfDigit(c) || c == '+' || c == '/' || c == '=' }

// sfTokenChar reports whether c may continue an sf-token: tchar, ':' or '/'.
func sfTokenChar(c byte) bool {
	if sfAlpha(c) || sfDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
