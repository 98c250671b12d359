package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// In-flight slots on Redis.
//
// InFlight is a core.SlotStore (the store of the concurrency layers of
// ratelimit.Layer.InFlight) shared by every process using the same Redis and
// Prefix. Each key is a sorted set of the slot ids held, scored by their
// expiry in Unix milliseconds:
//
//	Prefix + name + ":" + key   (escaped as the Store's keys are)
//
// Acquiring is one Lua script over the keys of one request: for each key it
// drops the members whose expiry has passed and counts the rest; if every
// key is below its limit it adds the request's slot id to each, scored now +
// Expiry, and sets each key to expire with its latest member. A process
// renews the slots it holds every RenewEvery (one goroutine per InFlight),
// so a request may run for any time; a process that dies (or loses Redis)
// stops renewing, and its slots are free again at most Expiry after their
// last renewal. Releasing removes the slot id from its keys. Every
// acquisition has its own id (random per InFlight, then a counter), so a
// release removes only its own slot and a second release removes nothing:
// a slot is never given back twice, even when its expiry already freed it
// and another request took the place.
//
// Time is the Redis server's clock (TIME) unless InFlightConfig.Clock is
// set, for tests. On one node the keys of one request are acquired in one
// script; on a Redis Cluster when they share a hash slot, on a Ring (or a
// client of unknown topology) when they share a hash tag; otherwise one key
// after another, giving back those taken if a later one refuses (a
// concurrent request may then be refused by a slot held for that moment;
// none is ever admitted beyond a limit).
//
// A failing call is a backend error (the Limiter's fail policy applies).
// Acquire and each renewal are bounded by Timeout also for a client
// without ContextTimeoutEnabled (the call is then abandoned at the
// Timeout). An
// acquisition whose outcome is unknown (a timeout after the script was
// sent) is removed by a best-effort release of its id (after the abandoned
// call has ended), and otherwise expires.
type InFlight struct {
	client   redis.UniversalClient
	prefix   string
	expiry   time.Duration
	renew    time.Duration
	timeout  time.Duration
	clock    core.Clock
	place    placement  // which keys one script may take together
	ring     *ringGuard // a Ring's: keys moved off a shard that is down
	ctxBound bool       // the client bounds its I/O by the context's deadline
	idBase   string
	seq      atomic.Uint64
	lost     atomic.Uint64
	failures atomic.Uint64

	mu     sync.Mutex
	held   map[uint64]*heldSlot // requires mu held
	closed bool                 // requires mu held

	forgets chan struct{}  // a slot per background release after an error
	calls   sync.WaitGroup // acquisitions and renewals abandoned at the Timeout, until they end

	stop chan struct{}
	done chan struct{}
}

// maxForgets bounds the background releases after failed acquisitions.
const maxForgets = 64

// heldSlot is one acquisition the renewer keeps alive.
type heldSlot struct {
	keys []string
	id   string
}

// Defaults of an InFlightConfig.
const (
	// DefaultInFlightPrefix is the key prefix of an InFlightConfig without
	// one: DefaultPrefix followed by "%inflight:", which no key of a
	// Store's rule begins with (a rule's name is escaped, and "%" only
	// starts an escape, %25, %3A, %7B or %7D), so that the in-flight keys
	// never meet a Store's under DefaultPrefix, whatever the rule and
	// layer names.
	DefaultInFlightPrefix = DefaultPrefix + "%inflight:"
	// DefaultSlotExpiry is the Expiry of an InFlightConfig without one.
	DefaultSlotExpiry = 30 * time.Second
	// DefaultInFlightTimeout bounds each call of an InFlightConfig without
	// a Timeout.
	DefaultInFlightTimeout = time.Second
)

// InFlightConfig configures an InFlight. A nil *InFlightConfig means every
// default.
type InFlightConfig struct {
	// Prefix starts every Redis key. Do not give a Store's Prefix (a rate
	// policy and an in-flight layer of the same name and key would then
	// share a Redis key). The default value is DefaultInFlightPrefix,
	// "ratelimit:%inflight:", apart from every Store key under the Store's
	// default prefix (a rule's name is escaped, and "%" only starts an
	// escape, so not even a rule named "inflight" reaches it).
	Prefix string

	// Expiry is how long a slot stays held without renewal: the longest a
	// process that dies keeps its slots. The default value is
	// DefaultSlotExpiry, 30s. It must be at least 10ms.
	Expiry time.Duration

	// RenewEvery is how often the slots held are renewed (to now +
	// Expiry); it must be shorter than Expiry. The default value is a third
	// of Expiry.
	RenewEvery time.Duration

	// Timeout bounds each call to Redis when the client has
	// ContextTimeoutEnabled; Acquire, on the request's path, and each
	// renewal are bounded by it without that too (see InFlight). The
	// default value is DefaultInFlightTimeout, 1s.
	Timeout time.Duration

	// Clock, if set, gives the time slots expire by instead of the Redis
	// server's clock, for tests with a fake clock. Every process sharing
	// the keys must then share the clock. The default value is nil: the
	// server's TIME.
	Clock core.Clock
}

