package ratelimit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/limitry/ratelimit/core"
)

// IdempotencyKeyHeader is the request header that carries an idempotency key
// (draft-ietf-httpapi-idempotency-key-header).
const IdempotencyKeyHeader = "Idempotency-Key"

// Defaults of [IdempotencyConfig].
const (
	// DefaultIdempotencyTTL is how long an admitted key is replayed when
	// IdempotencyConfig.TTL is 0.
	DefaultIdempotencyTTL = 24 * time.Hour

	// DefaultIdempotencyMaxWait is how long a request waits for a
	// concurrent request with the same key to be decided, before it is
	// answered 409 Conflict, when IdempotencyConfig.MaxWait is 0.
	DefaultIdempotencyMaxWait = time.Second

	// DefaultMaxReplays is how many times one admitted key is replayed
	// before it is decided afresh, when IdempotencyConfig.MaxReplays is 0.
	DefaultMaxReplays = 100

	// DefaultReplayStoreCapacity is the number of keys held by the
	// MemoryReplayStore made when IdempotencyConfig.Store is nil, and by
	// [NewMemoryReplayStore] given a capacity <= 0.
	DefaultReplayStoreCapacity = 100_000
)

// ErrReplayPending is returned by [ReplayStore.Claim] when another request
// holds a live claim on the key: it is being decided right now.
var ErrReplayPending = errors.New("ratelimit: idempotency key is being decided by another request")

// ReplayStore remembers the idempotency keys an [Idempotency] filter has seen
// admitted, with the rate-limit headers of their decision. Keys arrive
// hashed and scoped (see [Idempotency]); records are opaque bytes. A
// ReplayStore is safe for concurrent use. The memory implementation is
// [MemoryReplayStore]; adapters/redisstore has one for fleets.
type ReplayStore interface {
	// Claim looks key up. When it holds a committed record replayed fewer
	// than maxReplays times, Claim counts one more replay and returns the
	// record (token empty). When it holds nothing, or a record replayed
	// maxReplays times already, Claim claims it for hold and returns a
	// non-empty token, the proof of the claim for Commit or Release. When
	// another claim on it is live, Claim returns ErrReplayPending. Any
	// other error is a store failure.
	Claim(ctx context.Context, key string, hold time.Duration, maxReplays int) (rec []byte, token string, err error)

	// Commit replaces the claim token holds on key by rec, kept for ttl. It
	// does nothing when the claim has expired or was taken over.
	Commit(ctx context.Context, key, token string, rec []byte, ttl time.Duration) error

	// Release drops the claim token holds on key, so the next request with
	// the key is decided afresh. It does nothing when the claim is gone.
	Release(ctx context.Context, key, token string) error
}

// IdempotencyConfig configures [NewIdempotency]. A nil *IdempotencyConfig
// means the defaults.
type IdempotencyConfig struct {
	// Key returns the request's idempotency key; ErrNoKey means the request
	// has none and is limited as usual. The default value reads the
	// Idempotency-Key header.
	Key KeyFunc

	// Client scopes idempotency keys to a client, so that one client can
	// neither replay nor probe another's keys. The default value is
	// ClientIP() (the peer address; pass the Limiter's own ClientIP key
	// function when it trusts proxies). A request whose client key fails is
	// limited as usual, without replay.
	Client KeyFunc

	// Store remembers admitted keys. The default value is a new
	// MemoryReplayStore holding DefaultReplayStoreCapacity keys on the
	// Limiter's clock.
	Store ReplayStore

	// Scope names the filter's records in a Store shared with other
	// filters: filters with different Scopes never replay each other's
	// admissions. Records are already apart when the requests differ in
	// host or path, or the Limiters in their rules; give a Scope of its
	// own to each filter that may see the same request as another whose
	// Limiter has the same rules but is not the same (another store, a
	// Resolver, dry-run), for example one nested in the other. The same
	// filter in several processes keeps the same Scope, so that a retry
	// reaching another instance is replayed. The default value is "".
	Scope string

	// TTL is how long an admitted key is replayed. The default value is
	// DefaultIdempotencyTTL.
	TTL time.Duration

	// MaxReplays is how many times one admitted key is replayed before a
	// request with it is decided (and charged) afresh: a client gets at most
	// 1 + MaxReplays handler runs for each charge, however it picks its
	// keys. The default value, DefaultMaxReplays, leaves room for bursts of
	// concurrent retries; lower it where each handler run is costly.
	MaxReplays int

	// MaxWait bounds how long a request waits for a concurrent request with
	// the same key to be decided before it is answered 409 Conflict, as the
	// idempotency-key draft advises. The default value is
	// DefaultIdempotencyMaxWait.
	MaxWait time.Duration

	// OnError, if set, is called when the ReplayStore fails; the request is
	// then limited (and charged) as if it had no idempotency key. The
	// default value is none.
	OnError func(r *http.Request, err error)
}

