package core

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// DefaultCapacity is the number of keys a MemoryStore holds when its
// configuration sets none: about 18 MB of state at the measured ~180 bytes
// per key.
const DefaultCapacity = 100_000

// DefaultShards is the number of shards of a MemoryStore whose capacity is
// at least DefaultShards x minShardCapacity.
const DefaultShards = 64

// minShardCapacity keeps every shard larger than a batch, so that charging
// a batch never evicts a key of the same batch.
const minShardCapacity = 4 * MaxBatch

// MemoryConfig configures a MemoryStore. A nil *MemoryConfig means the
// defaults.
type MemoryConfig struct {
	// Capacity is the most keys the store holds. The default value is
	// DefaultCapacity. It is spread evenly over the shards, so the bound is
	// per shard: a shard full of recently used keys evicts its least
	// recently used key even if another shard has room.
	Capacity int

	// Shards is the number of independently locked shards, rounded up to a
	// power of two. The default value is DefaultShards, reduced for small
	// capacities so that each shard holds at least 64 keys.
	Shards int

	// KeepActive, when true, never evicts a key that still holds state:
	// a new key meeting a full shard whose least recently used key has not
	// recovered is refused with ErrStoreFull (the caller's fail policy
	// decides the request), so a client over its limit cannot be released
	// by a flood of other keys. The default value, false, evicts the least
	// recently used key, counts the eviction and reports it to the Observer.
	// Keys that have fully recovered are dropped first in both modes.
	KeepActive bool

	// Observer receives evictions of keys that still held state. The
	// default value is none.
	Observer Observer
}

// MemoryStore is the in-memory Store: per-key state in sharded, LRU-bounded
// maps (github.com/hashicorp/golang-lru/v2), each shard guarded by its own
// mutex, so decisions on different keys rarely contend and each decision is
// one atomic read-check-update under its shard's lock. A batch locks its
// shards in index order.
//
// Deciding an existing key allocates nothing. A new key costs one
// allocation for its state and one for its name. Keys whose quota has fully
// recovered are forgotten first when a shard is full: forgetting them
// changes no decision.
//
// It is safe for concurrent use and needs no Close.
type MemoryStore struct {
	shards     []memShard
	mask       uint64
	seed       maphash.Seed
	keepActive bool
	observer   Observer
	evictions  atomic.Uint64
}

var _ Store = (*MemoryStore)(nil)

type memEntry struct {
	st State
	// exp is the Unix second from which st equals a fresh state (rounded
	// up, so never early); touched is the Unix second at which the entry
	// was last moved to the front of its LRU.
	exp, touched uint32
}

// unixSec converts Unix ns to a Unix second in uint32, rounding up and
// clamping (a state that never expires stays at the maximum).
func unixSec(ns int64) uint32 {
	if ns <= 0 {
		return 0
	}
	s := (ns + 999_999_999) / 1e9
	if s > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(s)
}

// setExp records the expiry of the entry's state under p.
func (e *memEntry) setExp(p *Policy) { e.exp = unixSec(p.alg.Expiry(p, &e.st)) }

type memShard struct {
	mu      sync.Mutex
	lru     *simplelru.LRU[string, *memEntry]
	cap     int
	buf     []byte    // scratch space for composite keys; guarded by mu
	scratch State     // state of a key not yet stored; guarded by mu
	dec     Decision  // scratch decision, so that callers' decisions stay on their stacks; guarded by mu
	free    *memEntry // an evicted entry kept for the next new key; guarded by mu
	_       [64]byte
}

// NewMemoryStore returns a MemoryStore configured by cfg (nil for the
// defaults). It returns an error for a negative Capacity or Shards.
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
	n := c.Shards
	if n == 0 {
		n = DefaultShards
		for n > 1 && c.Capacity/n < minShardCapacity {
			n /= 2
		}
	}
	shards := 1
	for shards < n {
		shards *= 2
	}
	per := max((c.Capacity+shards-1)/shards, minShardCapacity)
	m := &MemoryStore{
		shards:     make([]memShard, shards),
		mask:       uint64(shards - 1),
		seed:       maphash.MakeSeed(),
		keepActive: c.KeepActive,
		observer:   c.Observer,
	}
	for i := range m.shards {
		l, err := simplelru.NewLRU[string, *memEntry](per, nil)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: memory store: %w", err)
		}
		m.shards[i].lru = l
		m.shards[i].cap = per
	}
	return m, nil
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
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// Capacity returns the most keys the store can hold (the per-shard bound
// times the number of shards).
func (m *MemoryStore) Capacity() int { return len(m.shards) * m.shards[0].cap }

