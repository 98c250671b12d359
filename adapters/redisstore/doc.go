// Package redisstore is a core.Store that keeps rate-limit state in Redis,
// so that a fleet of processes shares one quota per key. It works over any
// go-redis v9 client (redis.UniversalClient: a single node, Sentinel
// through a failover client, or Cluster), which the caller builds, owns and
// closes:
//
//	client := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
//	store, err := redisstore.New(client, &redisstore.Config{Prefix: "myapp:rl:"})
//	...
//	limiter, err := core.New(core.PerMinute(100), core.WithStore(store))
//
// # Decisions
//
// Every built-in algorithm of core (TokenBucket, LeakyBucket including
// MaxDelay shaping, FixedWindow, SlidingWindowLog, SlidingWindowCounter)
// is implemented in Lua, one source per algorithm, composed into one script
// that decides a whole batch: one EVALSHA, one round trip, atomic on the
// server. The script decides every request without writing, then charges
// all of them only if all were admitted; for a refused batch the admitted
// requests report their Remaining without their cost, as core.MemoryStore
// does. A policy with another Algorithm is refused with
// ErrUnsupportedAlgorithm before Redis is contacted. Both that error and
// ErrUnsupportedRule wrap core.ErrUnsupportedPolicy, and Store.CheckPolicy
// (core.PolicyChecker, passed on by LeaseStore and RefusalCache) returns
// them ahead of any request: ratelimit.New, core.New and SetRules refuse a
// rule the store cannot decide, and the HTTP middleware answers one that
// a Resolver picks unlisted as a configuration error (500), never as a
// store failure served fail-open.
//
// The Redis store decides exactly like core.MemoryStore (the same Allowed,
// Remaining and Limit for the same sequence of requests) provided that
//
//   - the policy's Window and MaxDelay are whole microseconds (otherwise
//     Take returns ErrUnsupportedRule), and
//   - the decision times are whole microseconds: Redis TIME always is; with
//     Config.ClientTime the time given to Take is truncated to a
//     microsecond.
//
// RetryAfter, ResetAfter and Delay are computed in microseconds and
// rounded up: each equals the memory store's value rounded up to a whole
// microsecond, so a client told to wait is never admitted early.
//
// # Arithmetic
//
// Lua numbers are doubles, exact for integers below 2^53. The script keeps
// every quantity an integer: times in Unix microseconds (2^53 us is the
// year 2255), counts in units, and the token buckets' theoretical arrival
// time as whole microseconds plus a fraction in units of 1/Limit, the same
// exact representation core uses in nanoseconds. Products that can exceed
// 2^53 (cost x Window, (TAT - now) x Limit, a sliding counter's
// prev x (Window - elapsed), room x Window) go through an exact
// multiply-divide that splits the multiplier into chunks small enough that
// every intermediate value stays below 2^53. So every rule core.NewPolicy
// accepts (Limit and Burst up to core.MaxLimit = 2^50, Window and MaxDelay
// up to core.MaxWindow) is decided exactly, as long as its Window and
// MaxDelay are whole microseconds, at any time up to MaxTime (the year
// 2155: now plus two MaxWindows stays below 2^53 us) and, in ClientTime
// mode, from MinTime (the year 1784) on; other times are refused with
// ErrTimeOutOfRange in ClientTime mode (the zero time.Time, the year 1,
// among them), which wraps core.ErrTimeOutOfRange. Rational quantities
// never cross the Lua boundary: rule parameters go in as MessagePack
// integers (decoded by Redis's built-in cmsgpack), times as decimal integer
// strings, and the reply is an array of integers (each below 2^53, so
// exact as a Lua number).
//
// # Time
//
// By default the script reads the server's clock (TIME) once per call, and
// the time passed to Take is ignored: the fleet shares one clock, so clock
// skew between application servers changes nothing. In a Cluster each key
// is decided by the clock of the node holding it. Redis 5 and later
// replicate scripts by their effects, so a script may write after reading
// TIME (on Redis 3.2 and 4 the script asks for effects replication
// itself).
//
// Config.ClientTime decides at the time passed to Take instead, for
// deterministic tests (core/storetest passes whole milliseconds); it makes
// the callers' clock skew part of every decision.
//
// A decision whose time lies behind the key's state by at most
// core.ClockTolerance (in ClientTime mode, a caller that read its clock
// before another whose call went first, or callers' clocks a little apart)
// decides as at the key's own time and moves nothing back, as in the
// memory store: it never makes room for more requests than its absence
// would. A clock that steps back further (a failover to a node with a
// slower clock, a VM restore, or ClientTime), and runs on from there,
// never credits quota, and refuses a key for at most its policy's
// recovery time plus core.ClockTolerance: a bucket's theoretical arrival
// time more than core.ClockTolerance beyond now plus the refill time
// (Burst x Window / Limit, plus MaxDelay when shaping, the most an
// admitted state can hold) is clamped there; a fixed
// window or sliding counter record whose window lies in the future counts
// as the current window's (refused for at most one Window, two for the
// sliding counter); sliding log entries after now count as made at now.
// The clamped state is written back, even by a refusal (a batch refused
// by another layer, a request over capacity, a batch spanning several
// slots refused at its check), so the bound holds at every later
// decision, counted from the first decision after the step. A key never
// seen is whole at every time the store accepts. Times that keep
// alternating by more than core.ClockTolerance (ClientTime callers whose
// clocks are further apart) are a step back each time and may admit well
// beyond the quota: share ClientTime only among callers whose clocks agree
// within it, or decide on the server's clock (the default). One exception:
// a leaky bucket's record met by a policy of another identity (see below)
// is read from its raw arrival time, its MaxDelay not being stored with
// it, so that a request d behind it (after a step back, or by at most
// core.ClockTolerance) counts up to d's worth of units more in use than
// the memory store does, and may refuse the key for up to d (it never
// credits).
//
// # Policy identity
//
// Every record carries the identity of the policy that wrote it
// (core.Policy.Identity: the algorithm, Limit, Window and capacity; not
// the Name, which is part of the key, nor MaxDelay). A record met by a
// request under a policy with another identity (a rule changed by a
// deploy, two limiters sharing a rule name, equally named tiers) is never
// read under it: the script decides the record under the policy that wrote
// it, with cost 0, at now, and the units in use (that policy's capacity
// minus its Remaining) carry over to a fresh state of the requesting
// policy, charged at now (at most its capacity); the request is then
// decided as usual, and the converted record is written only with the
// request's charge: a refused request leaves the record as it was, with a
// retry time from the record's own policy, and a conversion that dropped
// units (the record had more in use than the requesting policy's
// capacity) is always refused, so that the record's own policy never finds
// units credited. So the units in use carry over in absolute numbers
// (5 per 10m with 3 used, then 10 per 10m: the next request sees 6
// remaining), a change never credits quota, recovery of the carried units
// restarts at the change, and this holds when the algorithm itself
// changes.
//
// A record without an identity (the store never writes one; another
// program may) is read as written under the policy that meets it if it
// has that algorithm's shape, and as fresh otherwise; a sliding log
// without one counts all its units at its newest entry's instant (never a
// credit, at most one Window of over-counting) and is rewritten with an
// identity at its next charge.
//
// # Keys and expiry
//
// A request's key is Prefix + name + ":" + key, or, when Config.HashTag
// gives a tag, Prefix + "{" + tag + "}" + name + ":" + key, where name is
// the policy's Name and key the request's Key as it is. In the name '%',
// ':', '{' and '}' are written %25, %3A, %7B and %7D, and in the tag '%',
// '{' and '}', so two different (tag, name, key) triples never share a
// Redis key and a policy name never opens a hash tag. The store bounds
// what a caller-supplied key can do: a key longer than MaxKeyLen (256)
// bytes is stored under "%h:" + hex(SHA-256(key)) in place of ":" + key,
// and a tag longer than MaxKeyLen under "%h" + hex(SHA-256(tag)), so a
// Redis key is never longer than the prefix, the name, the tag as written
// (at most 3 × MaxKeyLen + 2 bytes) and 67 bytes, also when the tag is
// the key (TagByKey); and an untagged key holding '{' is written after an
// empty hash tag, Prefix + "{}" + name + ":" + key, so Redis Cluster
// hashes the whole key: a key such as "{victim}" cannot choose its hash
// slot (or its node) unless Config.HashTag says so. Keys that may hold
// secrets (API keys) should be hashed before they reach the store.
//
// The buckets and windows keep one string per key ("g:tat:frac;id",
// "f:window:count;id", "c:window:prev:curr;id", id the policy's identity);
// the sliding log keeps a list of "base;id" and one "time:units:count"
// entry per admission instant, count being the running count of units, so
// its memory grows with the admissions in the window (up to Limit entries).
// A charge writes the state and its expiry in the same script (SET ... PX,
// or PEXPIRE for the log): the key expires when its state would decide like
// a fresh one (core's Algorithm.Expiry), rounded up to a millisecond, plus
// one millisecond (ClientTimeSlack in ClientTime mode). On the server's
// clock with Redis 7 or later, a fixed window's record charged again within
// its window, under the policy that wrote it, keeps the expiry the window's
// first charge set (SET ... KEEPTTL): the window still ends when it did,
// and the write costs the server about half as much. A refusal writes
// nothing, except a record clamped after a clock step (see above): its own
// policy's, or, when a refused request read another policy's record, that
// record clamped under its own policy. A key of a foreign type or shape is
// read as fresh and overwritten. A sliding log's entries are read only
// where a decision needs them (see below), so a log of our shape with an
// entry of a foreign shape among them is read as fresh when a decision,
// a refund or a peek first reads that entry.
//
// # Work per decision
//
// No script does work that grows with a sliding log's length: the running
// counts let a decision find the first entry inside the window, and when
// refused the entry whose expiry admits the request, by binary search
// (LINDEX, about 2 log2(n) reads), and a charge drops at most 1,024
// expired entries (one LTRIM; expired entries left behind never count and
// go with later charges or the key's expiry). Measured with SLOWLOG
// (slowlog-log-slower-than 0) on a 200,000-entry log, on a loaded 2-core
// machine: 0.2 to 0.7 ms of server time for a decision on a log that has
// just expired, half expired, or is full (refused); the chunked walk it
// replaces took 174 ms for the first. Only two things touch more entries:
// entries recorded after now by a clock that stepped back, which a charge
// moves to now, and a refund (Cluster batches spanning slots), which reads
// back from the newest entry to the charged one.
//
// # Round trips and retries
//
// A decision is one EVALSHA. When the server answers NOSCRIPT (its script
// cache was lost to a restart, a failover or SCRIPT FLUSH), nothing ran,
// and the store sends the script once with EVAL, as redis.Script.Run does.
// No other failure is retried: a script whose connection broke or timed
// out may have run and charged, and sending it again would charge twice.
// go-redis itself retries such failures up to Options.MaxRetries times (3
// by default for a single-node client), so the store marks its script
// calls as not retryable; failures before a command is written (a refused
// dial) are still retried by the client, which is safe. No client option
// needs changing for this.
//
// # Cluster
//
// With a *redis.ClusterClient, the requests of a batch are grouped by hash
// slot. A batch in one slot is one atomic call. Config.HashTag puts
// chosen requests in one slot: its tag may depend only on the request's
// policy name and key, because it is part of the Redis key and the same
// quota must map to the same key in every batch. TagByKey tags by the key,
// which co-locates the layers that limit one key under several policies
// (per second and per hour per client IP, say). A tag derived from the
// batch (say, the first request's key) would file a per-user quota under
// every IP the user comes from, and is deliberately not offered.
//
// A batch whose requests span several slots is never sent as one script
// (that would fail with CROSSSLOT). It is decided in up to three steps:
// every slot's group is checked without charging (in parallel); if one
// would refuse, the batch is refused and nothing was charged (records
// clamped after a clock step are written, as by any refusal); otherwise
// every group is charged (in parallel), each atomically and only if it
// still admits; if a group's charge is refused because its state changed
// since the check, the groups already charged are refunded and the batch
// is refused. Caveats:
//
//   - It costs two round trips (three with a refund) instead of one.
//   - It is not atomic across slots: between a group's charge and its
//     refund, other requests see that charge and may be refused. A batch
//     is only admitted once every group is charged, so nothing is ever
//     admitted uncharged.
//   - Refunds are exact for FixedWindow, SlidingWindowCounter and
//     SlidingWindowLog (they undo the charge in the window or log entry it
//     went to, if that still counts). For TokenBucket and LeakyBucket the
//     refund takes cost x Window/Limit off the theoretical arrival time:
//     exact unless another request met the bucket full in between, in which
//     case it may credit up to what refills between charge and refund (at
//     most twice Timeout's worth of refill: the charge's Timeout, and the
//     refund's own).
//   - If Redis fails between the charge and the refund, some groups may
//     stay charged (the safe direction); the failure is returned or, when a
//     refund alone fails, reported to the Observer.
//
// With a *redis.Ring, or a client type the store does not know, requests
// are grouped by their hash tag (equal tags always share a node), by the
// same scheme.
//
// A Ring has no replicas: when go-redis's heartbeat finds a shard down, it
// moves that shard's keys to the others, which hold no state for them, and
// back once the shard is up again. The store does not decide a key moved
// so (that would grant it a fresh quota): its batch fails with
// ErrShardDown (the Fallback decides it, when there is one), as do a Peek
// of it, a Refund and a Reset (which, on the other shard, would change
// nothing and report success) and the in-flight slots of InFlight, while
// the keys of the shards that are up
// decide as usual. The store knows the shards the Ring was built with, and
// checks each key's routing against them. Ring.SetAddrs, which moves keys
// between shards without their state whenever it changes them, is reported
// to the Observer once (ErrRingChanged) when the store meets a shard added
// or dropped, and from then on the store decides every key where the Ring
// sends it. Two changes go unseen: renaming shards or swapping their
// addresses (which moves keys as a shard that flaps down and up does, and
// cannot be told from it), and dropping a shard the store never saw up
// (down since before the store was built), whose keys keep failing with
// ErrShardDown; build the store at startup, and change a Ring's shards by
// adding and dropping them. InFlight applies the same check and, having no
// Observer, reports nothing (the Store on the same Ring does). A Ring has
// one circuit breaker for the whole store (ErrShardDown does not count
// against it). Where a lost shard must not mean lost state, use Redis
// Cluster or Sentinel, which fail over to a replica.
//
// # Failures
//
// Each Take is bounded by Config.Timeout (50ms by default; twice that on a
// Cluster whose client must first load its slot map, and a Timeout more
// for a batch spanning slots that refunds the groups it charged when
// another refused it). go-redis
// bounds its socket reads by the context's deadline only when the client
// has ContextTimeoutEnabled; otherwise the store waits for the call in a
// goroutine and abandons it at the deadline (it then ends on the client's
// ReadTimeout), so setting ContextTimeoutEnabled saves a goroutine per
// decision, and lets the store pipeline concurrent decisions by default
// (see below). (When the caller's context can never end, as
// context.Background, the store's deadline shares one timer per
// millisecond with other decisions: the deadline given to go-redis is
// exact, and what waits on the context's Done, such as the abandonment
// above, may see it up to 2ms late.) A circuit breaker
// (github.com/sony/gobreaker, see BreakerConfig) opens after consecutive
// failures (not counting an error reply about one call's own content, such
// as a script's error on what a key holds) so that a dead Redis costs
// nothing while it is open, then probes and closes when Redis is back. On
// a Cluster each master has a breaker of its own (NodeStates): a batch on
// one master counts against that master's alone, so with one master down
// the keys of the others keep deciding; a batch spanning masters goes
// through each of their breakers, and the failure of one of its calls
// counts against the breaker of that call's master alone (so layered
// batches that reach a master that is down do not open the others'). A
// resharding counts too: while a slot migrates, Redis answers a call on
// several keys of that slot TRYAGAIN, which counts as the master failing,
// so a migration under load can open its breaker, and the master's keys
// then go to the caller's fail policy (or the Fallback) for
// BreakerConfig.OpenFor: move slots when the load is light, or give the
// store a Fallback.
//
// A cold start (a deploy, a Redis restart) meets an empty script cache and
// an empty connection pool: call Warm before serving, which loads the
// script and opens the pool on every node. With a single-node or failover
// client, the store also lets at most as many decisions talk to Redis at
// once as the client may hold connections (its PoolSize, or MaxActiveConns
// when lower); the others wait in order (up to Config.QueueTimeout)
// before their Timeout starts, so a burst is paced by the pool instead of
// timing out in it, and a queue wait never counts against the breaker.
//
// Under load, most of Redis's work per decision is not the script but the
// network: reading a command and writing its reply on a connection of its
// own. By default, on a single-node or failover client with
// ContextTimeoutEnabled, concurrent decisions share that work when Redis
// is busy (Config.Pipeline). A
// decision that finds fewer than 4 calls in flight goes out at once,
// alone. Beyond that, while calls come back at least every 100µs, it joins
// the next pipeline: the first call to come back sends every decision
// waiting in one pipeline (one write and one read for up to 128 calls),
// and a pipeline that has waited 100µs goes out on a connection of its
// own. When calls come back less often (a distant server, few callers),
// every decision goes out at once, alone. So a lone caller's latency does
// not change, a decision waits at most about 100µs for a pipeline, and a
// busy server decides far more per second. Each decision is still its own
// atomic script call, sent once and never retried; a decision whose
// context ends while it waits is not sent. A failed pipeline fails every
// decision it carries and counts once against the breaker (one round trip
// failed), so one broken connection does not open it. A positive
// Config.Pipeline pipelines always, beyond that many calls in flight (with
// a wait of up to a round trip), and a negative one never; Cluster and
// Ring clients, and by default clients without ContextTimeoutEnabled
// (whose stuck pipeline would hold its decisions until the client's
// ReadTimeout), send every decision alone. BENCHMARKS.md measures the gain
// and the latency.
//
// While Redis is unavailable (an error, a timeout, or the breaker
// open), Take returns the error (ErrUnavailable while the breaker is open),
// and the caller applies its fail policy (the HTTP middleware fails open
// or closed), or, if Config.Fallback is set, decides with the fallback
// store: every instance then limits alone, so N instances admit up to N
// times the quota until Redis is back. Backend errors are wrapped with a
// "redisstore: " prefix; a timeout matches context.DeadlineExceeded. A
// script that fails part-way through charging a batch (Redis out of
// memory, say) may leave the requests it had already written charged: the
// batch is reported as an error, and the error is in the safe direction.
//
// A decision that times out may still have run in Redis and charged its
// requests: the script was sent, and its reply did not arrive in time.
// With a Fallback the request is then also charged in the fallback store:
// a timed-out request is charged at most twice, once in Redis (at most
// the batch's costs, which count against its quota there) and once in the
// local fallback (which only this instance sees). The double charge is in
// the safe direction (it refuses, never admits, an extra request) and is
// bounded per timed-out decision by its cost; without a Fallback the
// caller sees the error and nothing is charged twice.
//
// When the caller's own context ends (it is canceled, or its deadline
// passes before the store's Timeout), Take returns an error that matches
// the context's error (errors.Is(err, context.Canceled) or
// context.DeadlineExceeded) and IsCallerGone: the client went away, which
// says nothing about Redis. Such an error does not count as a failure for
// the circuit breaker, is not decided by the Fallback and is not reported
// to the Observer; the HTTP middleware treats it as a client that left, not
// as a store failure. A call already sent may still have charged.
//
// Close waits, for at most the store's Timeout, until no Take is running
// and the calls abandoned at their deadline have ended; Takes that start
// after Close has begun fail with ErrClosed.
//
// Client options worth setting: ContextTimeoutEnabled (above);
// DialerRetries 1 or 2, because go-redis pauses DialerRetryTimeout (100ms)
// between dial attempts, so with its default of 5 attempts a Redis that
// refuses connections costs each decision its whole Timeout instead of
// failing at once; PoolSize at least the number of concurrent decisions (a
// decision holds a connection for one round trip); ReadTimeout and
// WriteTimeout as a backstop above Timeout. MaxRetries needs no change
// (see above).
package redisstore
