package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Defaults of Config.
const (
	// DefaultPrefix is the key prefix of a Config without one.
	DefaultPrefix = "ratelimit:"
	// DefaultTimeout bounds each decision of a Config without a Timeout.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultQueueTimeout bounds the wait for a connection of a Config
	// without a QueueTimeout.
	DefaultQueueTimeout = time.Second
	// ClientTimeSlack is added to every key's expiry in ClientTime mode
	// (see Config.ClientTime).
	ClientTimeSlack = time.Minute
)

var (
	// ErrUnsupportedAlgorithm is returned (wrapped, naming the policy) for a
	// request whose policy uses an algorithm other than the five built into
	// core: the Redis store runs its own Lua implementation of each and
	// cannot run Go code. Nothing is charged. It wraps
	// core.ErrUnsupportedPolicy, and CheckPolicy returns it, so that
	// Limiters refuse such a policy when they are built.
	ErrUnsupportedAlgorithm error = &unsupportedError{"redisstore: algorithm not supported by the Redis store"}

	// ErrUnsupportedRule is returned (wrapped, naming the policy) for a
	// request whose policy's Window or MaxDelay is not a whole number of
	// microseconds: the store computes in microseconds. Nothing is charged.
	// It wraps core.ErrUnsupportedPolicy, as ErrUnsupportedAlgorithm does.
	ErrUnsupportedRule error = &unsupportedError{"redisstore: rule not supported by the Redis store"}

	// ErrTimeOutOfRange is returned in ClientTime mode for a time before
	// MinTime or after MaxTime. Nothing is charged. It wraps
	// core.ErrTimeOutOfRange: the Store contract lets a store refuse an
	// instant it cannot represent.
	ErrTimeOutOfRange = fmt.Errorf("redisstore: time outside the range the Redis store supports: %w", core.ErrTimeOutOfRange)

	// ErrUnavailable is returned, when no Fallback is set, while the
	// circuit breaker is open (or half-open with its probe decisions
	// already in flight): Redis failed recently and is not asked.
	ErrUnavailable = errors.New("redisstore: Redis unavailable (circuit breaker open)")

	// ErrOverloaded is returned, when no Fallback is set, by a decision
	// that waited longer than Config.QueueTimeout for a connection.
	ErrOverloaded = errors.New("redisstore: too many decisions waiting for a connection")
)

// maxNowMicros is the largest time, in Unix microseconds, that keeps every
// time the script computes (now plus a refill time and a MaxDelay, each at
// most core.MaxWindow) below 2^53, where Lua numbers are exact integers.
const maxNowMicros = 1<<53 - 2*int64(core.MaxWindow/time.Microsecond)

// MaxTime is the latest time the store decides at: Unix microsecond
// 2^53 - 2 x core.MaxWindow, in the year 2155.
var MaxTime = time.UnixMicro(maxNowMicros).UTC()

// MinTime is the earliest time the store decides at in ClientTime mode:
// Unix microsecond -(2^53 - 2 x core.MaxWindow), in the year 1784. Times
// before it (such as the zero time.Time, the year 1) are refused with
// ErrTimeOutOfRange; from MinTime on, a key never seen is whole.
var MinTime = time.UnixMicro(-maxNowMicros).UTC()

