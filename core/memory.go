package core

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// DefaultCapacity is the number of keys a MemoryStore holds when its
// configuration sets none: at most about 13 MB, at the ~126 bytes per key
// measured at 1,000,000 keys each used twice (about 54 for keys used once:
// see MemoryStore).
const DefaultCapacity = 100_000

// DefaultShards is the nominal number of shards of a MemoryStore whose
// capacity is at least DefaultShards x minShardCapacity. The store picks
// its default count between DefaultShards*3/4 and DefaultShards*3/2 (see
// MemoryConfig.Shards).
const DefaultShards = 64

// minShardCapacity is the fewest keys per shard that the default number
// of shards keeps, halving the shards of a small store.
const minShardCapacity = 4 * MaxBatch

// EvictionScan is the most keys a full shard examines, from the back of its
// order of use (its least recently used keys), to find room for one new key.
const EvictionScan = 8

// MemoryConfig configures a MemoryStore. A nil *MemoryConfig means the
// defaults.
type MemoryConfig struct {
	// Capacity is the most keys the store holds. The default value is
	// DefaultCapacity. It is spread evenly over the shards, each holding
	// Capacity / shards keys (rounded down, so the store never holds more
	// than Capacity; MemoryStore.Capacity reports the exact bound), and the
	// bound is per shard: a full shard makes room in itself even if another
	// shard has room.
	//
	// Capacity also sizes the slabs that hold the keys' state, 32 bytes a
	// slot. A shard of c keys starts with a slab of at most 64 slots (2
	// KiB), which about doubles as keys arrive (see MemoryStore), up to
	// c + c/8 + 1 slots (c/8 rounded down), never more: 36 bytes per key of
	// Capacity and 32 bytes per shard (up to 64 bytes per key in a shard
	// of one key). While a large shard fills, that is up to about 86 bytes
	// per key held right after a growth, falling to 43 before the next. A
	// growth allocates the new slab before the old one is dropped. The
	// order of use takes 12 bytes per key held in a shard's ring (a key used
	// once; the ring has at most four entries per such key, at least 64)
	// and golang-lru's list entry and map slot, about 88 bytes, per key in
	// its list (a key used again: see MemoryStore).
	Capacity int

	// Shards is the number of independently locked shards, lowered to
	// Capacity if it exceeds it (every shard holds at least one key). The
	// default value is chosen from Capacity: DefaultShards, halved for
	// small capacities so that each shard holds at least 64 keys (one shard
	// below 128); for a store of at least 48 x 896 keys, the count between
	// 48 and 96 whose shards' recency maps are the most compact at
	// capacity (golang-lru keeps a shard's keys in a Go map, whose hash
	// tables of 1,024 slots hold at most 896 keys and split in two when
	// full: a shard sized just after a split would leave half of its
	// slots empty, ~38 bytes per key where a well-sized one needs ~23).
	// A batch with more keys in one shard than
	// the shard holds (possible only when a shard holds fewer than MaxBatch
	// keys) is refused with ErrStoreFull and a RetryAfter of 0: it can
	// never be stored.
	Shards int

	// KeepActive, when true, never evicts a key that still holds state: a
	// new key meeting a full shard whose least recently used key has not
	// fully recovered, ClockTolerance ago, is refused with ErrStoreFull,
	// and the refusing Decision's RetryAfter is the time until then
	// (exact, never early, if nothing else arrives), so a client over its
	// limit cannot be released by a flood of other keys, even by a caller
	// that read its clock just before the key recovered (see
	// ClockTolerance). Only the least recently used key is examined, and
	// only keys so recovered are ever dropped; such
	// a store keeps exact recency (every decision moves its key to the
	// front, and every key is in its shard's golang-lru list, a new key's
	// entry allocated as it is added), so that the key examined is the
	// least recently used.
	//
	// The default value, false, examines up to EvictionScan keys from the
	// back of a full shard's order of use (its least recently used keys,
	// as far as the store's lazy recency tells them apart: see
	// MemoryStore): the
	// first of them that has fully recovered is dropped, silently
	// (forgetting it changes no decision made at or after its recovery; a
	// decision made up to ClockTolerance late, by a caller that read its
	// clock before the key recovered and reached the store after a flood
	// had dropped it, finds the key new: use KeepActive where that race
	// matters); the examined keys that still
	// hold state are moved to the front, a second chance; when none of them
	// has recovered, the first of them (the one that was at the very end)
	// is evicted, counted and reported to the Observer.
	KeepActive bool

	// Observer receives evictions of keys that still held state. The
	// default value is none. With an Observer, the store also keeps every
	// key's text (one string per key), which its eviction events carry;
	// without one it keeps only their hashes (see MemoryStore).
	Observer Observer
}