// NewInFlight returns an InFlight over client and starts its renewer; stop
// it with Close.
func NewInFlight(client redis.UniversalClient, cfg *InFlightConfig) (*InFlight, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewInFlight: nil client")
	}
	var c InFlightConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultInFlightPrefix
	}
	if c.Expiry == 0 {
		c.Expiry = DefaultSlotExpiry
	}
	if c.Expiry < 10*time.Millisecond {
		return nil, fmt.Errorf("redisstore: NewInFlight: Expiry %v is below 10ms", c.Expiry)
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.Expiry / 3
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.Expiry {
		return nil, fmt.Errorf("redisstore: NewInFlight: RenewEvery %v must be positive and below Expiry %v", c.RenewEvery, c.Expiry)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultInFlightTimeout
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("redisstore: NewInFlight: negative Timeout %v", c.Timeout)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("redisstore: NewInFlight: %w", err)
	}
	place, ctxBound, _ := clientPlacement(client)
	f := &InFlight{
		client:   client,
		prefix:   c.Prefix,
		expiry:   c.Expiry,
		renew:    c.RenewEvery,
		timeout:  c.Timeout,
		clock:    c.Clock,
		place:    place,
		ctxBound: ctxBound,
		idBase:   hex.EncodeToString(b[:]) + ":",
		held:     make(map[uint64]*heldSlot),
		forgets:  make(chan struct{}, maxForgets),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if r, ok := client.(*redis.Ring); ok {
		f.ring = newRingGuard(r)
	}
	go f.renewer()
	return f, nil
}

var _ core.SlotStore = (*InFlight)(nil)

// ErrInFlightClosed is returned by InFlight.Acquire after Close.
var ErrInFlightClosed = errors.New("redisstore: in-flight store is closed")

// Acquire implements core.SlotStore. The release function it returns runs
// one script per group of keys that one script can take (see InFlight),
// with a Timeout of its own (not ctx, which may have ended with the
// request; bounding it needs ContextTimeoutEnabled); if that fails, the
// slot frees at its expiry.
func (f *InFlight) Acquire(ctx context.Context, reqs []core.SlotRequest, out []core.SlotDecision) (func(), error) {
	if err := core.CheckSlots(reqs, out); err != nil {
		return nil, err
	}
	// Counted from before the closed check, so that Close waits for this
	// call and what it leaves running (see runScriptWithin).
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, ErrInFlightClosed
	}
	f.calls.Add(1)
	f.mu.Unlock()
	defer f.calls.Done()
	keys := make([]string, len(reqs))
	for i := range reqs {
		keys[i] = redisKey(f.prefix, escapeName(reqs[i].Name), "", &core.Request{Key: reqs[i].Key})
	}
	if f.ring != nil {
		if err := f.ring.check(keys); err != nil && !errors.Is(err, ErrRingChanged) {
			return nil, fmt.Errorf("redisstore: in-flight acquire: %w", err)
		}
	}
	seq := f.seq.Add(1)
	id := f.idBase + strconv.FormatUint(seq, 10)
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	ok, err := f.acquireKeys(ctx, keys, id, reqs, out)
	if err != nil {
		// A script may have run: remove the slot id it may have added (and
		// those of the keys taken before it), without holding the request
		// up, at most maxForgets at a time (beyond that, or if this fails
		// too, the slot expires). A call abandoned at the Timeout also
		// removes its own once it has ended, in case it lands after this.
		select {
		case f.forgets <- struct{}{}:
			go func() {
				defer func() { <-f.forgets }()
				f.releaseKeys(keys, id)
			}()
		default:
		}
		return nil, fmt.Errorf("redisstore: in-flight acquire: %w", err)
	}
	if !ok {
		return nil, nil
	}
	h := &heldSlot{keys: keys, id: id}
	f.mu.Lock()
	f.held[seq] = h
	f.mu.Unlock()
	var once atomic.Bool
	return func() {
		if once.Swap(true) {
			return
		}
		f.mu.Lock()
		delete(f.held, seq)
		f.mu.Unlock()
		f.releaseKeys(keys, id)
	}, nil
}