// Config configures a Store. A nil *Config means the defaults.
type Config struct {
	// Prefix starts every Redis key the store writes; see the package
	// documentation for the key layout. Give each application (or each
	// test) its own. The default value is DefaultPrefix, "ratelimit:".
	Prefix string

	// ClientTime makes the store decide at the time passed to Take rather
	// than at the Redis server's clock (TIME). It is meant for tests and
	// for deterministic replays: times are truncated to whole microseconds,
	// and keys live, by Redis's own clock, for as long as their state
	// matters in the caller's timeline plus ClientTimeSlack, so a fake clock
	// that is slower than real time does not lose state. With several
	// processes it makes their clock skew part of every decision: callers
	// whose clocks are more than core.ClockTolerance apart are each a
	// clock step back for the others, and may admit well beyond the quota
	// (a fixed window's count is dropped each time they alternate). The
	// default value, false, reads the server's clock once per decision (per
	// Redis node in a Cluster) and ignores the time passed to Take.
	ClientTime bool

	// HashTag, if set, returns the Redis Cluster hash tag of a request from
	// its policy name and key; "" means none. Requests with equal tags share
	// a hash slot, so a batch whose requests all have the same tag is
	// decided in one atomic call on a Cluster. The tag is part of the key
	// (see the package documentation), so it must depend only on the policy
	// name and the key, as its signature enforces: the same quota must map
	// to the same Redis key in every batch. TagByKey tags every policy's
	// state of a key alike. The default value, nil, tags nothing; Cluster
	// batches spanning several slots are then decided as the package
	// documentation describes.
	HashTag func(policyName, key string) string

	// Timeout bounds each Take's calls to Redis. Both phases of a batch
	// spanning several Cluster slots (or Ring shards) count against it;
	// two steps get a Timeout of their own, so that Take may last longer:
	// on a Cluster whose client has not loaded its slot map, the map's
	// lookup (up to twice Timeout), and the refund of the groups such a
	// batch charged when another group refused it or failed (a refund must
	// not be starved by the deadline the charge used up: up to three times
	// Timeout with both). A decision that
	// times out is an error (or goes to the Fallback) and is never re-sent:
	// the script may have run. A negative value sets no bound of the
	// store's own. The default value is DefaultTimeout, 50ms.
	Timeout time.Duration

	// QueueTimeout bounds how long a decision waits for a free connection
	// when more decisions are running than the client has connections
	// (its PoolSize, or its MaxActiveConns when that is lower; a
	// single-node or failover client): the store lets at most that many
	// decisions talk to Redis at once, and the others wait
	// their turn, in order, before their Timeout starts. So a burst (a cold
	// start, say) is paced by the pool instead of timing out in it and
	// opening the breaker: the wait says nothing about Redis's health and
	// never counts against the breaker. A decision that waits longer fails
	// with ErrOverloaded (or goes to the Fallback). A negative value waits
	// only for the caller's context. The default value is
	// DefaultQueueTimeout, 1s.
	QueueTimeout time.Duration

	// Pipeline chooses how the decisions of concurrent Takes share round
	// trips, on a single-node or failover client (*redis.Client). Each
	// decision is still one script call of its own, atomic and never
	// re-sent, and one whose context ends before its pipeline leaves is not
	// sent at all. Only Take's decisions are pipelined.
	//
	// The default value, 0, pipelines adaptively. A decision that finds
	// fewer than 4 script calls or pipelines in flight is sent at once,
	// alone. Beyond that, it joins the next pipeline only while calls are
	// coming back at least every 100µs on average, the last one at most
	// 100µs ago: then the server is busy and a slot is about to come free.
	// The first slot to come free sends every decision waiting as one
	// pipeline (at most 128 calls; one write and one read for the lot), and
	// a pipeline that has waited 100µs without one goes out on a connection
	// of its own. Otherwise, as with a distant server and few callers, each
	// decision goes out at once, alone. So a lone caller's latency does not
	// change, a decision waits at most about 100µs for a pipeline, and under
	// load Redis is spared most of its per-command network work, its main
	// cost per decision, and decides more per second (BENCHMARKS.md
	// measures both). The default needs a client with ContextTimeoutEnabled
	// (below); on one without it, and on a Cluster or Ring client, it sends
	// every decision alone.
	//
	// A positive value pipelines always: at most Pipeline script calls or
	// pipelines are in flight at once, and a decision that finds them all
	// busy waits, however long, until one is over, then goes out with every
	// other decision waiting. Two to four is a good value for one server;
	// keep it well below the client's PoolSize, since at most PoolSize
	// decisions talk to Redis at once (QueueTimeout). A negative value sends
	// every decision alone, as a Cluster client does.
	//
	// A positive value needs a single-node or failover client; New returns an
	// error for any other: a pipeline spanning several nodes waits for the
	// slowest, so one stalled master would stall every master's decisions.
	// Waiting for a pipeline counts against a decision's Timeout (and a
	// timeout there against the breaker: Redis is not keeping up), and a
	// failed pipeline fails every decision it carries, counting once against
	// the breaker: one round trip failed (with ContextTimeoutEnabled, a
	// pipeline that outlasts its decisions' deadlines too; without it, each
	// decision that times out counts). A pipeline's I/O is bounded by the
	// latest deadline of its decisions when the client has
	// ContextTimeoutEnabled, which pipelining needs even more than single
	// calls do: without it, a pipeline stuck on a dead connection holds its
	// decisions until the client's ReadTimeout (and with a positive Pipeline,
	// its slot, so that the decisions queued behind it time out). Its commands
	// carry a context of their own to the client's hooks.
	Pipeline int

	// Breaker configures the circuit breaker. The default value, nil, means
	// a breaker with BreakerConfig's defaults.
	Breaker *BreakerConfig

	// Fallback, if set, decides while Redis is unavailable: on a backend
	// error, a timeout, or while the breaker is open, Take returns the
	// Fallback's decision (made at the time passed to Take) instead of an
	// error. A core.MemoryStore is the usual choice. Its state is local:
	// N instances falling back admit up to N times the quota, and what they
	// admit is not charged in Redis. The default value, nil, returns the
	// error, and the caller applies its fail policy (the HTTP middleware
	// fails open or closed).
	//
	// After a timeout the script may have run in Redis and charged: the
	// request is then charged twice, once in Redis and once in the
	// Fallback, at most its cost in each (the safe direction: an extra
	// refusal, never an extra admission). Errors of a caller whose own
	// context ended (IsCallerGone) never go to the Fallback.
	//
	// The Fallback is the last resort: a *Store with a Fallback of its own
	// is refused by New (a refund of a charge its Fallback made could not
	// be told from one of its Redis, so it would go to a Redis that never
	// saw the charge).
	Fallback core.Store

	// Observer receives, through ObserveError, the backend errors the store
	// does not return: those hidden by deciding with the Fallback, and
	// failures to refund a refused batch spanning several Cluster slots.
	// Errors Take returns go to the caller (a core.Limiter reports them to
	// its own Observer), so no error is reported twice. The default value
	// is none.
	Observer core.Observer

	// OnStateChange, if set, is called when the circuit breaker changes
	// state. It is called synchronously, with the breaker's lock held: it
	// must be fast and must not call the Store. The default value is none.
	OnStateChange func(from, to BreakerState)
}