// Idempotency is a decorator around a [Limiter] that charges a retried
// request once. A request carrying an idempotency key (the Idempotency-Key
// header by default) that was already admitted within the TTL gets the same
// decision again, with the same rate-limit headers, and is charged nothing;
// the handler runs again (making the handler itself idempotent is the
// application's business). A key is replayed at most MaxReplays times;
// after that a request with it is decided and charged afresh, so replays
// multiply a client's handler runs by at most 1 + MaxReplays. A key whose request was refused, skipped or
// failed is not remembered: a refusal is not a promise, and the next request
// with it is decided afresh.
//
// Keys are scoped per client (see IdempotencyConfig.Client), per method,
// per host, per path (as the server received it, before a handler such as
// http.StripPrefix changed it), per Limiter rules (every layer's name,
// quota, MaxDelay and routes) and per charge (the key and cost of every layer that
// applies to the request), and hashed (SHA-256) before
// they reach the store, so a raw key is never stored, one client cannot
// replay another's (nor one user another's behind the same address), a
// replay is never of a costlier request than the one charged, and filters
// whose Limiters have different rules, or that have different
// IdempotencyConfig.Scopes, may share one ReplayStore without ever
// replaying each other's admissions. Two filters over Limiters with the
// same rules (the same layers' names, quotas, MaxDelays and routes) that
// may see the same request,
// nested say, share records unless their Scopes differ: give each its own
// when their Limiters differ otherwise (another store, a Resolver,
// dry-run). A retry made after SetRules changed the rules (a quota, a
// MaxDelay) is decided afresh. The Host is part of the scope: behind a proxy that sets each
// backend's own Host, a retry is replayed only by the backend that
// admitted it, so have the proxy keep the client's Host. The layers' keys and the cost are read
// once per request, for the scope and the decision alike (a KeyFunc or
// cost function that reads the body reads it once, as without the filter).
// A request whose layer key fails (a key error, an empty key, an absent key
// its layer refuses) goes through the Limiter unchanged, which answers it
// as without the filter: it is never replayed.
//
// Claiming a key and charging are one step for concurrent requests: the
// first request with a fresh key claims it in the ReplayStore, is decided,
// and commits its headers before it is served; a concurrent request with the
// same key waits (at most MaxWait) for that outcome and is replayed, or
// decided afresh after a refusal. So N concurrent requests with one fresh key
// are charged once. A process that dies between claim and commit leaves the
// claim to expire after MaxWait.
//
// A shaped request (a LeakyBucket layer with MaxDelay) waits its delay the
// first time only: the claim is held for MaxWait plus the longest MaxDelay
// the Limiter knows of, so a Resolver that picks shaping policies should
// list them (core.PolicyLister), as for WithMaxWaiting; a delay beyond that
// hold lets a retry that arrives during it take the claim again, and be
// decided and charged again (never replayed for free). Requests without a
// key go through the Limiter unchanged.
// The Limiter's WithRefund does not apply through the filter: a refunded
// charge would leave a replayable record behind, so a request keeps its
// charge whatever its status (it errs towards limiting).
//
// Mount it only where a handler run per key is what a retry should cost:
// payments and other writes that carry an idempotency key. Never mount it on
// authentication or other endpoints where a client gains by running the
// handler many times: the key is the client's choice, so a replayed key runs
// the handler without a charge (at most MaxReplays times per charge).
type Idempotency struct {
	l       *Limiter
	key     KeyFunc
	client  KeyFunc
	store   ReplayStore
	scope   string
	ttl     time.Duration
	maxWait time.Duration
	replays int
	onError func(*http.Request, error)
	sleep   func(ctx context.Context, d time.Duration) error
}