// acquireKeys takes one slot of each key, all or nothing, and fills out.
func (f *InFlight) acquireKeys(ctx context.Context, keys []string, id string, reqs []core.SlotRequest, out []core.SlotDecision) (bool, error) {
	if f.together(keys) {
		return f.acquireGroup(ctx, keys, id, reqs, out)
	}
	for i := range keys {
		ok, err := f.acquireGroup(ctx, keys[i:i+1], id, reqs[i:i+1], out[i:i+1])
		if err != nil {
			return false, err // Acquire gives back the keys taken, in the background
		}
		if !ok {
			if i > 0 {
				f.releaseKeys(keys[:i], id)
				for j := 0; j < i; j++ {
					out[j].InFlight--
				}
			}
			for j := i + 1; j < len(keys); j++ {
				f.count(ctx, keys[j], id, reqs[j], &out[j])
			}
			return false, nil
		}
	}
	return true, nil
}

// count writes to out the decision for r, whose key is key, after a key
// before it refused the batch: the slots key holds, read with the acquire
// script asking for none (a limit of 0 takes nothing), so that the
// decision says what the key holds, as core.SlotTable's do, never that an
// unread key is free. A failed read reports the key full.
func (f *InFlight) count(ctx context.Context, key, id string, r core.SlotRequest, out *core.SlotDecision) {
	var d [1]core.SlotDecision
	if _, err := f.acquireGroup(ctx, []string{key}, id, []core.SlotRequest{{Name: r.Name, Key: r.Key}}, d[:]); err != nil {
		*out = core.SlotDecision{Limit: r.Limit, InFlight: r.Limit}
		return
	}
	*out = core.SlotDecision{Allowed: d[0].InFlight < r.Limit, Limit: r.Limit, InFlight: d[0].InFlight}
}

// together reports whether one script can take keys: any keys on one node
// (or a failover client), keys of one hash slot on a Cluster, keys of one
// hash tag on a Ring or an unknown client (which may shard by it).
func (f *InFlight) together(keys []string) bool {
	switch f.place {
	case placeOne:
		return true
	case placeSlot:
		return sameSlot(keys)
	}
	for i := 1; i < len(keys); i++ {
		if t := hashTagOf(keys[0]); t == "" || hashTagOf(keys[i]) != t {
			return false
		}
	}
	return true
}

// sameSlot reports whether keys share one Redis Cluster hash slot.
func sameSlot(keys []string) bool {
	for i := 1; i < len(keys); i++ {
		if slot(keys[i]) != slot(keys[0]) {
			return false
		}
	}
	return true
}

// acquireGroup runs the acquire script over keys, which share a slot.
func (f *InFlight) acquireGroup(ctx context.Context, keys []string, id string, reqs []core.SlotRequest, out []core.SlotDecision) (bool, error) {
	args := make([]any, 0, 3+len(reqs))
	args = append(args, f.nowArg(), f.expiry.Milliseconds(), id)
	for i := range reqs {
		args = append(args, reqs[i].Limit)
	}
	// Abandoned at the Timeout by a client that does not bound its I/O by
	// it, the call gives back the slot it may take once it has ended.
	v, err := runScriptWithin(ctx, f.client, f.ctxBound, &f.calls, slotAcquireLua, keys, args, func() { f.releaseKeys(keys, id) })
	if err != nil {
		return false, err
	}
	res, ok := v.([]any)
	if !ok || len(res) != len(keys)+1 {
		return false, fmt.Errorf("unexpected reply %T", v)
	}
	nums := make([]int64, len(res))
	for i := range res {
		if nums[i], ok = res[i].(int64); !ok {
			return false, fmt.Errorf("unexpected reply element %T", res[i])
		}
	}
	admitted := nums[0] == 1
	for i := range reqs {
		n := nums[i+1]
		out[i] = core.SlotDecision{Allowed: admitted || n < reqs[i].Limit, Limit: reqs[i].Limit, InFlight: n}
	}
	return admitted, nil
}