// TagByKey is a Config.HashTag that tags a request by its key, so every
// policy's state of one key (a client IP limited per second and per hour,
// say) shares a Cluster slot and a batch of them is one atomic call.
func TagByKey(_, key string) string { return key }

// Store is a core.Store that keeps per-key state in Redis (a single node,
// Sentinel, or Cluster, through a go-redis v9 client the caller builds and
// owns), so that a fleet of processes shares one quota per key. Each
// decision is one Lua script call: one round trip, atomic on the server,
// deciding exactly like core.MemoryStore (see the package documentation
// for the conditions and for batches spanning several Cluster slots).
//
// It is safe for concurrent use and holds no goroutine of its own; closing
// the client is the caller's business.
type Store struct {
	client       redis.UniversalClient
	place        placement
	ctxBound     bool // the client bounds its I/O by the context's deadline
	poolArgs     bool // the client is go-redis's own: argBufs may be reused
	prefix       string
	clientTime   bool
	slack        int64 // milliseconds added to key expiries
	slackArg     any   // slack, boxed once
	hashTag      func(policyName, key string) string
	timeout      time.Duration
	fallback     core.Store
	observer     core.Observer
	breaker      *gobreaker.CircuitBreaker[struct{}] // the store's one breaker, unless perNode
	perNode      bool                                // a Cluster: one breaker per master (nodeBreakers)
	newBreaker   breakerFactory
	nodeBreakers sync.Map                    // master address -> *nodeBreaker
	breakerGen   atomic.Uint64               // the sweeps of NodeStates so far (see nodeBreaker)
	lastSweep    atomic.Int64                // Unix nanosecond of NodeStates' last sweep
	onChange     func(from, to BreakerState) // Config.OnStateChange
	deadlines    deadlines                   // Done channels of the decisions' timeouts
	gate         *gate                       // the running calls; closed by Close
	slots        chan struct{}               // one per connection of a single-node client; nil: no pacing
	pipe         *pipeliner                  // nil: each call sent alone (Config.Pipeline negative, or a Cluster or Ring client)
	ring         *ringGuard                  // a Ring's: keys moved off a shard that is down
	queueWait    time.Duration

	// betweenPhases, if set (by tests), runs between the check and the
	// charge of a batch spanning several slots.
	betweenPhases func()
	// script is the take script (takeLua; tests run variants of it).
	script *boxedScript
}

var _ core.Store = (*Store)(nil)

// placement says which requests one script call may decide together.
type placement uint8

const (
	placeOne  placement = iota // one server: any keys
	placeSlot                  // Redis Cluster: keys of one hash slot
	placeTag                   // unknown topology: keys with equal hash tags
)

// clientPlacement returns where client puts the keys of one script call
// (placeOne for a single node or a failover client, placeSlot for a
// Cluster, placeTag for a Ring and any other client), whether it bounds its
// I/O by the context's deadline (ContextTimeoutEnabled), and whether it is
// one of go-redis's own clients.
func clientPlacement(client redis.UniversalClient) (p placement, ctxBound, known bool) {
	switch cl := client.(type) {
	case *redis.Client:
		return placeOne, cl.Options().ContextTimeoutEnabled, true
	case *redis.ClusterClient:
		return placeSlot, cl.Options().ContextTimeoutEnabled, true
	case *redis.Ring:
		return placeTag, cl.Options().ContextTimeoutEnabled, true
	}
	return placeTag, false, false
}

