package bench

import (
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/limitry/ratelimit/core"
)

// BenchmarkLRULayout isolates the cost of the per-key structure behind
// Keys100kParallel: look a key up among 100,000 and update its 24-byte
// state, from 2 goroutines, in 64 locked shards, with no clock and no
// algorithm. "golang-lru" keeps the state behind a pointer in a
// simplelru.LRU[string, *state], as core.MemoryStore once did;
// "golang-lru-hash" keeps it inline in a simplelru.LRU[uint64, state] keyed
// by the key's maphash, read with Peek and written back with Add (which
// moves the key to the front), as core.MemoryStore did until it took the
// "golang-lru-slot" layout (its layout until it took "slab-index"): the
// LRU maps the hash to a slot of a per-shard slab, written in place, and a
// key goes to the front only when it may have drifted into the back half
// of its shard; "golang-lru-hash-ptr" keys
// a simplelru.LRU[uint64, *state] by the hash and writes the state in
// place, without moving the key; "slab" keeps the state in a node of a
// per-shard slice indexed by a map[string]uint32, with no LRU at all;
// "slab-index", core.MemoryStore's layout, makes the slab the index: each
// 32-byte slot holds the key's hash beside its state, its policy and its
// stamp, keys are placed by linear probing from their home slot, and a
// simplelru.LRU[uint64, struct{}] (64-byte entries) keeps only the order,
// touched when a key may have drifted. The LRUs hold twice the keys, as Keys100kParallel's store
// does, and the slab-index slab has 5/4 of a slot for each key the shard
// can hold.
func BenchmarkLRULayout(b *testing.B) { benchLRULayout(b, 100_000) }

// BenchmarkLRULayoutWarm is BenchmarkLRULayout over 10,000 keys, a working
// set that stays in the caches of this machine, as the middleware
// workloads' 10,000 client IPs do: what is left is mostly the memory the
// two cores write and must pass back and forth.
func BenchmarkLRULayoutWarm(b *testing.B) { benchLRULayout(b, 10_000) }