// MemoryStore is the in-memory Store: per-key state in shards bounded to
// their share of Capacity in least-recently-used order (kept with
// github.com/hashicorp/golang-lru/v2, see below), each shard guarded by its
// own mutex, so decisions on different keys rarely contend and each
// decision is one atomic read-check-update under its shard's lock. A batch
// locks its shards in index order.
//
// Keys are namespaced by the policy's Name: the same key under two Names is
// two quotas, and under one Name it is one record, shared. Each record is
// tagged with the Policy that last wrote it. A request whose policy has
// another Identity (same Name, another algorithm or parameters) never reads
// the record as its own: the units in use under the old policy carry over
// in absolute numbers, as a fresh state of the new policy charged
// min(used, new capacity) at that instant, and the request is then decided
// as usual. A change of rule therefore never credits quota, and recovery
// of the carried units restarts at the change.
//
// A record is found by a 64-bit hash of its policy's Name and its key,
// seeded at random per store (hash/maphash), so that no client can aim at
// a collision; the key itself is not stored unless an Observer is set.
// Two distinct (Name, key) pairs sharing a hash would share a record: among
// n live keys that happens with probability about n²/2⁶⁵, 3·10⁻⁸ for
// 1,000,000 keys.
//
// Each shard keeps its records in a slab of slots that is also its index:
// a slot holds a key's hash beside its state, written in place by every
// decision, and keys are placed by linear probing from the slot their hash
// points to, in Robin Hood order (along a run of slots, keys sit in the
// order of the slots their hashes point to, so that a search stops as soon
// as it passes where its key would be). A decision on a held key reads the
// slab alone: one slot for a key at its home, as most keys are while the
// shard has room, and about five on average once the shard is full (see
// below).
//
// Each shard keeps its keys' order of use, for eviction, in two parts, by
// hash: a ring, first in first out, of the keys added and not gone to the
// front again since (12 bytes each, no allocation), and a golang-lru list
// of the keys that have, by their last time there (a key moves to the list,
// and its entry is allocated, the first time it goes to the front again
// after its addition). Every key carries the shard's count of keys gone to
// the front when it last went there (its addition counts), so the older of
// the ring's first key and the list's last is the least recently used:
// eviction takes the keys in the order one list of them all would give. A
// flood of keys used once thus costs the ring alone, whose entries are
// written and read in order, and not golang-lru's allocation, links and
// map (unless its keys still hold state when they reach the back of the
// order: a full shard's second chance, see MemoryConfig.KeepActive, moves
// them to the list).
//
// A shard's slab has 1/8 more slots than its capacity c (Capacity divided
// among the shards) once full, where a successful search reads about five
// slots on average; while the shard fills, its slab is that size halved
// over and over, and when its keys pass three quarters of it, it about
// doubles and the shard places all its keys anew (at least 1.75 times in a
// shard of 1,000 keys or more; the LRU, which does not name slots, is left
// alone). That is at most ⌈log2(s/64)⌉ pauses in a shard's life, s being
// its full slab's c + c/8 + 1 slots (5 in a default shard), each
// taking about a placement per key held and the new slab's allocation (32
// bytes a slot), with the shard's lock held. A new key in a full shard
// costs more than in the slab's growing range: its search, and the keys
// its placement and the evicted key's removal move by one slot, cross
// longer runs of slots (see BENCHMARKS.md). Slots are placed by hash, not
// in the order keys arrive: traffic that revisits keys in the order they
// first came finds them further apart in memory than an arrival-ordered
// layout would keep them.
//
// Recency is kept lazily, as memcached keeps its LRU: a decision moves its
// key to the front of the shard's list only when the key may have drifted
// into the back half (more than half a shard's capacity of keys have gone
// to the front since it last did, and the shard holds more keys than that).
// A key is therefore evicted only after at least half a shard's capacity of
// other keys have been added or moved to the front since its last use (an
// exact LRU waits for a whole shard's). While a shard's busy keys are fewer
// than about half its capacity, almost no decision writes list links (the
// links of a key's neighbours and of the list's head, memory that every
// core deciding in the shard would otherwise pass back and forth); a full
// shard under uniform traffic still moves more than half of its decisions'
// keys. A new key, a key whose policy changes, and every key of a
// multi-request batch go to the front. A store with KeepActive keeps exact
// recency instead.
//
// The key a shard decides twice in a row, by single requests under a
// token bucket, leaky bucket, fixed window or sliding window counter,
// becomes its hot record: its state is kept beside the shard's lock, on
// its cache line, and decisions on that key alone read and write that line
// only. Any other access to the shard writes the state back to its slot
// first.
//
// Deciding an existing key allocates nothing (unless its policy changes,
// when the shard's table of policies may grow, or it goes to the front for
// the first time since its addition, when its golang-lru list entry is
// allocated). A new key allocates nothing (with an Observer, its text; with
// KeepActive, its list entry; in a full shard, the list entries of the keys
// examined for room and given a second chance; now and then, the growth of
// a filling shard's slab or ring, or a compaction of its ring). A shard
// remembers its last 32 evictions of keys holding state, so that a refund
// by charge (Request.ChargedAt) of a key evicted since gives nothing back:
// its record, made anew, holds only later charges; a shard that has
// evicted more keys than that since a charge gives nothing back for it,
// whatever its key. "Since" counts from ChargedAt less ClockTolerance, and,
// for a bucket, less its refill time and MaxDelay too (its ChargedAt is
// when the charge starts to give units back, up to that much after it). A
// full shard drops a recovered key before evicting one that holds state
// (see MemoryConfig.KeepActive for how far it looks). Times outside
// [MinTime, MaxTime] are clamped to them.
//
// It is safe for concurrent use and needs no Close.
type MemoryStore struct {
	shards     []memShard
	nshards    uint64
	seed       maphash.Seed
	keepActive bool
	observer   Observer
	evictions  atomic.Uint64
}