// New returns a Store over client configured by cfg (nil for the
// defaults). It does not contact Redis. The client is used as it is
// configured; see the package documentation for the go-redis options that
// matter (ContextTimeoutEnabled, timeouts, PoolSize).
func New(client redis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	s := &Store{
		client:     client,
		prefix:     c.Prefix,
		clientTime: c.ClientTime,
		slack:      1,
		hashTag:    c.HashTag,
		timeout:    c.Timeout,
		fallback:   c.Fallback,
		observer:   c.Observer,
		gate:       newGate(),
		queueWait:  c.QueueTimeout,
	}
	if s.queueWait == 0 {
		s.queueWait = DefaultQueueTimeout
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if s.clientTime {
		s.slack = int64(ClientTimeSlack / time.Millisecond)
	}
	s.slackArg = s.slack
	s.script = takeLua
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.place, s.ctxBound, s.poolArgs = clientPlacement(client)
	if r, ok := client.(*redis.Ring); ok {
		s.ring = newRingGuard(r)
	}
	if cl, ok := client.(*redis.Client); ok {
		if n := poolConns(cl.Options()); n > 0 {
			s.slots = make(chan struct{}, n)
		}
	}
	if fs, ok := c.Fallback.(*Store); ok && fs.fallback != nil {
		return nil, errors.New("redisstore: Config.Fallback is a Store with a Fallback of its own: refunds could not tell which of them made a charge; give the Fallback no Fallback")
	}
	switch {
	case c.Pipeline > 0:
		if s.place != placeOne {
			return nil, fmt.Errorf("redisstore: Config.Pipeline needs a single-node or failover client (*redis.Client), not a %T: a pipeline spanning several nodes waits for the slowest", client)
		}
		s.pipe = newPipeliner(client, s.gate, s.timeout, c.Pipeline, 0)
	case c.Pipeline == 0 && s.place == placeOne && s.ctxBound:
		s.pipe = newPipeliner(client, s.gate, s.timeout, autoLanes, autoLinger)
	}
	s.onChange = c.OnStateChange
	mk, err := newBreaker(c.Breaker, c.OnStateChange)
	if err != nil {
		return nil, err
	}
	if mk != nil {
		if s.place == placeSlot {
			s.perNode, s.newBreaker = true, mk
		} else {
			s.breaker = mk("")
		}
	}
	return s, nil
}

// errCallerGone marks a failure caused by the caller's own context ending,
// which says nothing about Redis's health.
var errCallerGone = errors.New("the caller's context ended")

// callerGone returns the error of a Take whose caller's context ended
// (cause, if not nil, is what the call to Redis reported): it matches
// ctx.Err() (context.Canceled or context.DeadlineExceeded), so the caller
// can tell "my client went away" from a Redis failure.
func callerGone(ctx context.Context, cause error) error {
	cerr := ctx.Err()
	if cerr == nil {
		cerr = context.DeadlineExceeded // the deadline passed; Done not yet closed
	}
	if cause == nil {
		return fmt.Errorf("redisstore: %w: %w", errCallerGone, cerr)
	}
	return fmt.Errorf("redisstore: %w: %w (%w)", errCallerGone, cerr, cause)
}

// IsCallerGone reports whether err, returned by Take, means the caller's
// own context ended (canceled, or its deadline passed before the store's
// Timeout) rather than that Redis failed. Such an error matches the
// context's error with errors.Is, does not count as a failure for the
// circuit breaker, is not decided by the Fallback and is not reported to
// the Observer: the client is gone, and Redis may be healthy.
func IsCallerGone(err error) bool { return errors.Is(err, errCallerGone) }

// Take implements core.Store. It validates the batch as every store must
// (core.CheckBatch), rejects policies the store cannot run
// (ErrUnsupportedAlgorithm, ErrUnsupportedRule) and, in ClientTime mode,
// times it cannot represent (ErrTimeOutOfRange), all before contacting
// Redis. Backend failures are wrapped with a "redisstore: " prefix, or
// decided by the Fallback if one is set.
func (s *Store) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	_, err := s.take(ctx, now, reqs, out)
	return err
}

// take is Take, also reporting whether the Fallback decided the batch
// (Redis failed): its charges are then the Fallback's, not Redis's, and a
// refund of them must not go to Redis.
func (s *Store) take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) (fellBack bool, err error) {
	if !s.gate.enter() {
		return false, ErrClosed
	}
	defer s.gate.leave()
	over, err := core.CheckBatch(reqs, out)
	if err != nil && !errors.Is(err, core.ErrCostExceedsCapacity) {
		return false, err
	}
	if len(reqs) == 0 {
		return false, nil
	}
	st := takeStates.Get().(*takeState)
	defer st.release()
	infos := st.infos[:len(reqs)]
	for i := range reqs {
		infos[i] = infoOf(reqs[i].Policy)
		if infos[i].err != nil {
			return false, infos[i].err
		}
	}
	var nowArg any = ""
	if s.clientTime {
		us := now.UnixMicro()
		if us < -maxNowMicros || us > maxNowMicros {
			return false, fmt.Errorf("%w: %v", ErrTimeOutOfRange, now)
		}
		nowArg = strconv.FormatInt(us, 10)
	}
	if ctx.Err() != nil {
		return false, callerGone(ctx, nil)
	}
	var start time.Time
	if s.fallback != nil && s.observer != nil {
		start = time.Now()
	}
	if err := s.takeRedis(ctx, st, nowArg, reqs, infos, over, out); err != nil {
		for i := range reqs {
			out[i] = core.Decision{Limit: reqs[i].Policy.Capacity(), Policy: reqs[i].Policy}
		}
		if s.fallback == nil || IsCallerGone(err) {
			return false, err
		}
		if s.observer != nil {
			s.observe(reqs, err, time.Since(start))
		}
		err = s.fallback.Take(ctx, now, reqs, out)
		for i := range reqs {
			out[i].Fallback = true // its charges, for refunds (Refund)
		}
		return true, err
	}
	if over >= 0 {
		r := &reqs[over]
		return false, fmt.Errorf("%w: %q capacity %d, cost %d", core.ErrCostExceedsCapacity, r.Policy.Name(), r.Policy.Capacity(), r.Cost)
	}
	return false, nil
}

func (s *Store) observe(reqs []core.Request, err error, lat time.Duration) {
	if s.observer == nil {
		return
	}
	ps := make([]*core.Policy, len(reqs))
	for i := range reqs {
		ps[i] = reqs[i].Policy
	}
	s.observer.ObserveError(core.ErrorEvent{Policies: ps, Err: err, Latency: lat})
}

// ringCheck returns an error wrapping ErrShardDown when the store's Ring
// would send one of keys, the keys of reqs, to another shard than its own,
// its own being down (see ringGuard.check), and nil otherwise or without a
// Ring; it reports ErrRingChanged, when it finds it, to the Observer.
func (s *Store) ringCheck(reqs []core.Request, keys []string) error {
	if s.ring == nil {
		return nil
	}
	err := s.ring.check(keys)
	if errors.Is(err, ErrRingChanged) {
		s.observe(reqs, err, 0)
		return nil
	}
	return err
}