// nowArg is the time argument of the scripts: the Clock's Unix
// milliseconds, or "" for the server's TIME.
func (f *InFlight) nowArg() string {
	if f.clock == nil {
		return ""
	}
	return strconv.FormatInt(f.clock.Now().UnixMilli(), 10)
}

// releaseKeys removes slot id from keys, with a context of its own, one
// script per hash slot on a Cluster. A failure is counted (see Failures); the slot then expires.
func (f *InFlight) releaseKeys(keys []string, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	for _, g := range f.groups(keys) {
		if _, err := runScript(ctx, f.client, slotReleaseLua, g, []any{id}); err != nil {
			f.failures.Add(1)
		}
	}
}

// groups splits keys into runs that share a hash slot (one run off
// Cluster).
func (f *InFlight) groups(keys []string) [][]string {
	if f.together(keys) {
		return [][]string{keys}
	}
	gs := make([][]string, len(keys))
	for i := range keys {
		gs[i] = keys[i : i+1]
	}
	return gs
}

// renewer renews the held slots every RenewEvery until Close.
func (f *InFlight) renewer() {
	defer close(f.done)
	t := time.NewTicker(f.renew)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.renewAll()
		}
	}
}

// renewAll moves the expiry of every held slot to now + Expiry. A slot that
// already expired is not brought back (see Lost).
func (f *InFlight) renewAll() {
	type renewal struct {
		seq uint64
		h   *heldSlot
	}
	f.mu.Lock()
	hs := make([]renewal, 0, len(f.held))
	for seq, h := range f.held {
		hs = append(hs, renewal{seq, h})
	}
	f.mu.Unlock()
	// Renewals run renewConcurrency at a time: one round trip each, so a
	// process holding many slots still renews them all well within the
	// expiry.
	// Once Close has begun, no further renewal starts.
	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	for _, r := range hs {
		select {
		case sem <- struct{}{}:
		case <-f.stop:
		}
		if f.stopping() {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f.renewOne(r.seq, r.h)
		}()
	}
	wg.Wait()
}

// stopping reports whether Close has begun.
func (f *InFlight) stopping() bool {
	select {
	case <-f.stop:
		return true
	default:
		return false
	}
}

// renewConcurrency is how many renewals renewAll runs at once.
const renewConcurrency = 16

// renewOne renews the slots of acquisition seq, h, within the Timeout
// (also for a client without ContextTimeoutEnabled: a call is then
// abandoned at the Timeout, and Close waits for it to end), starting no
// call once Close has begun. A slot the renewal did not find counts as
// lost only if the acquisition is still held afterwards: one released
// meanwhile (after the round's snapshot) was given back, not lost.
func (f *InFlight) renewOne(seq uint64, h *heldSlot) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	for _, g := range f.groups(h.keys) {
		if f.stopping() {
			return
		}
		v, err := runScriptWithin(ctx, f.client, f.ctxBound, &f.calls, slotRenewLua, g, []any{f.nowArg(), f.expiry.Milliseconds(), h.id}, nil)
		if err != nil {
			f.failures.Add(1)
			continue
		}
		if n, ok := v.(int64); ok && n < int64(len(g)) && f.holds(seq) {
			f.lost.Add(uint64(int64(len(g)) - n))
		}
	}
}

// holds reports whether acquisition seq is held (acquired and not
// released).
func (f *InFlight) holds(seq uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.held[seq]
	return ok
}

// Lost returns the number of held slots the renewer found already expired
// (a renewal came too late, such as after Redis was unreachable for
// Expiry): their requests ran on without counting against their limit.
func (f *InFlight) Lost() uint64 { return f.lost.Load() }

// Failures returns the number of release and renewal calls that failed.
// A slot whose release failed frees at its expiry.
func (f *InFlight) Failures() uint64 { return f.failures.Load() }

// Held returns the number of acquisitions this InFlight holds (acquired and
// not yet released).
func (f *InFlight) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

// Close stops the renewer (a renewal round under way starts no further
// renewal), waits for the renewals under way, for the releases started
// after failed acquisitions and for the acquisitions and renewals
// abandoned at the Timeout (which end by the client's own read timeout),
// and makes Acquire return ErrInFlightClosed. It gives back
// no slot: release functions still work, and slots not released
// free at their expiry, as a dead process's do. Close the InFlight after
// the server has stopped serving (http.Server.Shutdown waits for the
// handlers, which release their slots). Close is idempotent.
func (f *InFlight) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	close(f.stop)
	<-f.done
	f.calls.Wait()         // the Acquires past their closed check, and the calls they abandoned
	for range maxForgets { // then the background releases they started
		f.forgets <- struct{}{}
	}
	return nil
}