var _ Store = (*MemoryStore)(nil)

// expiry returns the Unix nanosecond from which the entry's state equals a
// fresh state. It is computed when a full shard examines the entry, so
// that deciding an existing key writes nothing but its state.
func (e *memEntry) expiry() int64 { return e.pol.alg.Expiry(e.pol, &e.st) }

// adopt makes e a state of p at now. A record written under a policy with
// another Identity is replaced by a fresh state of p charged the units in
// use under the old policy (a shaping bucket's queue included), at most
// p's capacity. It reports whether that dropped units above p's capacity:
// such a conversion is never stored, and its request is refused (see
// refuseConverted), since stored, the dropped units would come back as a credit
// to the old policy when its requests return (tiers of one Name, a request
// still holding rules a reload replaced). e must not be on the caller's stack (Decide
// would move it to the heap). Requires s.mu.
func (s *memShard) adopt(e *memEntry, p *Policy, now int64) (lost bool) {
	old := e.pol
	e.pol = p
	if old == nil || old.identity == p.identity {
		return false
	}
	used := s.inUse(old, &e.st, now)
	// Under a window or a log, recorded at the old record's own time when
	// now lies behind it (see settle): at now, the units would go to a
	// window or instant before the record's, which the next decision at
	// the record's time would find over. A bucket starts to give them back
	// at now (ahead of now, it would read them as more than it holds).
	at := now
	if !isGCRA(p) {
		at = stateTime(old, &e.st, now)
	}
	e.st = State{}
	if used > 0 {
		p.alg.Decide(p, &e.st, min(used, p.capacity), at, true, &s.dec)
	}
	return used > p.capacity
}

// inUse returns the units st has in use under p at now: for the buckets,
// from the arrival time, a shaping bucket's queue beyond its capacity
// included (see gcraInUse); otherwise p's capacity less the Remaining of
// its decision at cost 0. It overwrites s.dec. Requires s.mu.
func (s *memShard) inUse(p *Policy, st *State, now int64) int64 {
	if isGCRA(p) {
		return gcraInUse(p, st, now)
	}
	p.alg.Decide(p, st, 0, now, false, &s.dec)
	return p.capacity - s.dec.Remaining
}

// refuseConverted makes d, a refusal of a request of cost under p on old,
// a record of another policy converted to p (see adopt), the refusal Take
// reports without storing the conversion: with lost, one that dropped
// units, whatever p decided (also a shaping p, which would admit a full
// bucket with a delay). The key has room for cost under p once old's own
// units in use, queued ones included, fall to p's capacity less cost (the
// next request converts old's record again), and is whole once they are
// all back. old's state, the record under h, is stored clamped as a
// decision at now clamps it after a clock stepped back, so that the wait
// holds. It overwrites s.dec. Requires s.mu.
func (s *memShard) refuseConverted(old memEntry, h uint64, p *Policy, cost, now int64, d *Decision, lost bool) {
	o := old.pol
	s.exam = old
	o.alg.Decide(o, &s.exam.st, 0, now, true, &s.dec) // the clamp
	reset := s.dec.ResetAfter
	if i, ok := s.lookup(h); ok {
		s.write(&s.slab[i], &s.exam.st)
	}
	// A request of cost c under p fits once old's units in use are at most
	// p's capacity less c.
	var wait time.Duration
	if isGCRA(o) {
		wait = time.Duration(gcraRoomWait(o, &s.exam.st, p.capacity-cost, now))
	} else if k := o.capacity - p.capacity + cost; k >= 1 {
		// Once old admits k: a refused conversion of a window's record has
		// more units in use than p's capacity less c, and at most old's
		// capacity.
		o.alg.Decide(o, &s.exam.st, k, now, false, &s.dec)
		wait = s.dec.RetryAfter
	}
	s.exam = memEntry{}
	d.Allowed, d.Delay = false, 0
	if lost {
		d.Remaining = 0
	}
	d.RetryAfter, d.ResetAfter = max(wait, 1), max(d.ResetAfter, reset)
}

// converted reports whether a record of e's policy is converted when p
// meets it.
func converted(e *memEntry, p *Policy) bool { return e.pol != nil && e.pol.identity != p.identity }