// takeRedis decides the batch in Redis, through the breaker and within
// the timeout.
func (s *Store) takeRedis(ctx context.Context, st *takeState, nowArg any, reqs []core.Request, infos []*policyInfo, over int, out []core.Decision) error {
	if s.slots != nil {
		if err := s.acquire(ctx); err != nil {
			return err
		}
		defer func() { <-s.slots }()
	}
	s.keysOf(reqs, infos, st.keys[:len(reqs)])
	if err := s.ringCheck(reqs, st.keys[:len(reqs)]); err != nil {
		return err // before the breaker: the other shards answer
	}
	return s.throughBreaker(ctx, st.keys[:len(reqs)], func() error {
		return s.decideBounded(ctx, st, nowArg, reqs, infos, over, out)
	})
}

// throughBreaker runs f, a call to Redis about keys, through the store's
// breaker, or on a Cluster through the breakers of the masters holding
// keys (see throughNodes); while one is open f does not run, and the
// error is ErrUnavailable.
func (s *Store) throughBreaker(ctx context.Context, keys []string, f func() error) error {
	if s.perNode {
		return s.throughNodes(ctx, keys, f)
	}
	if s.breaker == nil {
		return f()
	}
	ran := false
	_, err := s.breaker.Execute(func() (struct{}, error) {
		ran = true
		return struct{}{}, f()
	})
	if !ran {
		return ErrUnavailable
	}
	return err
}

// throughNodes runs f, a call on a Cluster about keys, through the
// breakers of the masters holding keys: a batch on one master (the usual
// case) counts against that master's breaker alone, so a master that
// fails opens its own breaker and the keys of the others keep deciding. A
// batch spanning several masters goes through each of their breakers; the
// failure of one of its calls (a *groupFault, naming a key of the call)
// counts against the breaker of that key's master alone, and any other
// failure against each.
//
// The masters are looked up through a breaker of their own, the slot
// map's (""), within the store's Timeout (a client that has not loaded the
// Cluster's slot map loads it then): a lookup that fails fails the batch
// without a second wait for the decision, and while that breaker is open
// no lookup is made, so an unreachable Cluster costs a decision at most
// one Timeout, then nothing, and the Fallback answers it.
func (s *Store) throughNodes(ctx context.Context, keys []string, f func() error) error {
	var (
		nodes   [core.MaxBatch]string
		keyNode [core.MaxBatch]int // the index in nodes of each key's master
	)
	n := 0
	err := s.throughBreakers([]string{""}, func() error {
		var err error
		if n, err = s.mastersOf(ctx, keys, &nodes, &keyNode); err != nil {
			if ctx.Err() != nil {
				return callerGone(ctx, err)
			}
			return fmt.Errorf("redisstore: finding the masters of the batch's keys: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n < 2 {
		return s.throughBreakers(nodes[:n], f)
	}
	return s.throughBreakers(nodes[:n], f, func(err error) string {
		if gf := (*groupFault)(nil); errors.As(err, &gf) && gf.key >= 0 && gf.key < len(keys) {
			return nodes[keyNode[gf.key]]
		}
		return ""
	})
}

// groupFault is the failure of one script call of a batch that spans
// several calls (Cluster slots): key is the index of one of its requests,
// which tells whose master failed (see throughNodes).
type groupFault struct {
	key int
	err error
}

func (e *groupFault) Error() string { return e.err.Error() }
func (e *groupFault) Unwrap() error { return e.err }

// errOtherNode is what a master's breaker is told of a batch that failed
// on another master: neither a success nor a failure of its own.
var errOtherNode = errors.New("redisstore: another master failed")

// mastersOf writes the addresses of the masters holding keys, each once,
// to nodes, and the index in nodes of each key's master to keyNode, and
// returns their number, looked up within the store's Timeout
// (for a client without ContextTimeoutEnabled, the lookup is abandoned
// when the Timeout passes, as a decision is; see callWithin).
func (s *Store) mastersOf(ctx context.Context, keys []string, nodes *[core.MaxBatch]string, keyNode *[core.MaxBatch]int) (int, error) {
	cl := s.client.(*redis.ClusterClient)
	type masters struct {
		n     int
		nodes [core.MaxBatch]string
		of    [core.MaxBatch]int
	}
	if !s.ctxBound {
		// An abandoned lookup outlives the call, and the batch's keys are
		// reused by then: it reads a copy of its own.
		keys = slices.Clone(keys)
	}
	lookup := func(ctx context.Context) (m masters, err error) {
		for i, k := range keys {
			c, err := cl.MasterForKey(ctx, k)
			if err != nil {
				return masters{}, err
			}
			node := c.Options().Addr
			j := slices.Index(m.nodes[:m.n], node)
			if j < 0 {
				j = m.n
				m.nodes[m.n] = node
				m.n++
			}
			m.of[i] = j
		}
		return m, nil
	}
	var (
		m   masters
		err error
	)
	if s.timeout <= 0 {
		m, err = lookup(ctx)
	} else {
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if ctx.Done() == nil {
			tctx = s.deadlines.withTimeout(ctx, s.timeout)
		} else {
			tctx, cancel = context.WithTimeout(ctx, s.timeout)
		}
		// Within a running Take the gate cannot have drained: Close
		// waits for an abandoned lookup as for an abandoned decision.
		m, err = callWithin(tctx, s.ctxBound, func() func() { s.gate.hold(); return s.gate.leave }, lookup, nil)
		cancel()
	}
	*nodes, *keyNode = m.nodes, m.of
	return m.n, err
}

// throughBreakers runs f through the breakers of nodes, nested; while one
// is open f does not run, and the error is ErrUnavailable. f's error counts
// against every breaker, unless faultOf (if given) names the node it came
// from: then against that node's alone, and as neither a success nor a
// failure against the others'.
func (s *Store) throughBreakers(nodes []string, f func() error, faultOf ...func(error) string) error {
	var ferr error
	ran := false
	var level func(i int)
	level = func(i int) {
		if i == len(nodes) {
			ran = true
			ferr = f()
			return
		}
		_, _ = s.nodeBreaker(nodes[i]).Execute(func() (struct{}, error) {
			level(i + 1)
			if !ran {
				return struct{}{}, ErrUnavailable // an inner breaker is open
			}
			if ferr != nil && len(faultOf) > 0 {
				if n := faultOf[0](ferr); n != "" && n != nodes[i] {
					return struct{}{}, errOtherNode
				}
			}
			return struct{}{}, ferr
		})
	}
	level(0)
	if !ran {
		return ErrUnavailable
	}
	return ferr
}

// acquire takes one of the connection slots, waiting at most QueueTimeout
// and as long as the caller's context lives.
func (s *Store) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	default:
	}
	var expired <-chan time.Time
	if s.queueWait > 0 {
		t := time.NewTimer(s.queueWait)
		defer t.Stop()
		expired = t.C
	}
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return callerGone(ctx, nil)
	case <-expired:
		return fmt.Errorf("%w: waited %v", ErrOverloaded, s.queueWait)
	}
}