// NewIdempotency returns the idempotency filter around l configured by cfg
// (nil for the defaults). It returns an error for a nil Limiter, a Limiter
// with concurrency layers ([Layer.InFlight]: a replay takes no slot, so it
// would escape them; put such layers in a Limiter of their own, around or
// inside the filter), or a negative TTL or MaxWait.
func NewIdempotency(l *Limiter, cfg *IdempotencyConfig) (*Idempotency, error) {
	if l == nil {
		return nil, errors.New("ratelimit: NewIdempotency needs a Limiter")
	}
	if l.slots != nil {
		// A replayed request is charged nothing, so it would take no
		// in-flight slot either: a replay would escape the limit.
		return nil, errors.New("ratelimit: NewIdempotency: the Limiter has concurrency layers (Layer.InFlight), which a replayed request would escape; wrap a Limiter of rate layers only")
	}
	var c IdempotencyConfig
	if cfg != nil {
		c = *cfg
	}
	if c.TTL < 0 || c.MaxWait < 0 || c.MaxReplays < 0 {
		return nil, fmt.Errorf("ratelimit: idempotency TTL (%v), MaxWait (%v) and MaxReplays (%d) must not be negative", c.TTL, c.MaxWait, c.MaxReplays)
	}
	f := &Idempotency{l: l, key: c.Key, client: c.Client, store: c.Store, scope: c.Scope, ttl: c.TTL, maxWait: c.MaxWait, replays: c.MaxReplays, onError: c.OnError, sleep: waitTimer}
	if f.key == nil {
		f.key = Header(IdempotencyKeyHeader)
	}
	if f.client == nil {
		ip, err := ClientIP()
		if err != nil {
			return nil, err
		}
		f.client = ip
	}
	if f.store == nil {
		f.store = NewMemoryReplayStore(DefaultReplayStoreCapacity, l.clock)
	}
	if f.ttl == 0 {
		f.ttl = DefaultIdempotencyTTL
	}
	if f.maxWait == 0 {
		f.maxWait = DefaultIdempotencyMaxWait
	}
	if f.replays == 0 {
		f.replays = DefaultMaxReplays
	}
	return f, nil
}