type memShard struct {
	mu sync.Mutex
	// The hot record: the key takeOne decided twice in a row, while no
	// other request reaches the shard (see takeOne and flush). Its State
	// is kept here, on the cache line of mu, and its slot is behind until
	// flush writes it back, with the stamp hotRef holds. Guarded by mu,
	// like every field below.
	hotOK  bool
	hotH   uint64  // the hot key's hash
	hotRef memRef  // its slot and stamp
	hotPol *Policy // its policy, a hotAlgorithm
	hotA   int64   // its State
	hotB   int64
	lastH  uint64 // the hash of the key takeOne last decided

	// lru orders the keys that went to the front again after they were
	// added, ring the others (see memring.go); ringed is false with
	// KeepActive, which keeps every key in lru.
	lru    *simplelru.LRU[uint64, struct{}]
	ring   memRing
	ringed bool
	cap    int
	// lazy is how far from the front a key may drift before a decision
	// moves it back there (see put): half the shard's capacity, or 0 with
	// KeepActive (exact recency).
	lazy uint64
	tick uint64 // keys gone to the front so far

	slab []memSlot // span slots: the shard's index and records (see memslab.go)
	span uint32    // len(slab) (see add and grow)
	// logs holds the sliding logs of the shard's records by hash; nil
	// until the first is stored.
	logs map[uint64]*timeLog

	pols     []*Policy // the policies of the shard's records; nil where free, and at 0
	polRefs  []uint32  // records of each policy
	polFree  []uint32  // free indexes of pols
	polIndex map[*Policy]uint32
	lastPol  uint32 // the index acquire last returned

	scratch State    // state of a key not yet stored; guarded by mu
	cur     memEntry // copy of the record being decided; guarded by mu
	exam    memEntry // copy of a record examined by makeRoom; guarded by mu
	dec     Decision // scratch decision, so that callers' decisions stay on their stacks; guarded by mu
	// keys holds the text of every key, by hash, when the store has an
	// Observer (for its eviction events); nil otherwise. Guarded by mu.
	keys map[uint64]string
	// evicts holds the shard's last evictions of keys holding state (see
	// noteEviction); nil until the first.
	evicts *memEvictLog
	_      [16]byte // 512 bytes in all: a shard's first field starts a cache line
}

// NewMemoryStore returns a MemoryStore configured by cfg (nil for the
// defaults). It returns an error for a negative Capacity or Shards, and for
// more than 2³¹ keys per shard.
func NewMemoryStore(cfg *MemoryConfig) (*MemoryStore, error) {
	var c MemoryConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Capacity < 0 {
		return nil, fmt.Errorf("ratelimit: memory store Capacity must not be negative, got %d", c.Capacity)
	}
	if c.Shards < 0 {
		return nil, fmt.Errorf("ratelimit: memory store Shards must not be negative, got %d", c.Shards)
	}
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	shards := c.Shards
	if shards == 0 {
		shards = defaultShards(c.Capacity)
	}
	shards = min(shards, c.Capacity)
	per := c.Capacity / shards
	m := &MemoryStore{
		shards:     make([]memShard, shards),
		nshards:    uint64(shards),
		seed:       maphash.MakeSeed(),
		keepActive: c.KeepActive,
		observer:   c.Observer,
	}
	if uint64(per) > maxShardCapacity {
		return nil, fmt.Errorf("ratelimit: memory store: %d keys per shard is more than the %d a shard holds; raise Shards", per, maxShardCapacity)
	}
	for i := range m.shards {
		s := &m.shards[i]
		l, err := simplelru.NewLRU[uint64, struct{}](per, s.evicted)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: memory store: %w", err)
		}
		s.lru = l
		s.ringed = !c.KeepActive
		s.cap = per
		s.span = nextSpan(0, fullSpan(per))
		s.slab = make([]memSlot, s.span)
		s.pols, s.polRefs = []*Policy{nil}, []uint32{0} // index 0: a free slot
		if !c.KeepActive {
			// KeepActive examines only the last key of the list, which
			// must then be the least recently used: it keeps exact recency.
			s.lazy = uint64(per / 2)
		}
		if c.Observer != nil {
			s.keys = make(map[uint64]string)
		}
	}
	return m, nil
}

// Go's maps keep keys in hash tables of at most mapTableSlots slots,
// filled to at most mapTableKeys before a table splits in two.
const (
	mapTableSlots = 1024
	mapTableKeys  = mapTableSlots * 7 / 8
	// mapTableFill is the mean keys per table a shard's recency map
	// (golang-lru's) is sized for at capacity: three standard deviations of a table's share of
	// evenly hashed keys below mapTableKeys, so that almost no table
	// splits before the shard is full.
	mapTableFill = 812
)