// decideBounded decides the batch in Redis within the timeout, and wraps
// the errors.
func (s *Store) decideBounded(ctx context.Context, st *takeState, nowArg any, reqs []core.Request, infos []*policyInfo, over int, out []core.Decision) error {
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if s.timeout > 0 {
		if ctx.Done() == nil {
			tctx = s.deadlines.withTimeout(ctx, s.timeout)
		} else {
			tctx, cancel = context.WithTimeout(ctx, s.timeout)
		}
	}
	err := s.decide(tctx, st, nowArg, reqs, infos, over, out)
	// A client bounding its reads by the deadline may report its network
	// timeout a moment before the context's timer fires.
	dl, hasDL := tctx.Deadline()
	timedOut := tctx.Err() != nil || (hasDL && !time.Now().Before(dl))
	cancel()
	if err != nil {
		pdl, parentDL := ctx.Deadline()
		switch {
		case ctx.Err() != nil || (parentDL && !time.Now().Before(pdl)):
			err = callerGone(ctx, err)
		case timedOut && errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("redisstore: decision timed out after %v: %w", s.timeout, err)
		case timedOut:
			// A client bounding its reads by the deadline reports a network
			// timeout; say it is ours.
			err = fmt.Errorf("redisstore: decision timed out after %v: %w: %w", s.timeout, context.DeadlineExceeded, err)
		default:
			err = fmt.Errorf("redisstore: %w", err)
		}
	}
	return err
}

// keysOf returns the Redis keys of the batch.
func (s *Store) keysOf(reqs []core.Request, infos []*policyInfo, keys []string) {
	for i := range reqs {
		tag := ""
		if s.hashTag != nil {
			tag = s.hashTag(reqs[i].Policy.Name(), reqs[i].Key)
		}
		keys[i] = redisKey(s.prefix, infos[i].name, tag, &reqs[i])
	}
}

// groups splits the batch into the groups one script call can decide:
// requests on one slot (Cluster) or with one hash tag (other clients). It
// returns nil when the whole batch is one group.
func (s *Store) groups(keys []string) [][]int {
	if s.place == placeOne || len(keys) == 1 {
		return nil
	}
	var ids [core.MaxBatch]string
	var slots [core.MaxBatch]int
	for i, k := range keys {
		if s.place == placeSlot {
			slots[i] = slot(k)
		} else {
			ids[i] = hashTagOf(k)
		}
	}
	same := func(i, j int) bool {
		if s.place == placeSlot {
			return slots[i] == slots[j]
		}
		return ids[i] == ids[j]
	}
	var gs [][]int
	var gi [core.MaxBatch]int
	for i := range keys {
		g := -1
		for j := 0; j < i; j++ {
			if same(i, j) {
				g = gi[j]
				break
			}
		}
		if g < 0 {
			g = len(gs)
			gs = append(gs, nil)
		}
		gi[i] = g
		gs[g] = append(gs[g], i)
	}
	if len(gs) == 1 {
		return nil
	}
	return gs
}

// takeState holds a Take's per-request scratch arrays, pooled so that a
// decision allocates none of them.
type takeState struct {
	infos  [core.MaxBatch]*policyInfo
	keys   [core.MaxBatch]string
	extras [core.MaxBatch]int64
}

var takeStates = sync.Pool{New: func() any { return new(takeState) }}

func (st *takeState) release() {
	*st = takeState{}
	takeStates.Put(st)
}