// Evictions returns the number of keys evicted while they still held state
// since the store was made. A growing count means Capacity is too small for
// the traffic: evicted clients get a fresh quota.
func (m *MemoryStore) Evictions() uint64 { return m.evictions.Load() }

func (m *MemoryStore) shardOf(r *Request) int {
	return int((maphash.String(m.seed, r.Key) ^ r.Policy.nameHash) & m.mask)
}

// lookupKey builds the composite key "name\x00key" in the shard's scratch
// buffer and returns it as a string that aliases the buffer: valid only
// until the next lookupKey on this shard, and never stored. Requires s.mu.
func (s *memShard) lookupKey(r *Request) string {
	s.buf = append(append(append(s.buf[:0], r.Policy.rule.Name...), 0), r.Key...)
	return unsafe.String(unsafe.SliceData(s.buf), len(s.buf))
}

func storedKey(r *Request) string {
	return r.Policy.rule.Name + "\x00" + r.Key
}

// get returns the entry of r, or nil, and moves it to the front of the
// LRU. Requires s.mu.
func (s *memShard) get(r *Request) *memEntry {
	e, _ := s.lru.Get(s.lookupKey(r))
	return e
}

// peek returns the entry of r, or nil, moving it to the front of the LRU
// at most once per second: recency is kept to the second, and most
// decisions on a known key write nothing outside the key's own entry.
// Requires s.mu.
func (s *memShard) peek(r *Request, now int64) *memEntry {
	k := s.lookupKey(r)
	e, ok := s.lru.Peek(k)
	if !ok {
		return nil
	}
	if sec := uint32(now / 1e9); e.touched != sec {
		e.touched = sec
		s.lru.Get(k)
	}
	return e
}

// evictedInfo describes an eviction to report once the locks are released.
type evictedInfo struct {
	key   string
	stale time.Duration
}

// makeRoom frees space for need new keys in s: it drops least recently
// used keys, counting and recording those that still held state, or, with
// KeepActive, returns ErrStoreFull rather than drop one. Requires s.mu.
func (m *MemoryStore) makeRoom(s *memShard, need int, now int64, ev []evictedInfo, nev *int) error {
	for s.lru.Len()+need > s.cap {
		k, old, ok := s.lru.GetOldest()
		if !ok {
			return nil
		}
		if exp := int64(old.exp) * 1e9; exp > now {
			if m.keepActive {
				return ErrStoreFull
			}
			if *nev < len(ev) {
				ev[*nev] = evictedInfo{key: k, stale: time.Duration(exp - now)}
				*nev++
			}
			m.evictions.Add(1)
		}
		s.lru.RemoveOldest()
		// Nothing else refers to an evicted entry (a batch's own entries
		// are at the front): keep it for the next new key, so that a
		// full store allocates no state for the keys it admits.
		*old = memEntry{}
		s.free = old
	}
	return nil
}

// insert stores st as the state of r at now; makeRoom has made space.
// Requires s.mu.
func (m *MemoryStore) insert(s *memShard, r *Request, st State, now int64) {
	e := s.free
	if e != nil {
		s.free = nil
	} else {
		e = new(memEntry)
	}
	*e = memEntry{st: st, touched: uint32(now / 1e9)}
	e.setExp(r.Policy)
	s.lru.Add(storedKey(r), e)
}

func (m *MemoryStore) report(ev []evictedInfo, n int) {
	if m.observer == nil {
		return
	}
	for i := 0; i < n; i++ {
		name, key := ev[i].key, ""
		for j := 0; j < len(name); j++ {
			if name[j] == 0 {
				name, key = name[:j], name[j+1:]
				break
			}
		}
		m.observer.ObserveEviction(EvictionEvent{PolicyName: name, Key: key, Stale: ev[i].stale})
	}
}

// Take implements Store.
func (m *MemoryStore) Take(_ context.Context, now time.Time, reqs []Request, out []Decision) error {
	return m.take(reqs, out, now.UnixNano())
}

// take is Take at Unix nanosecond now.
func (m *MemoryStore) take(reqs []Request, out []Decision, now int64) error {
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
	s := &m.shards[m.shardOf(r)]
	s.mu.Lock()
	e := s.peek(r, now)
	if e == nil {
		return m.takeNew(s, r, now, out)
	}
	p.alg.Decide(p, &e.st, r.Cost, now, true, &s.dec)
	*out = s.dec
	if out.Allowed {
		e.setExp(p)
	}
	s.mu.Unlock()
	return nil
}