// defaultShards returns the default number of shards for a store of
// capacity keys: DefaultShards, halved while a shard would hold fewer than
// minShardCapacity keys; for large stores, the count between 3/4 and 3/2
// of DefaultShards whose recency maps (golang-lru's) take the fewest
// hash-table slots at capacity (the one nearest DefaultShards among
// equals).
func defaultShards(capacity int) int {
	n := DefaultShards
	for n > 1 && capacity/n < minShardCapacity {
		n /= 2
	}
	if capacity < DefaultShards*3/4*mapTableKeys {
		return n
	}
	best, bestSlots := n, indexSlots(capacity/n)*n
	for s := DefaultShards * 3 / 4; s <= DefaultShards*3/2; s++ {
		slots := indexSlots(capacity/s) * s
		if slots < bestSlots || slots == bestSlots && abs(s-DefaultShards) < abs(best-DefaultShards) {
			best, bestSlots = s, slots
		}
	}
	return best
}

// indexSlots estimates the hash-table slots of a Go map holding keys
// evenly hashed keys (at least mapTableKeys of them): a power of two of
// full-size tables, each holding at most mapTableFill keys on average.
func indexSlots(keys int) int {
	tables := 1
	for tables*mapTableFill < keys {
		tables *= 2
	}
	return tables * mapTableSlots
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// shard returns the shard of the record whose hash is h: the high bits of
// h scaled to the number of shards.
func (m *MemoryStore) shard(h uint64) int {
	hi, _ := bits.Mul64(h, m.nshards)
	return int(hi)
}

// MustMemoryStore is like NewMemoryStore but panics on a bad configuration.
func MustMemoryStore(cfg *MemoryConfig) *MemoryStore {
	m, err := NewMemoryStore(cfg)
	if err != nil {
		panic(err)
	}
	return m
}

// Len returns the number of keys held.
func (m *MemoryStore) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.count()
		s.mu.Unlock()
	}
	return n
}

// Capacity returns the most keys the store can hold: the per-shard bound
// times the number of shards, never more than MemoryConfig.Capacity.
func (m *MemoryStore) Capacity() int { return len(m.shards) * m.shards[0].cap }

// Evictions returns the number of keys evicted while they still held state
// since the store was made. A growing count means Capacity is too small for
// the traffic: evicted clients get a fresh quota.
func (m *MemoryStore) Evictions() uint64 { return m.evictions.Load() }

// hash returns the 64-bit hash of r's policy Name and key that finds its
// record; its high bits choose the shard.
func (m *MemoryStore) hash(r *Request) uint64 {
	return maphash.String(m.seed, r.Key) ^ r.Policy.nameHash
}

// evictedInfo describes an eviction to report once the locks are released.
type evictedInfo struct {
	name, key string
	stale     time.Duration
}

// held reports whether the record under h is one of the batch's, whose
// hashes are batch.
func held(h uint64, batch []uint64) bool {
	for _, b := range batch {
		if b == h {
			return true
		}
	}
	return false
}

// makeRoom frees space for need new keys in s, whose batch already holds
// own entries there (batch lists them; they are never removed). It drops
// recovered keys, or evicts held ones (counted and recorded in ev), or,
// with KeepActive, returns ErrStoreFull and the time until the least
// recently used key recovers. A batch that cannot fit in the shard at all
// gets ErrStoreFull and 0. Requires s.mu.
func (m *MemoryStore) makeRoom(s *memShard, need, own int, batch []uint64, now int64, ev []evictedInfo, nev *int) (int64, error) {
	if need+own > s.cap {
		return 0, fmt.Errorf("%w: a batch needs %d keys in a shard of %d", ErrStoreFull, need+own, s.cap)
	}
	if excess := s.count() + need - s.cap; m.keepActive && excess > 0 {
		// Room comes only when every one of the excess least recently
		// used keys has recovered: until the latest of them does.
		if wait := s.recoveryWait(excess, batch, now); wait > 0 {
			return wait, ErrStoreFull
		}
		for excess > 0 {
			k, _, _ := s.lru.GetOldest()
			if held(k, batch) {
				_, sl := s.get(k)
				s.renew(k, sl)
				continue
			}
			s.lru.RemoveOldest()
			excess--
		}
		return 0, nil
	}
	for s.count()+need > s.cap {
		var (
			firstKey  uint64
			firstName string
			firstExp  int64
			found     bool
			dropped   bool
		)
		for seen := 0; seen < EvictionScan; {
			k, ringed := s.oldest()
			if found && k == firstKey {
				break // every key of the shard has been examined
			}
			sl := s.load(k, &s.exam)
			if held(k, batch) {
				s.renew(k, sl)
				continue
			}
			seen++
			exp := s.exam.expiry()
			if exp <= now {
				s.dropOldest(k, ringed)
				dropped = true
				break
			}
			if !found {
				if m.observer != nil {
					// The report's Stale, as a decision at now leaves
					// the state (see clampExam).
					exp = s.clampExam(sl, now)
				}
				firstKey, firstName, firstExp, found = k, s.exam.pol.rule.Name, exp, true
			}
			s.renew(k, sl) // a second chance for a key holding state
		}
		s.exam = memEntry{}
		if dropped {
			continue
		}
		if *nev < len(ev) {
			ev[*nev] = evictedInfo{name: firstName, key: s.keys[firstKey], stale: time.Duration(firstExp - now)}
			*nev++
		}
		m.evictions.Add(1)
		s.noteEviction(firstKey, now)
		s.remove(firstKey)
	}
	return 0, nil
}