// argBuf holds the arguments of one script call: EVALSHA, the SHA1, the
// key count, the keys, four script arguments and three per request.
// go-redis's clients do not keep a command's arguments once Process
// returns, so with them the buffer is reused after the call (after the
// goroutine of an abandoned call ends, see Store.eval); with a client of
// another type, which might, it is not.
type argBuf struct {
	a      [3 + core.MaxBatch + 4 + 3*core.MaxBatch]any
	pooled bool
}

var argBufs = sync.Pool{New: func() any { return &argBuf{pooled: true} }}

func (s *Store) argBuf() *argBuf {
	if s.poolArgs {
		return argBufs.Get().(*argBuf)
	}
	return new(argBuf)
}

func (ab *argBuf) release() {
	if ab.pooled {
		clear(ab.a[:])
		argBufs.Put(ab)
	}
}

// modeArg returns mode as a script argument, without allocating.
func modeArg(mode string) any {
	switch mode {
	case modeTake:
		return modeTake
	case modeCheck:
		return modeCheck
	case modeRefund:
		return modeRefund
	}
	return mode
}

// Script modes (see lua/main.lua).
const (
	modeTake   = "T"
	modeCheck  = "C"
	modeRefund = "R"
)

// decide runs the batch in Redis and fills out.
func (s *Store) decide(ctx context.Context, st *takeState, nowArg any, reqs []core.Request, infos []*policyInfo, over int, out []core.Decision) error {
	keys := st.keys[:len(reqs)] // filled by keysOf in takeRedis
	extras := st.extras[:len(reqs)]
	gs := s.groups(keys)
	if gs == nil {
		var idxBuf [core.MaxBatch]int
		idx := idxBuf[:len(reqs)]
		for i := range idx {
			idx[i] = i
		}
		mode := modeTake
		if over >= 0 {
			mode = modeCheck
		}
		_, err := s.call(ctx, mode, nowArg, reqs, infos, keys, idx, over, extras, out)
		return err
	}
	return s.decideSpread(ctx, nowArg, reqs, infos, keys, gs, over, extras, out)
}

// decideSpread decides a batch whose keys live on several Cluster slots
// (or, for unknown clients, carry several hash tags), where no single
// script can see them all: every group is first checked without charging;
// if all would pass, every group is charged (each atomically, all-or-
// nothing within it); if a group's charge is refused because its state
// changed in between, the groups already charged are refunded.
func (s *Store) decideSpread(ctx context.Context, nowArg any, reqs []core.Request, infos []*policyInfo, keys []string, gs [][]int, over int, extras []int64, out []core.Decision) error {
	charged := make([]bool, len(gs))
	runAll := func(ctx context.Context, mode string, which []bool, dst []core.Decision) []error {
		errs := make([]error, len(gs))
		var wg sync.WaitGroup
		for g := range gs {
			if which != nil && !which[g] {
				continue
			}
			f := func() {
				ok, err := s.call(ctx, mode, nowArg, reqs, infos, keys, gs[g], over, extras, dst)
				if err != nil {
					err = &groupFault{key: gs[g][0], err: err}
				}
				errs[g] = err
				if mode == modeTake {
					charged[g] = ok && err == nil
				}
			}
			if g == len(gs)-1 {
				f()
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); f() }()
		}
		wg.Wait()
		return errs
	}
	// Phase 1: check, charging nothing.
	for _, err := range runAll(ctx, modeCheck, nil, out) {
		if err != nil {
			return err
		}
	}
	if over >= 0 {
		return nil
	}
	for i := range reqs {
		if !out[i].Allowed {
			return nil
		}
	}
	if s.betweenPhases != nil {
		s.betweenPhases()
	}
	// Phase 2: charge every group.
	checked := append([]core.Decision(nil), out[:len(reqs)]...)
	errs := runAll(ctx, modeTake, nil, out)
	var firstErr error
	all := true
	for g := range gs {
		if errs[g] != nil && firstErr == nil {
			firstErr = errs[g]
		}
		all = all && charged[g]
	}
	if all {
		return nil
	}
	// Refund the groups charged, with a context of its own: a refund must
	// not be starved by the deadline that the charge used up.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.refundTimeout())
	defer cancel()
	refunded := make([]core.Decision, len(reqs))
	start := time.Now()
	rerrs := runAll(rctx, modeRefund, charged, refunded)
	took := time.Since(start)
	for g, idx := range gs {
		if !charged[g] {
			continue
		}
		for _, i := range idx {
			if rerrs[g] == nil {
				out[i] = refunded[i]
			} else {
				out[i] = checked[i] // uncharged view from the check
			}
		}
		if rerrs[g] != nil {
			// The requests of the group whose refund failed, not the
			// batch's (the others were refunded, or refused).
			var grp [core.MaxBatch]core.Request
			for k, i := range idx {
				grp[k] = reqs[i]
			}
			s.observe(grp[:len(idx)], fmt.Errorf("redisstore: refunding a refused batch: %w", rerrs[g]), took)
		}
	}
	return firstErr
}

func (s *Store) refundTimeout() time.Duration {
	if s.timeout > 0 {
		return s.timeout
	}
	return time.Second
}