func benchLRULayout(b *testing.B, n int) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%014d", i)
	}
	lookups := make([]string, n) // fresh copies, as a server builds keys
	for i, k := range keys {
		lookups[i] = string([]byte(k))
	}
	seed := maphash.MakeSeed()
	shard := func(k string) uint64 { return maphash.String(seed, k) & 63 }
	run := func(b *testing.B, do func(k string)) {
		var seq atomic.Uint64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			for pb.Next() {
				i += 7919
				do(lookups[i%uint64(n)])
			}
		})
	}
	type state struct {
		a, b    int64
		exp, at uint32
	}
	b.Run("golang-lru", func(b *testing.B) {
		var shards [64]struct {
			mu sync.Mutex
			l  *simplelru.LRU[string, *state]
			_  [112]byte
		}
		for i := range shards {
			shards[i].l, _ = simplelru.NewLRU[string, *state](2*n/64, nil)
		}
		for _, k := range keys {
			shards[shard(k)].l.Add(k, &state{})
		}
		run(b, func(k string) {
			s := &shards[shard(k)]
			s.mu.Lock()
			if e, ok := s.l.Peek(k); ok {
				e.a++
			}
			s.mu.Unlock()
		})
	})
	b.Run("golang-lru-hash", func(b *testing.B) {
		var shards [64]struct {
			mu sync.Mutex
			l  *simplelru.LRU[uint64, state]
			_  [112]byte
		}
		for i := range shards {
			shards[i].l, _ = simplelru.NewLRU[uint64, state](2*n/64, nil)
		}
		for _, k := range keys {
			h := maphash.String(seed, k)
			shards[h&63].l.Add(h, state{})
		}
		run(b, func(k string) {
			h := maphash.String(seed, k)
			s := &shards[h&63]
			s.mu.Lock()
			if e, ok := s.l.Peek(h); ok {
				e.a++
				s.l.Add(h, e)
			}
			s.mu.Unlock()
		})
	})
	b.Run("golang-lru-slot", func(b *testing.B) {
		type ref struct {
			slot, pol uint32
			stamp     uint64
		}
		per := 2 * n / 64
		var shards [64]struct {
			mu   sync.Mutex
			l    *simplelru.LRU[uint64, ref]
			slab []state
			tick uint64
			_    [80]byte
		}
		for i := range shards {
			shards[i].l, _ = simplelru.NewLRU[uint64, ref](per, nil)
		}
		for _, k := range keys {
			h := maphash.String(seed, k)
			s := &shards[h&63]
			s.tick++
			s.l.Add(h, ref{slot: uint32(len(s.slab)), stamp: s.tick})
			s.slab = append(s.slab, state{})
		}
		run(b, func(k string) {
			h := maphash.String(seed, k)
			s := &shards[h&63]
			s.mu.Lock()
			if e, ok := s.l.Peek(h); ok {
				s.slab[e.slot].a++
				if s.tick-e.stamp > uint64(per/2) && s.l.Len() > per/2+1 {
					s.tick++
					e.stamp = s.tick
					s.l.Add(h, e)
				}
			}
			s.mu.Unlock()
		})
	})
	b.Run("golang-lru-hash-ptr", func(b *testing.B) {
		var shards [64]struct {
			mu sync.Mutex
			l  *simplelru.LRU[uint64, *state]
			_  [112]byte
		}
		for i := range shards {
			shards[i].l, _ = simplelru.NewLRU[uint64, *state](2*n/64, nil)
		}
		for _, k := range keys {
			h := maphash.String(seed, k)
			shards[h&63].l.Add(h, &state{})
		}
		run(b, func(k string) {
			h := maphash.String(seed, k)
			s := &shards[h&63]
			s.mu.Lock()
			if e, ok := s.l.Peek(h); ok {
				e.a++
			}
			s.mu.Unlock()
		})
	})
	b.Run("slab-index", func(b *testing.B) {
		type slot struct {
			h          uint64 // the key's hash, never 0; 0: free
			a, b       int64
			pol, stamp uint32
		}
		per := 2 * n / 64
		var shards [64]struct {
			mu   sync.Mutex
			l    *simplelru.LRU[uint64, struct{}]
			slab []slot
			tick uint32
			_    [80]byte
		}
		for i := range shards {
			shards[i].l, _ = simplelru.NewLRU[uint64, struct{}](per, nil)
			shards[i].slab = make([]slot, per*5/4)
		}
		hash := func(k string) uint64 { return maphash.String(seed, k) | 1<<63 } // never 0
		home := func(h uint64, n int) int { return int(uint64(uint32(h>>6)) * uint64(n) >> 32) }
		for _, k := range keys {
			h := hash(k)
			s := &shards[h&63]
			s.tick++
			i := home(h, len(s.slab))
			for s.slab[i].h != 0 {
				if i++; i == len(s.slab) {
					i = 0
				}
			}
			s.slab[i] = slot{h: h, stamp: s.tick}
			s.l.Add(h, struct{}{})
		}
		run(b, func(k string) {
			h := hash(k)
			s := &shards[h&63]
			s.mu.Lock()
			for i := home(h, len(s.slab)); s.slab[i].h != 0; {
				if sl := &s.slab[i]; sl.h == h {
					sl.a++
					if s.tick-sl.stamp > uint32(per/2) && s.l.Len() > per/2+1 {
						s.tick++
						sl.stamp = s.tick
						s.l.Get(h) // to the front
					}
					break
				}
				if i++; i == len(s.slab) {
					i = 0
				}
			}
			s.mu.Unlock()
		})
	})
	b.Run("slab", func(b *testing.B) {
		type node struct {
			key        string
			st         state
			prev, next uint32
		}
		var shards [64]struct {
			mu    sync.Mutex
			index map[string]uint32
			nodes []node
			_     [88]byte
		}
		for i := range shards {
			shards[i].index = map[string]uint32{}
		}
		for _, k := range keys {
			s := &shards[shard(k)]
			s.index[k] = uint32(len(s.nodes))
			s.nodes = append(s.nodes, node{key: k})
		}
		run(b, func(k string) {
			s := &shards[shard(k)]
			s.mu.Lock()
			if i, ok := s.index[k]; ok {
				s.nodes[i].st.a++
			}
			s.mu.Unlock()
		})
	})
}