// recoveryWait returns how long until the excess least recently used keys
// of s outside the batch (whose hashes are batch) have all recovered by
// ClockTolerance (so that no decision, however late within it, would read
// their state again), 0 when they have. A state left ahead of a clock that stepped back is
// first written clamped, as a decision at now would write it (without
// renewing the key in the LRU), so that the wait is bounded by its rule's
// own recovery time and holds for the next decision. Requires s.mu.
func (s *memShard) recoveryWait(excess int, batch []uint64, now int64) int64 {
	var wait int64
	visit := func(k uint64) {
		if held(k, batch) {
			return // the batch's own keys are not made room from
		}
		excess--
		sl := s.load(k, &s.exam)
		if s.exam.expiry() > now-int64(ClockTolerance) {
			// Not yet forgettable: a decision up to ClockTolerance late
			// would still read the state as at its own time.
			wait = max(wait, s.clampExam(sl, now)+int64(ClockTolerance)-now)
		}
		s.exam = memEntry{}
	}
	if k, _, ok := s.lru.GetOldest(); ok && excess == 1 && !held(k, batch) {
		visit(k) // the usual case: one new key, the oldest makes room
		return wait
	}
	for _, k := range s.lru.Keys() { // oldest first
		if excess == 0 {
			break
		}
		visit(k)
	}
	return wait
}

// clampExam writes s.exam, the record loaded from sl, as a decision at now
// would leave it (a state left ahead of a clock that stepped back,
// clamped), and returns its expiry then. Requires s.mu.
func (s *memShard) clampExam(sl *memSlot, now int64) int64 {
	s.exam.pol.alg.Decide(s.exam.pol, &s.exam.st, 0, now, true, &s.dec)
	s.write(sl, &s.exam.st)
	return s.exam.expiry()
}

// insert stores st as the state of r, whose hash is h; makeRoom has made
// space. Requires s.mu.
func (m *MemoryStore) insert(s *memShard, h uint64, r *Request, st State) {
	s.cur = memEntry{st: st, pol: r.Policy}
	s.add(h, &s.cur)
	s.cur = memEntry{}
	if s.keys != nil {
		s.keys[h] = strings.Clone(r.Key)
	}
}

func (m *MemoryStore) report(ev []evictedInfo, n int) {
	if m.observer == nil {
		return
	}
	for i := 0; i < n; i++ {
		m.observer.ObserveEviction(EvictionEvent{PolicyName: ev[i].name, Key: ev[i].key, Stale: ev[i].stale})
	}
}

// Take implements Store.
func (m *MemoryStore) Take(_ context.Context, now time.Time, reqs []Request, out []Decision) error {
	return m.take(reqs, out, ClampTime(now))
}

// take is Take at Unix nanosecond now.
func (m *MemoryStore) take(reqs []Request, out []Decision, now int64) error {
	now = clampNanos(now)
	if len(reqs) == 1 && len(out) >= 1 {
		// The single-request fast path of CheckBatch.
		r := &reqs[0]
		if r.Policy != nil && r.Cost >= 1 && r.Cost <= r.Policy.capacity {
			return m.takeOne(r, now, &out[0])
		}
	}
	over, err := CheckBatch(reqs, out)
	if err != nil && !errors.Is(err, ErrCostExceedsCapacity) {
		return err
	}
	if len(reqs) == 1 && over < 0 {
		return m.takeOne(&reqs[0], now, &out[0])
	}
	return m.takeBatch(reqs, out, now, over)
}

func (m *MemoryStore) takeOne(r *Request, now int64, out *Decision) error {
	p := r.Policy
	h := m.hash(r)
	s := &m.shards[m.shard(h)]
	s.mu.Lock()
	if s.hotOK && s.hotH == h && s.hotPol == p {
		// The hot key under its own policy: the decision reads and writes
		// the cache line of the lock alone.
		st := State{A: s.hotA, B: s.hotB}
		decideBuiltin(p, &st, r.Cost, now, true, out)
		s.hotA, s.hotB = st.A, st.B
		if s.drifted(s.hotRef) {
			s.hotRef.stamp = s.front(h)
		}
		s.mu.Unlock()
		return nil
	}
	s.flush()
	last := s.lastH
	s.lastH = h
	var e memEntry
	ref, sl, ok := s.find(h, &e)
	if !ok {
		return m.takeNew(s, h, r, now, out)
	}
	if e.pol != p || !decideBuiltin(p, &e.st, r.Cost, now, true, out) {
		return m.takeOther(s, h, ref, sl, e, r, now, out)
	}
	ref = s.put(h, ref, sl, &e)
	if last == h && hotAlgorithm(p) {
		s.hotOK, s.hotH, s.hotRef, s.hotPol, s.hotA, s.hotB = true, h, ref, p, sl.A, sl.B
	}
	s.mu.Unlock()
	return nil
}