// The scripts. ARGV[1] is the time in Unix ms, or "" for the server's TIME.

const nowLua = `
local now = tonumber(ARGV[1])
if not now then
  -- before Redis 5, a script writes after TIME only with effects
  -- replication, asked for first (as the Store's script does)
  if redis.REDIS_VERSION_NUM == nil and redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function settle(k)
  local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  if top[2] then
    redis.call('PEXPIRE', k, math.max(tonumber(top[2]) - now, 1))
  end
end
`

var (
	// slotAcquireLua: ARGV = now, expiry ms, slot id, then the limit of
	// each key. Returns {1 if admitted else 0, slots held per key}. The
	// slots held are counted before anything is written, and an admission
	// writes its ZADD first: out of memory (maxmemory, noeviction), Redis
	// refuses a script's first write only if it may grow memory, as ZADD
	// may and ZREMRANGEBYSCORE may not, and lets every write after it
	// through.
	slotAcquireLua = newLua(nowLua + `
local ttl = tonumber(ARGV[2])
local id = ARGV[3]
local res = {1}
for i, k in ipairs(KEYS) do
  local n = redis.call('ZCARD', k) - redis.call('ZCOUNT', k, '-inf', now)
  res[i + 1] = n
  if n >= tonumber(ARGV[3 + i]) then res[1] = 0 end
end
for i, k in ipairs(KEYS) do
  if res[1] == 1 then
    redis.call('ZADD', k, now + ttl, id)
    res[i + 1] = res[i + 1] + 1
  end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  if res[1] == 1 then settle(k) end
end
return res
`)

	// slotRenewLua: ARGV = now, expiry ms, slot id. Moves the expiry of a
	// slot still held; returns the number of keys it was renewed in.
	slotRenewLua = newLua(nowLua + `
local exp = now + tonumber(ARGV[2])
local id = ARGV[3]
local kept = 0
for _, k in ipairs(KEYS) do
  local s = redis.call('ZSCORE', k, id)
  if s and tonumber(s) > now then
    redis.call('ZADD', k, 'XX', exp, id)
    settle(k)
    kept = kept + 1
  end
end
return kept
`)

	// slotReleaseLua: ARGV = slot id. Returns the number of slots removed.
	slotReleaseLua = newLua(`
local n = 0
for _, k in ipairs(KEYS) do
  n = n + redis.call('ZREM', k, ARGV[1])
end
return n
`)
)

// noRetryAny is a script call go-redis must not send twice (see noRetryCmd).
type noRetryAny struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (noRetryAny) NoRetry() bool { return true }

// runScript runs s with EVALSHA, then EVAL on NOSCRIPT, never retried.
func runScript(ctx context.Context, c redis.UniversalClient, s *luaScript, keys []string, args []any) (any, error) {
	call := func(verb, body string) (any, error) {
		a := make([]any, 0, 3+len(keys)+len(args))
		a = append(a, verb, body, len(keys))
		for _, k := range keys {
			a = append(a, k)
		}
		a = append(a, args...)
		cmd := redis.NewCmd(ctx, a...)
		_ = c.Process(ctx, noRetryAny{cmd})
		return cmd.Result()
	}
	v, err := call("evalsha", s.hash)
	if err != nil && isNoScript(err) {
		v, err = call("eval", s.src)
	}
	return v, err
}

// runScriptWithin is runScript bounded by ctx also for a client that does
// not bound its I/O by the context's deadline (ctxBound false: go-redis
// without ContextTimeoutEnabled; see callWithin): an abandoned call is
// counted in calls, if not nil, until it ends, and then runs after it.
func runScriptWithin(ctx context.Context, c redis.UniversalClient, ctxBound bool, calls *sync.WaitGroup, s *luaScript, keys []string, args []any, then func()) (any, error) {
	var track func() func()
	if calls != nil {
		track = func() func() { calls.Add(1); return calls.Done }
	}
	return callWithin(ctx, ctxBound, track, func(ctx context.Context) (any, error) {
		return runScript(ctx, c, s, keys, args)
	}, then)
}

// luaScript is a script's source and SHA1.
type luaScript struct{ src, hash string }

func newLua(src string) *luaScript {
	return &luaScript{src: src, hash: redis.NewScript(src).Hash()}
}