// BenchmarkLRUInsert isolates the cost of the per-key structure behind
// NewKey: store a key never seen before, from one goroutine, in 64 locked
// shards holding memCapacity keys in all, with no clock and no algorithm.
// "golang-lru-slot" is core.MemoryStore's structure, full: look the key's
// hash up (a miss), drop the least recently used key (its slot goes back to
// the shard's free list), add the new one in the slot freed.
// "map" is an unbounded map[uint64]state per shard, looked up and
// inserted into, and cleared whenever it reaches its share of memCapacity
// (as httprate clears its maps every window; clear keeps the map's
// tables). Their difference is what the bound costs a new key.
// "map-fifo" is the cheapest bound on a Go map, golang-lru's index: the
// same map, full, dropping its oldest key for each new one (first in,
// first out, from a ring of the keys in the order they came: no recency,
// no list, no allocation). Its difference from "map" is what a bound on
// such an index costs a new key at least: another key's entry to find and
// delete.
func BenchmarkLRUInsert(b *testing.B) {
	const n = 1 << 20
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("n%014d", i)
	}
	seed := maphash.MakeSeed()
	type state struct {
		a, b    int64
		exp, at uint32
	}
	const per = memCapacity / 64
	run := func(b *testing.B, do func(h uint64)) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			do(maphash.String(seed, keys[i%n]))
		}
	}
	b.Run("golang-lru-slot", func(b *testing.B) {
		type ref struct {
			slot, pol uint32
			stamp     uint64
		}
		type shard struct {
			mu   sync.Mutex
			l    *simplelru.LRU[uint64, ref]
			slab []state
			free []uint32
			tick uint64
			_    [56]byte
		}
		var shards [64]shard
		for i := range shards {
			s := &shards[i]
			s.l, _ = simplelru.NewLRU[uint64, ref](per, func(_ uint64, r ref) { s.free = append(s.free, r.slot) })
			s.slab = make([]state, per)
			for j := 0; j < per; j++ {
				s.tick++
				s.l.Add(uint64(i)<<56|uint64(j), ref{slot: uint32(j), stamp: s.tick})
			}
		}
		run(b, func(h uint64) {
			s := &shards[h&63]
			s.mu.Lock()
			if _, ok := s.l.Peek(h); !ok {
				if s.l.Len() >= per {
					s.l.RemoveOldest()
				}
				slot := s.free[len(s.free)-1]
				s.free = s.free[:len(s.free)-1]
				s.slab[slot] = state{a: 1}
				s.tick++
				s.l.Add(h, ref{slot: slot, stamp: s.tick})
			}
			s.mu.Unlock()
		})
	})
	b.Run("map", func(b *testing.B) {
		var shards [64]struct {
			mu sync.Mutex
			m  map[uint64]state
			_  [112]byte
		}
		for i := range shards {
			shards[i].m = make(map[uint64]state)
			for j := 0; j < per-1; j++ {
				shards[i].m[uint64(i)<<56|uint64(j)] = state{}
			}
		}
		run(b, func(h uint64) {
			s := &shards[h&63]
			s.mu.Lock()
			if _, ok := s.m[h]; !ok {
				if len(s.m) >= per {
					clear(s.m)
				}
				s.m[h] = state{a: 1}
			}
			s.mu.Unlock()
		})
	})
	b.Run("map-fifo", func(b *testing.B) {
		var shards [64]struct {
			mu   sync.Mutex
			m    map[uint64]state
			ring []uint64 // the shard's keys in the order they came
			next int      // ring's oldest key, replaced by the next new one
			_    [80]byte
		}
		for i := range shards {
			s := &shards[i]
			s.m = make(map[uint64]state)
			s.ring = make([]uint64, per)
			for j := range per {
				k := uint64(i)<<56 | uint64(j)
				s.m[k] = state{}
				s.ring[j] = k
			}
		}
		run(b, func(h uint64) {
			s := &shards[h&63]
			s.mu.Lock()
			if _, ok := s.m[h]; !ok {
				delete(s.m, s.ring[s.next])
				s.ring[s.next] = h
				if s.next++; s.next == per {
					s.next = 0
				}
				s.m[h] = state{a: 1}
			}
			s.mu.Unlock()
		})
	})
}

// growShards is the number of shards core.MemoryStore takes by default for
// heapCapacity keys (BenchmarkLRUInsertGrowing checks it).
const growShards = 81