// flush ends the shard's hot record, if any: it writes its State back to
// its slot. Every access to a shard but takeOne's to its hot key flushes
// first (see lock), so that the slots, the LRU and the policy table hold
// every record as it is. Requires s.mu.
func (s *memShard) flush() {
	if s.hotOK {
		sl := &s.slab[s.hotRef.slot]
		sl.A, sl.B, sl.stamp = s.hotA, s.hotB, s.hotRef.stamp
		s.hotOK, s.hotPol = false, nil
	}
}

// lock locks the shard for any access but takeOne's: it flushes the hot
// record.
func (s *memShard) lock() {
	s.mu.Lock()
	s.flush()
}

// hotAlgorithm reports whether a key under p may be the hot record: p's
// algorithm is a built-in one whose State is its two integers (not the
// sliding log, whose timestamps live apart).
func hotAlgorithm(p *Policy) bool {
	switch p.alg.(type) {
	case tokenBucket, leakyBucket, fixedWindow, slidingWindowCounter:
		return true
	}
	return false
}

// takeOther is takeOne for e, the record loaded from sl, when it was
// written under another policy or its policy's algorithm is not one of the
// built-ins: the interface call decides in the shard's scratch fields,
// which (unlike the caller's stack) it cannot move to the heap. Requires
// s.mu, and releases it.
//
//go:noinline
func (m *MemoryStore) takeOther(s *memShard, h uint64, ref memRef, sl *memSlot, e memEntry, r *Request, now int64, out *Decision) error {
	p := r.Policy
	s.cur = e
	conv := converted(&s.cur, p)
	lost := s.adopt(&s.cur, p, now)
	p.alg.Decide(p, &s.cur.st, r.Cost, now, true, &s.dec)
	if conv && (lost || !s.dec.Allowed) {
		// A conversion is stored only with a charge: refused, e stays as
		// it was, and requests under its own policy find it so.
		d := s.dec
		s.refuseConverted(e, h, p, r.Cost, now, &d, lost)
		s.cur = memEntry{}
		*out = d
		s.mu.Unlock()
		return nil
	}
	s.put(h, ref, sl, &s.cur)
	s.cur = memEntry{}
	*out = s.dec
	s.mu.Unlock()
	return nil
}

// decide is p's Decide into st and d, which may be on the caller's stack:
// the built-in algorithms are called directly; any other decides in the
// shard's scratch fields (through the Algorithm interface, st and d would
// escape to the heap), copied in and out. Requires s.mu.
func (s *memShard) decide(p *Policy, st *State, cost, now int64, commit bool, d *Decision) {
	if decideBuiltin(p, st, cost, now, commit, d) {
		return
	}
	s.scratch = *st
	p.alg.Decide(p, &s.scratch, cost, now, commit, &s.dec)
	*st, *d = s.scratch, s.dec
	s.scratch = State{}
}

// takeNew is takeOne for a key the store does not hold, apart so that the
// common case keeps a small frame. Requires s.mu, and releases it.
//
//go:noinline
func (m *MemoryStore) takeNew(s *memShard, h uint64, r *Request, now int64, out *Decision) error {
	var ev [1]evictedInfo
	nev := 0
	p := r.Policy
	var (
		err error
		st  State
	)
	s.decide(p, &st, r.Cost, now, true, out)
	if out.Allowed {
		var retry int64
		if retry, err = m.makeRoom(s, 1, 0, nil, now, ev[:], &nev); err == nil {
			m.insert(s, h, r, st)
		} else {
			st = State{}
			s.decide(p, &st, 0, now, false, out)
			out.Allowed = false
			out.RetryAfter = time.Duration(retry)
		}
	}
	s.mu.Unlock()
	if nev > 0 {
		m.report(ev[:], nev)
	}
	return err
}