// Handler returns a handler that decides every request through the filter
// (see [Idempotency.Admit]) and calls next for the ones it admits. It panics
// if next is nil.
func (f *Idempotency) Handler(next http.Handler) http.Handler {
	if next == nil {
		panic("ratelimit: Idempotency.Handler called with a nil http.Handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.Admit(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// Admit is [Limiter.Admit] with replay: it reports whether the caller should
// serve r, having written the rate-limit headers (replayed ones for a
// request whose key was already admitted) and, when r must not be served,
// the response. A request that waited MaxWait for a concurrent request with
// the same key is answered 409 Conflict. A panic while Admit decides or
// answers r (a denied handler aborting with http.ErrAbortHandler, say)
// gives up r's claim on the key on its way up, so a retry is decided
// afresh.
func (f *Idempotency) Admit(w http.ResponseWriter, r *http.Request) bool {
	skey, pre, ok := f.scopedKey(r)
	if !ok {
		if pre != nil {
			// A layer's key failed: answered as the Limiter answers it,
			// from the keys and costs already read.
			res := f.l.decideResultWith(r, true, pre)
			return f.l.serve(w, r, &res, res.Layers)
		}
		return f.l.Admit(w, r)
	}
	ctx := r.Context()
	var (
		rec   []byte
		token string
		err   error
	)
	// Waiting is bounded by the sum of the pauses (on real timers, like
	// shaping delays), not by the Limiter's clock, which may be a fake one.
	var waited time.Duration
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		// The claim outlives the decision and a shaping delay, so that a
		// concurrent retry waits for the outcome rather than re-claiming.
		d := f.l.rules.Load().maxDelay
		rec, token, err = f.store.Claim(ctx, skey, min(f.maxWait, math.MaxInt64-d)+d, f.replays) // saturated
		if !errors.Is(err, ErrReplayPending) {
			break
		}
		if waited >= f.maxWait {
			writeText(w, http.StatusConflict, "Conflict: a request with this idempotency key is in progress\n")
			return false
		}
		pause = min(pause, f.maxWait-waited)
		if err := f.sleep(ctx, pause); err != nil {
			return false // the client went away
		}
		waited += pause
	}
	switch {
	case err != nil:
		if f.onError != nil {
			f.onError(r, fmt.Errorf("ratelimit: idempotency store: %w", err))
		}
		res := f.l.decideResultWith(r, true, pre)
		return f.l.serve(w, r, &res, res.Layers)
	case token == "":
		replayHeaders(w.Header(), rec)
		return true
	}
	// A panic before the outcome is recorded (a denied or error handler
	// aborting with http.ErrAbortHandler, a panicking Observer or
	// Resolver, which net/http recovers from) releases the claim on its
	// way up, so that retries are decided afresh, not answered 409 until
	// the claim's hold expires.
	recorded := false
	defer func() {
		if !recorded {
			f.release(r, skey, token)
		}
	}()
	// Decided as Admit decides: a request meeting a full waiting room is
	// refused before anything is charged. The layers' keys and costs are
	// the ones the scope was computed from, read once.
	res := f.l.decideResultWith(r, true, pre)
	rec = nil
	if admittedResult(&res) {
		h := make(http.Header, 4)
		f.l.WriteHeaders(h, &res)
		rec = encodeHeaders(h)
	}
	ok = f.l.serve(w, r, &res, res.Layers)
	// Only a request that will be served is remembered: one refused
	// after its decision (a client gone during a shaping delay) is
	// decided afresh next time.
	// The outcome is recorded even for a client that has gone: its claim
	// must not linger.
	recorded = true
	if ok && rec != nil {
		if err := f.store.Commit(context.WithoutCancel(ctx), skey, token, rec, f.ttl); err != nil && f.onError != nil {
			f.onError(r, fmt.Errorf("ratelimit: idempotency store: %w", err))
		}
	} else {
		f.release(r, skey, token)
	}
	return ok
}

// release gives up the claim token holds on skey, with r's context without
// its cancellation, and reports a failure to the error callback.
func (f *Idempotency) release(r *http.Request, skey, token string) {
	if err := f.store.Release(context.WithoutCancel(r.Context()), skey, token); err != nil && f.onError != nil {
		f.onError(r, fmt.Errorf("ratelimit: idempotency store: %w", err))
	}
}

// admittedResult reports whether res charged every applied layer: the only
// outcome worth replaying.
func admittedResult(res *Result) bool {
	if res.Err != nil || res.Skipped || len(res.Layers) == 0 {
		return false
	}
	for i := range res.Layers {
		if res.Layers[i].Refused || !res.Layers[i].Decision.Allowed {
			return false
		}
	}
	return true
}

// scopedKey returns the store key of r's idempotency key: a hash of the
// client, method, host, path (as received, before any prefix was stripped)
// and key, and of what r would be charged (see writeChargeScope), with the
// layers' keys and costs it read, for the decision to use. ok is false when
// r has no usable key, and when a layer's key fails (see writeChargeScope:
// the layers read so far are then returned, for the decision).
func (f *Idempotency) scopedKey(r *http.Request) (string, []preparedLayer, bool) {
	k, err := f.key(r)
	if err != nil || k == "" {
		return "", nil, false
	}
	client, err := f.client(r)
	if err != nil || client == "" {
		return "", nil, false
	}
	h := sha256.New()
	for _, part := range []string{f.scope, client, r.Method, r.Host, receivedPath(r), k} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	pre, ok := f.l.writeChargeScope(h, r)
	if !ok {
		return "", pre, false
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16]), pre, true
}

// receivedPath returns r's path as the server received it (RequestURI's),
// before a handler such as http.StripPrefix changed r.URL; the URL's when r
// has no RequestURI (a request built by hand).
func receivedPath(r *http.Request) string {
	p := r.RequestURI // a request-target has no fragment: '#' is the path's
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	if p == "" {
		return r.URL.EscapedPath()
	}
	return p
}

// preparedLayer is what the charge scope read of one layer, so that the
// decision reads nothing twice: the key, or the error reading it, and the
// cost (read only for a layer whose key was read).
type preparedLayer struct {
	read, costRead bool
	key            string
	err            error
	cost           int64
}

// writeChargeScope writes to h the Limiter's rules (ruleDigest) and what
// deciding r would charge: the index, key and cost of every layer that
// applies to it, and returns what it read of each layer. A replay is then of a request with the same
// charges, by the same rules: neither a costlier one (one unit charged
// would otherwise buy replays of any cost) nor another user's or API key's
// behind the same address (which the client scope alone would let
// through), nor one charged by another Limiter's layer sharing the store.
// A layer whose key is absent (ErrNoKey) and skipped is left out, as
// deciding r leaves it out. A layer whose key fails otherwise (a key
// error, an empty key, an absent key that the layer refuses) makes
// writeChargeScope return false, with what it read up to that layer:
// deciding r fails there, and a replay of a request that lacked the layer
// must not serve it.
func (l *Limiter) writeChargeScope(h io.Writer, r *http.Request) ([]preparedLayer, bool) {
	r = l.routeRequest(r)
	rs := l.rules.Load()
	pre := make([]preparedLayer, len(l.layers))
	// The Limiter's rules, every layer's (those that do not apply to r
	// too), so that Limiters with different rule sets never share records.
	io.WriteString(h, l.ruleDigest(rs))
	var (
		rc       routeOnce
		defCost  int64
		haveCost bool
		b        []byte
	)
	for i := range l.layers {
		ly := &l.layers[i]
		if ly.routes != nil {
			if route, err := rc.get(r); err != nil || !containsString(ly.routes, route) {
				continue
			}
		}
		key, err := ly.key(r)
		pre[i] = preparedLayer{read: true, key: key, err: err}
		if err != nil && errors.Is(err, ErrNoKey) && ly.ifNoKey != NoKeyRefuse &&
			!errors.Is(err, ErrNoRoute) && !errors.Is(err, ErrConfig) {
			continue // skipped, as deciding r skips it
		}
		if err != nil || key == "" {
			return pre, false
		}
		cost := l.layerCost(ly, r, &defCost, &haveCost)
		pre[i].costRead, pre[i].cost = true, cost
		b = strconv.AppendInt(b[:0], int64(i), 10)
		b = append(b, 0)
		b = append(b, key...)
		b = append(b, 0)
		b = strconv.AppendInt(b, cost, 10)
		b = append(b, 0)
		h.Write(b)
	}
	return pre, true
}

// ruleDigest returns a digest of l's rules under rs: every layer's name,
// policy identity, MaxDelay and routes (as a set), computed once per rule
// set.
func (l *Limiter) ruleDigest(rs *ruleSet) string {
	if d := rs.scopeDigest.Load(); d != nil {
		return *d
	}
	h := sha256.New()
	for i := range l.layers {
		routes := slices.Compact(slices.Sorted(slices.Values(l.layers[i].routes)))
		p := rs.rules[i].policy
		fmt.Fprintf(h, "%q %q %d %q\n", l.layers[i].name, p.Identity(), p.MaxDelay(), routes)
	}
	d := string(h.Sum(nil))
	rs.scopeDigest.Store(&d)
	return d
}

// encodeHeaders serialises the rate-limit headers of a decision as
// "Name: value" lines.
func encodeHeaders(h http.Header) []byte {
	var b strings.Builder
	for name, vs := range h {
		for _, v := range vs {
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	return []byte(b.String())
}

// replayHeaders sets the headers encoded in rec on h, replacing earlier
// values (an outer Limiter's), as a fresh decision does.
func replayHeaders(h http.Header, rec []byte) {
	set := make(map[string]bool, 8)
	for _, line := range strings.Split(string(rec), "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if !ok || name == "" {
			continue
		}
		if !set[name] {
			set[name] = true
			h[name] = nil
		}
		h[name] = append(h[name], v)
	}
}

// newToken returns a random claim token.
func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// MemoryReplayStore is the in-memory [ReplayStore]: at most a fixed number of
// keys in an LRU (github.com/hashicorp/golang-lru/v2), expired by a Clock.
// When it is full, the least recently used key is forgotten: a retry of a
// forgotten key is charged again. A claim that is released (its request
// refused, or not decided) puts back the record its arrival forgot, so
// that requests charged nothing cannot make the store forget others'. It
// is safe for concurrent use.
type MemoryReplayStore struct {
	mu    sync.Mutex
	lru   *simplelru.LRU[string, replayEntry]
	clock core.Clock
	// evicted is the key and entry the LRU's last Add evicted, while a
	// claim is added; guarded by mu.
	evictedKey string
	evicted    *replayEntry
}

var _ ReplayStore = (*MemoryReplayStore)(nil)

type replayEntry struct {
	token   string // non-empty while claimed
	rec     []byte
	replays int   // times rec was replayed
	expires int64 // Unix ns
	// For a claim, the record its arrival evicted from a full store, put
	// back if the claim is released.
	victimKey string
	victim    *replayEntry
}

// NewMemoryReplayStore returns a MemoryReplayStore holding at most capacity
// keys (DefaultReplayStoreCapacity when capacity <= 0), expiring them on
// clock (core.SystemClock() when nil).
func NewMemoryReplayStore(capacity int, clock core.Clock) *MemoryReplayStore {
	if capacity <= 0 {
		capacity = DefaultReplayStoreCapacity
	}
	if clock == nil {
		clock = core.SystemClock()
	}
	m := &MemoryReplayStore{clock: clock}
	m.lru, _ = simplelru.NewLRU[string, replayEntry](capacity, func(k string, e replayEntry) {
		m.evictedKey, m.evicted = k, &e
	}) // capacity > 0: no error
	return m
}

// Len returns the number of keys held, expired ones included until they are
// met or evicted.
func (m *MemoryReplayStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}

// Claim implements ReplayStore.
func (m *MemoryReplayStore) Claim(_ context.Context, key string, hold time.Duration, maxReplays int) ([]byte, string, error) {
	now := m.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.lru.Get(key); ok && e.expires > now {
		if e.token != "" {
			return nil, "", ErrReplayPending
		}
		if e.replays < maxReplays {
			e.replays++
			m.lru.Add(key, e)
			return e.rec, "", nil
		}
	}
	tok := newToken()
	m.evicted = nil
	claim := replayEntry{token: tok, expires: addNanos(now, hold)}
	m.lru.Add(key, claim)
	if v := m.evicted; v != nil && v.token == "" && v.expires > now {
		// A record the claim's arrival forgot: kept with the claim, and
		// put back if the claim is released.
		claim.victimKey, claim.victim = m.evictedKey, v
		m.lru.Add(key, claim) // an update: evicts nothing
	}
	m.evicted = nil
	return nil, tok, nil
}

// Commit implements ReplayStore.
func (m *MemoryReplayStore) Commit(_ context.Context, key, token string, rec []byte, ttl time.Duration) error {
	now := m.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.lru.Peek(key); ok && e.token == token && e.expires > now {
		m.lru.Add(key, replayEntry{rec: rec, expires: addNanos(now, ttl)})
	}
	return nil
}

// Release implements ReplayStore.
func (m *MemoryReplayStore) Release(_ context.Context, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.lru.Peek(key); ok && e.token == token {
		m.lru.Remove(key)
		if v := e.victim; v != nil && v.expires > m.clock.Now().UnixNano() && !m.lru.Contains(e.victimKey) {
			m.lru.Add(e.victimKey, *v) // into the place the claim frees
		}
	}
	return nil
}