// takeNew is takeOne for a key the store does not hold, apart so that the
// common case keeps a small frame. Requires s.mu, and releases it.
//
//go:noinline
func (m *MemoryStore) takeNew(s *memShard, r *Request, now int64, out *Decision) error {
	var ev [1]evictedInfo
	nev := 0
	p := r.Policy
	var err error
	s.scratch = State{}
	p.alg.Decide(p, &s.scratch, r.Cost, now, true, &s.dec)
	*out = s.dec
	if out.Allowed {
		if err = m.makeRoom(s, 1, now, ev[:], &nev); err == nil {
			m.insert(s, r, s.scratch, now)
		} else {
			p.alg.Decide(p, &s.scratch, 0, now, false, &s.dec)
			*out = s.dec
			out.Allowed = false
		}
	}
	s.scratch = State{}
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
		entries  [MaxBatch]*memEntry
		ev       [MaxBatch]evictedInfo
	)
	n, nev := len(reqs), 0
	nord := 0
	for i := range reqs {
		si := m.shardOf(&reqs[i])
		shardIdx[i] = si
		j := nord
		for j > 0 && order[j-1] > si {
			j--
		}
		if j > 0 && order[j-1] == si {
			continue
		}
		copy(order[j+1:nord+1], order[j:nord])
		order[j] = si
		nord++
	}
	for _, si := range order[:nord] {
		m.shards[si].mu.Lock()
	}
	all := true
	for i := 0; i < n; i++ {
		r := &reqs[i]
		s := &m.shards[shardIdx[i]]
		e := s.get(r)
		entries[i] = e
		st := &s.scratch
		if e != nil {
			st = &e.st
		} else {
			s.scratch = State{}
		}
		cost := r.Cost
		if i == over {
			cost = 0
		}
		r.Policy.alg.Decide(r.Policy, st, cost, now, false, &s.dec)
		out[i] = s.dec
		if i == over {
			out[i].Allowed = false
			out[i].RetryAfter = 0
		}
		all = all && out[i].Allowed
	}
	var err error
	if all {
		// Make room for the new keys first, so that a store refusing one
		// (KeepActive) leaves the whole batch uncharged.
		for _, si := range order[:nord] {
			need := 0
			for i := 0; i < n; i++ {
				if shardIdx[i] == si && entries[i] == nil {
					need++
				}
			}
			if need > 0 {
				if err = m.makeRoom(&m.shards[si], need, now, ev[:], &nev); err != nil {
					break
				}
			}
		}
		if err != nil {
			all = false
			for i := 0; i < n; i++ {
				out[i].Allowed = false
			}
		}
	}
	if all {
		for i := 0; i < n; i++ {
			r := &reqs[i]
			p := r.Policy
			s := &m.shards[shardIdx[i]]
			if e := entries[i]; e != nil {
				p.alg.Decide(p, &e.st, r.Cost, now, true, &s.dec)
				out[i] = s.dec
				e.setExp(p)
				continue
			}
			s.scratch = State{}
			p.alg.Decide(p, &s.scratch, r.Cost, now, true, &s.dec)
			out[i] = s.dec
			m.insert(s, r, s.scratch, now)
			s.scratch = State{}
		}
	} else {
		// Report the uncharged state of the requests that would have passed.
		for i := 0; i < n; i++ {
			if !out[i].Allowed && err == nil {
				continue
			}
			r := &reqs[i]
			s := &m.shards[shardIdx[i]]
			st := &s.scratch
			if e := entries[i]; e != nil {
				st = &e.st
			} else {
				s.scratch = State{}
			}
			r.Policy.alg.Decide(r.Policy, st, 0, now, false, &s.dec)
			out[i] = s.dec
			out[i].Allowed = err == nil
		}
	}
	for k := nord - 1; k >= 0; k-- {
		m.shards[order[k]].mu.Unlock()
	}
	if nev > 0 {
		m.report(ev[:], nev)
	}
	if over >= 0 {
		return fmt.Errorf("%w: %q capacity %d, cost %d", ErrCostExceedsCapacity, reqs[over].Policy.rule.Name, reqs[over].Policy.capacity, reqs[over].Cost)
	}
	return err
}