func (m *MemoryStore) takeBatch(reqs []Request, out []Decision, now int64, over int) error {
	var (
		shardIdx [MaxBatch]int
		order    [MaxBatch]int // distinct shard indices, ascending
		hashes   [MaxBatch]uint64
		entries  [MaxBatch]memEntry // copies of the held records
		found    [MaxBatch]bool
		conv     [MaxBatch]bool     // entries[i] converted from another policy's: stored only with a charge
		lost     [MaxBatch]bool     // and with units dropped: refused (see adopt)
		olds     [MaxBatch]memEntry // the records converted, as held
		ev       [MaxBatch]evictedInfo
	)
	n, nev := len(reqs), 0
	nord := m.lockOrder(reqs, &hashes, &shardIdx, &order)
	for _, si := range order[:nord] {
		m.shards[si].lock()
	}
	all := true
	for i := 0; i < n; i++ {
		r := &reqs[i]
		s := &m.shards[shardIdx[i]]
		var st *State
		if _, sl, ok := s.find(hashes[i], &s.cur); ok {
			// To the front, so that making room keeps the batch's keys.
			s.renew(hashes[i], sl)
			found[i] = true
			olds[i], conv[i] = s.cur, converted(&s.cur, r.Policy)
			lost[i] = s.adopt(&s.cur, r.Policy, now)
			st = &s.cur.st
		} else {
			s.scratch = State{}
			st = &s.scratch
		}
		// Every request over its capacity (CheckBatch names the first) is
		// decided at cost 0 and refused with no RetryAfter: Decide takes
		// no cost above the capacity.
		cost, big := r.Cost, r.Cost > r.Policy.capacity
		if big {
			cost = 0
		}
		r.Policy.alg.Decide(r.Policy, st, cost, now, false, &s.dec)
		if found[i] {
			entries[i] = s.cur
		}
		out[i] = s.dec
		if big {
			out[i].Allowed = false
			out[i].RetryAfter = 0
		} else if lost[i] || (conv[i] && !out[i].Allowed) { // refused (see takeOther)
			s.refuseConverted(olds[i], hashes[i], r.Policy, cost, now, &out[i], lost[i])
		}
		all = all && out[i].Allowed
	}
	var err error
	var retry int64
	if all {
		// Make room for the new keys first, so that a store refusing one
		// leaves the whole batch uncharged. Every shard is examined, so
		// that RetryAfter covers them all.
		never := false
		var needs, owns [MaxBatch]int // by position in order
		for k, si := range order[:nord] {
			for i := 0; i < n; i++ {
				if shardIdx[i] == si {
					if !found[i] {
						needs[k]++
					} else {
						owns[k]++
					}
				}
			}
			if needs[k] > 0 && needs[k]+owns[k] > m.shards[si].cap {
				// This batch can never fit: refuse it before any shard
				// evicts a key for it.
				err = fmt.Errorf("%w: a batch needs %d keys in a shard of %d", ErrStoreFull, needs[k]+owns[k], m.shards[si].cap)
				never = true
			}
		}
		for k, si := range order[:nord] {
			if never {
				break
			}
			if needs[k] == 0 {
				continue
			}
			r, e := m.makeRoom(&m.shards[si], needs[k], owns[k], hashes[:n], now, ev[:], &nev)
			if e != nil {
				err = e
				retry = max(retry, r)
			}
		}
		if never {
			retry = 0
		}
		if err != nil {
			all = false
		}
	}
	if all {
		for i := 0; i < n; i++ {
			r := &reqs[i]
			p := r.Policy
			s := &m.shards[shardIdx[i]]
			if found[i] {
				s.cur = entries[i]
				p.alg.Decide(p, &s.cur.st, r.Cost, now, true, &s.dec)
				s.putAgain(hashes[i], &s.cur)
				out[i] = s.dec
				continue
			}
			s.scratch = State{}
			p.alg.Decide(p, &s.scratch, r.Cost, now, true, &s.dec)
			out[i] = s.dec
			if s.holds(hashes[i]) {
				// Another request of the batch, whose (Name, key) shares
				// this hash, has just stored it: they share a record.
				s.cur = memEntry{st: s.scratch, pol: p}
				s.putAgain(hashes[i], &s.cur)
			} else {
				m.insert(s, hashes[i], r, s.scratch)
			}
			s.scratch = State{}
		}
	} else {
		// Report the uncharged state of the requests that would have
		// passed. Held states are decided with commit, at cost 0: that
		// charges nothing, and rewrites a state left ahead of a clock that
		// stepped back (see Algorithm.Decide).
		for i := 0; i < n; i++ {
			r := &reqs[i]
			s := &m.shards[shardIdx[i]]
			refused := !out[i].Allowed // by its policy; with err nil
			if found[i] {
				// A conversion is stored only with a charge (see
				// takeOther): reported, not stored.
				s.cur = entries[i]
				r.Policy.alg.Decide(r.Policy, &s.cur.st, 0, now, !conv[i], &s.dec)
				if !conv[i] {
					s.putAgain(hashes[i], &s.cur)
				}
			} else if !refused {
				s.scratch = State{}
				r.Policy.alg.Decide(r.Policy, &s.scratch, 0, now, false, &s.dec)
			}
			if refused {
				continue // keep the refusal as decided, with its RetryAfter
			}
			out[i] = s.dec
			if err != nil {
				out[i].Allowed = false
				out[i].RetryAfter = time.Duration(retry)
			}
		}
	}
	for k := nord - 1; k >= 0; k-- {
		s := &m.shards[order[k]]
		s.cur = memEntry{}
		s.mu.Unlock()
	}
	if nev > 0 {
		m.report(ev[:], nev)
	}
	if over >= 0 {
		return fmt.Errorf("%w: %q capacity %d, cost %d", ErrCostExceedsCapacity, reqs[over].Policy.rule.Name, reqs[over].Policy.capacity, reqs[over].Cost)
	}
	return err
}