// call runs the script for the requests idx of the batch in mode and
// writes their decisions to out (and their charges' extras to extras). It
// reports whether every request of the group was allowed.
func (s *Store) call(ctx context.Context, mode string, nowArg any, reqs []core.Request, infos []*policyInfo, keys []string, idx []int, over int, extras []int64, out []core.Decision) (bool, error) {
	n := len(idx)
	ab := s.argBuf()
	args := append(ab.a[:0], nil, nil, n)
	overLocal := 0
	for j, i := range idx {
		args = append(args, keys[i])
		if i == over {
			overLocal = j + 1
		}
	}
	switch {
	case n == 1 && mode == modeTake && over < 0 && s.clientTime:
		// A single take: the script's short arguments (lua/fast.lua).
		args = append(args, infos[idx[0]].args, reqs[idx[0]].Cost, nowArg, s.slackArg)
	case n == 1 && mode == modeTake && over < 0 && s.slack == 1:
		// The same on the server's clock, with the slack the script
		// assumes.
		args = append(args, infos[idx[0]].args, reqs[idx[0]].Cost)
	default:
		args = append(args, modeArg(mode), nowArg, overLocal, s.slackArg)
		for _, i := range idx {
			args = append(args, infos[i].args, reqs[i].Cost, extras[i])
		}
	}
	reply, err := s.eval(ctx, ab, args)
	if err != nil {
		return false, err
	}
	var at time.Time
	if !s.clientTime && len(reply) > 0 {
		at = time.UnixMicro(reply[0]) // decided on the server's clock
	}
	return parseReply(reply, reqs, idx, at, extras, out)
}

// eval runs the script, bounded by ctx's deadline even when the client
// does not honour contexts (go-redis's ContextTimeoutEnabled unset): the
// call then runs in a goroutine that is abandoned, not retried, when the
// deadline passes, and ends on the client's own read timeout.
//
// It releases ab, which holds args, once the call is over.
func (s *Store) eval(ctx context.Context, ab *argBuf, args []any) ([]int64, error) {
	if s.ctxBound {
		defer ab.release()
		return s.send(ctx, s.script, args)
	}
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		defer ab.release()
		return s.send(ctx, s.script, args)
	}
	type result struct {
		v   []int64
		err error
	}
	ch := make(chan result, 1)
	s.gate.hold() // within a running Take: the gate cannot have drained
	script := s.script
	go func() {
		defer s.gate.leave()
		r, err := s.send(ctx, script, args)
		ab.release() // only now: an abandoned call still reads args
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// send runs the script sc with args: through the pipeliner if the store
// has one, alone otherwise.
func (s *Store) send(ctx context.Context, sc *boxedScript, args []any) ([]int64, error) {
	if s.pipe != nil {
		return s.pipe.do(ctx, sc, args)
	}
	return eval(ctx, s.client, sc, args)
}

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("redisstore: store is closed")

// ErrCloseTimeout is returned by Close when calls to Redis were still
// running after its wait (see Close).
var ErrCloseTimeout = errors.New("redisstore: calls still running when Close gave up waiting")

// Close stops the store: every Take that starts after Close has begun
// returns ErrClosed, and Close waits for the Takes already running to
// return, and for the calls to Redis they gave up on at their deadline
// (made only for clients without ContextTimeoutEnabled, see the package
// documentation) to end. The wait is bounded by the store's Timeout (one
// second if it has none): a Take bounds each of its calls by Timeout, so
// one that is talking to Redis is usually over by then, but a Take may
// run longer (one waiting for a connection, up to QueueTimeout; the steps
// with a Timeout of their own, see Config.Timeout), and a call abandoned
// by a client without ContextTimeoutEnabled ends only on the client's
// ReadTimeout; if any is still running when the wait ends, Close returns
// ErrCloseTimeout, and what is running ends on its own. Close does not
// close the client, which the caller owns. Close is idempotent.
func (s *Store) Close() error {
	done := s.gate.close()
	bound := s.timeout
	if bound <= 0 {
		bound = time.Second
	}
	select {
	case <-done:
		return nil
	default:
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: %d after %v", ErrCloseTimeout, s.gate.running(), bound)
	}
}

// parseReply reads the script's reply: now, then six integers per request.
// Each Decision's At is at.
func parseReply(reply []int64, reqs []core.Request, idx []int, at time.Time, extras []int64, out []core.Decision) (bool, error) {
	if len(reply) != 1+6*len(idx) {
		return false, fmt.Errorf("unexpected script reply %v", reply)
	}
	all := true
	for j, i := range idx {
		v := reply[1+6*j : 7+6*j]
		pol := reqs[i].Policy
		d := core.Decision{
			Allowed:    v[0] == 1,
			Limit:      pol.Capacity(),
			Remaining:  v[1],
			ResetAfter: micros(v[2]),
			RetryAfter: micros(v[3]),
			Delay:      micros(v[4]),
			Policy:     pol,
			At:         at,
		}
		extras[i] = v[5]
		out[i] = d
		all = all && d.Allowed
	}
	return all, nil
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

type replyParser struct {
	s   string
	pos int
	err bool
}

// next parses the next space-separated decimal integer.
func (p *replyParser) next() int64 {
	if p.pos > 0 {
		if p.pos >= len(p.s) || p.s[p.pos] != ' ' {
			p.err = true
			return 0
		}
		p.pos++
	}
	start := p.pos
	for p.pos < len(p.s) && p.s[p.pos] != ' ' {
		p.pos++
	}
	v, err := strconv.ParseInt(p.s[start:p.pos], 10, 64)
	if err != nil {
		p.err = true
	}
	return v
}