// BenchmarkLRUInsertGrowing isolates the cost of the per-key structure
// behind NewKeyGrowing: store heapKeys keys never seen before, from one
// goroutine, in growShards locked shards that start empty and hold
// heapCapacity keys in all (none is ever evicted), with no clock and no
// algorithm. Timed with -benchtime 1000000x (heapKeys), one run is one
// growth from empty to full, after a throwaway one that grows the
// process's heap (as in BenchmarkNewKeyGrowing).
// "golang-lru" is the least that a store finding its keys' state through
// golang-lru does for a new key: look the key's hash up (a miss) and add
// it with a 4-byte value (where its state would be), and nothing else.
// "golang-lru-slot" is core.MemoryStore's structure without its placement:
// look the hash up (a miss), write the state into the shard's next free
// slot (slots in the order keys arrive, so a shard never places its keys
// anew), and add the hash with the slot's memRef-sized value.
// "map" is a map[uint64]state per shard, looked up and inserted into,
// growing as Go maps do, as httprate's counters grow.
func BenchmarkLRUInsertGrowing(b *testing.B) {
	if c := core.MustMemoryStore(&core.MemoryConfig{Capacity: heapCapacity}).Capacity(); c != growShards*(heapCapacity/growShards) {
		b.Fatalf("a store of %d keys holds %d: its default shards are no longer %d", heapCapacity, c, growShards)
	}
	keys := make([]string, heapKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("g%014d", i)
	}
	seed := maphash.MakeSeed()
	type state struct{ a, b int64 }
	const per = heapCapacity / growShards
	shardOf := func(h uint64) uint64 {
		hi, _ := bits.Mul64(h, growShards)
		return hi
	}
	// run times one new key per operation, from a fresh structure made
	// by reset (with the timer stopped) every heapKeys keys.
	run := func(b *testing.B, reset func(), do func(h uint64)) {
		if b.N > 1 {
			reset()
			for _, k := range keys {
				do(maphash.String(seed, k))
			}
		}
		reset()
		runtime.GC()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if i%heapKeys == 0 && i > 0 {
				b.StopTimer()
				reset()
				runtime.GC()
				b.StartTimer()
			}
			do(maphash.String(seed, keys[i%heapKeys]))
		}
	}
	b.Run("golang-lru", func(b *testing.B) {
		var shards [growShards]struct {
			mu sync.Mutex
			l  *simplelru.LRU[uint64, uint32]
			_  [112]byte
		}
		run(b, func() {
			for i := range shards {
				shards[i].l, _ = simplelru.NewLRU[uint64, uint32](per, nil)
			}
		}, func(h uint64) {
			s := &shards[shardOf(h)]
			s.mu.Lock()
			if _, ok := s.l.Peek(h); !ok {
				s.l.Add(h, uint32(s.l.Len()))
			}
			s.mu.Unlock()
		})
	})
	b.Run("golang-lru-slot", func(b *testing.B) {
		type ref struct {
			slot, pol uint32
			stamp     uint64
		}
		var shards [growShards]struct {
			mu   sync.Mutex
			l    *simplelru.LRU[uint64, ref]
			slab []state
			tick uint64
			_    [80]byte
		}
		run(b, func() {
			for i := range shards {
				s := &shards[i]
				s.l, _ = simplelru.NewLRU[uint64, ref](per, nil)
				s.slab = make([]state, per)
				s.tick = 0
			}
		}, func(h uint64) {
			s := &shards[shardOf(h)]
			s.mu.Lock()
			if _, ok := s.l.Peek(h); !ok {
				slot := uint32(s.l.Len())
				s.slab[slot] = state{a: 1}
				s.tick++
				s.l.Add(h, ref{slot: slot, stamp: s.tick})
			}
			s.mu.Unlock()
		})
	})
	b.Run("map", func(b *testing.B) {
		var shards [growShards]struct {
			mu sync.Mutex
			m  map[uint64]state
			_  [112]byte
		}
		run(b, func() {
			for i := range shards {
				shards[i].m = make(map[uint64]state)
			}
		}, func(h uint64) {
			s := &shards[shardOf(h)]
			s.mu.Lock()
			if _, ok := s.m[h]; !ok {
				s.m[h] = state{a: 1}
			}
			s.mu.Unlock()
		})
	})
}
