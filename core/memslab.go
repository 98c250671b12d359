package core

import "math/bits"

// How a shard of a MemoryStore holds its records.
//
// The shard's golang-lru list maps each key's hash to a memRef of 16
// bytes, which keeps golang-lru's list entry at 80 bytes (one size class).
// The record's two integers live in the shard's slab, one memSlot for each
// key the shard can hold, at the slot the memRef names, and are written
// there in place. The slab is allocated in chunks of 64 slots (1 KiB), each
// when a key first takes one of its slots; a bit per slot says which hold
// a key. A new key takes its home slot, a function of its hash, when that
// is free (see newSlot and add), so that a decision can read the slot it
// guesses while golang-lru looks the key up (see find): the slot is then
// not one more memory access waiting for the LRU entry to name it.
//
// A key that takeOne decides twice in a row becomes the shard's hot
// record: its State moves to fields of the shard on the cache line of its
// lock, and while only that key's single requests under its own policy
// reach the shard, a decision touches that line alone (with two cores
// deciding one key, the line the lock hands over already holds the
// State), and looks nothing up. Any other access flushes it first: the
// State goes back to its slot, and the shard is as if there had been no
// hot record (see memShard.flush).
//
// The policy that wrote the record is kept once per shard, in a table of
// the policies its records use, counted so that a policy no record uses
// any more is forgotten. A sliding log's timestamps, the only state
// behind a pointer, are kept in a map of the shard by slot, made when the
// first one is stored.
//
// Writing in place lets a decision leave the LRU list alone unless its key
// may have drifted into the back half of the shard (see put): most
// decisions then write only the shard's lock and the key's slot (a held
// key under its own built-in policy is decided on the caller's stack, see
// MemoryStore.takeOne), where moving the key to the front would also
// write its two neighbours in the list, the list's head and the former
// first entry, memory that the other cores use too.

// memRef is the value of a key in its shard's LRU.
type memRef struct {
	slot uint32 // the record's integers: memShard.at(slot)
	pol  uint32 // the policy that last wrote it: memShard.pols[pol]
	// stamp is the shard's tick when the key last went to the front: at
	// most tick-stamp other keys have gone there since, so the key is at
	// most that far from the front.
	stamp uint64
}

// memSlot holds the integers of a State.
type memSlot struct{ A, B int64 }

// The slab's chunks: 64 slots, 1 KiB each.
const (
	slabShift = 6
	slabChunk = 1 << slabShift
	slabMask  = slabChunk - 1
)

// maxShardCapacity is the most keys one shard can hold: its slots are
// numbered by a uint32.
const maxShardCapacity uint64 = 1<<32 - 1

// memEntry is a working copy of a record: its State and the policy that
// last wrote it. load and put move it out of and into the shard.
type memEntry struct {
	st  State
	pol *Policy
}

// at returns the slot numbered i. Requires s.mu.
func (s *memShard) at(i uint32) *memSlot { return &s.slab[i>>slabShift][i&slabMask] }

// load copies the record ref names into e, and returns its slot. Requires
// s.mu.
func (s *memShard) load(ref memRef, e *memEntry) *memSlot {
	sl := s.at(ref.slot)
	s.fill(ref, *sl, e)
	return sl
}

// find looks up the key hashed h: when the shard holds it, find copies its
// record into e and returns its LRU value and its slot. With guess, while
// at least half of the shard's keys are at home, the key's home slot (see
// newSlot) is read before golang-lru's index is searched, so that for a
// key at home the two reads overlap instead of the slot's waiting for the
// LRU entry that names it. Requires s.mu.
func (s *memShard) find(h uint64, e *memEntry, guess bool) (memRef, *memSlot, bool) {
	g := &s.none
	if guess && s.guessing {
		g = s.guess(h)
	}
	v := *g
	ref, ok := s.lru.Peek(h)
	if !ok {
		return ref, nil, false
	}
	sl := s.at(ref.slot)
	if sl != g {
		v = *sl
	}
	s.fill(ref, v, e)
	return ref, sl, true
}

// fill copies into e the record whose LRU value is ref and whose slot
// holds v. Requires s.mu.
func (s *memShard) fill(ref memRef, v memSlot, e *memEntry) {
	e.st.A, e.st.B, e.st.log = v.A, v.B, nil
	if len(s.logs) > 0 {
		e.st.log = s.logs[ref.slot]
	}
	e.pol = s.pols[ref.pol]
}

// put writes e back into sl, the slot of the key hashed h, whose LRU value
// is ref, and returns the key's LRU value. It moves the key to the front
// when e's policy is not the one ref names, or when the key may have left
// the front half of the shard: more than s.lazy keys have gone to the
// front since it last did, and the shard holds more than s.lazy+1 keys.
// Requires s.mu.
func (s *memShard) put(h uint64, ref memRef, sl *memSlot, e *memEntry) memRef {
	s.write(ref, sl, &e.st)
	front := false
	if e.pol != s.pols[ref.pol] {
		old := ref.pol
		ref.pol = s.acquire(e.pol)
		s.release(old)
		front = true
	}
	if front || s.drifted(ref) {
		ref = s.front(h, ref)
	}
	return ref
}

// drifted reports whether the key whose LRU value is ref may have left the
// front half of the shard (see put). Requires s.mu.
func (s *memShard) drifted(ref memRef) bool {
	return s.tick-ref.stamp > s.lazy && uint64(s.lru.Len()) > s.lazy+1
}

// write stores st in the slot sl, which ref names (and its log in the
// shard's logs). Requires s.mu.
func (s *memShard) write(ref memRef, sl *memSlot, st *State) {
	sl.A, sl.B = st.A, st.B
	if st.log != nil || len(s.logs) > 0 {
		s.setLog(ref.slot, st.log)
	}
}

// putAgain is put for the key hashed h as the LRU holds it now: a batch
// whose requests share a hash (distinct (Name, key) pairs, see
// MemoryStore) writes their one record once per request, the last write
// winning, as for any shared record. Requires s.mu.
func (s *memShard) putAgain(h uint64, e *memEntry) {
	if ref, ok := s.lru.Peek(h); ok {
		s.put(h, ref, s.at(ref.slot), e)
	}
}

// setLog records l as the sliding log of slot i (nil for none). Requires
// s.mu.
func (s *memShard) setLog(i uint32, l *timeLog) {
	if l == nil {
		delete(s.logs, i)
		return
	}
	if s.logs == nil {
		s.logs = make(map[uint32]*timeLog)
	}
	s.logs[i] = l
}

// front moves the key hashed h, whose LRU value is ref, to the front of
// the shard's LRU, and returns its new value. Requires s.mu.
func (s *memShard) front(h uint64, ref memRef) memRef {
	s.tick++
	ref.stamp = s.tick
	s.lru.Add(h, ref)
	return ref
}

// add stores e as the record of the new key hashed h, at the front of the
// LRU; makeRoom has made space. Requires s.mu.
//
// A shard places its keys among its first span slots, and about doubles
// span when its keys fill more than three quarters of it (see grow and
// nextSpan): a key then finds its home free often enough, and the slots of
// the keys a shard holds stay close together (from its 24th key, 16 to
// about 43 bytes of slab per key, where a span of the whole capacity would
// spread a few keys over all of it, each on a cache line of its own).
func (s *memShard) add(h uint64, e *memEntry) {
	ref := memRef{slot: s.newSlot(h), pol: s.acquire(e.pol)}
	sl := s.at(ref.slot)
	sl.A, sl.B = e.st.A, e.st.B
	if e.st.log != nil {
		s.setLog(ref.slot, e.st.log)
	}
	s.front(h, ref)
	if n := uint64(s.lru.Len()); n*4 > uint64(s.span)*3 && int(s.span) < s.cap {
		s.grow()
		return
	}
	s.setGuessing()
}

// setGuessing sets whether find guesses home slots: while at least half of
// the shard's keys are at home. Requires s.mu.
func (s *memShard) setGuessing() { s.guessing = s.athome*2 >= uint32(s.lru.Len()) }

// grow about doubles the shard's span (see nextSpan) and places every key
// anew, as newSlot places a new key, so that each key's home is again where
// find guesses it. Keys are placed from the most recently used to the least
// (where two share a home, the one likelier to be decided again gets it),
// then go to the front of the LRU with their new slots from the least
// recently used to the most: their order is unchanged, and each key's stamp
// is then exactly its distance from the front. Its cost, about that of a
// decision and 40 bytes of allocation per key held (48 with sliding logs),
// is paid only while the shard fills: ⌈log2(cap/64)⌉ times at most, and
// from 3/4 (large shards) to 0.94 of a placement per slot of the shard's
// capacity in all. Requires s.mu.
func (s *memShard) grow() {
	keys, refs := s.lru.Keys(), s.lru.Values() // least recently used first
	recs := make([]memSlot, len(keys))
	var logs []*timeLog
	if len(s.logs) > 0 {
		logs = make([]*timeLog, len(keys))
	}
	for i, ref := range refs {
		recs[i] = *s.at(ref.slot)
		if logs != nil {
			logs[i] = s.logs[ref.slot]
		}
		s.vacate(ref.slot)
	}
	s.freed = 0
	s.span = nextSpan(s.span, s.cap)
	s.athome = 0
	// The most recently used keys, the likeliest to be decided again, are
	// placed first: where two share a home, they get it.
	for i := len(keys) - 1; i >= 0; i-- {
		refs[i].slot = s.newSlot(keys[i])
		*s.at(refs[i].slot) = recs[i]
		if logs != nil && logs[i] != nil {
			s.setLog(refs[i].slot, logs[i])
		}
	}
	for i, h := range keys {
		s.front(h, refs[i])
	}
	s.setGuessing()
}

// nextSpan returns the span a shard of capacity c takes after span: the
// least of c, c/2, c/4, ... above span, or the first of them when span is
// 0. Each after c is rounded up to a whole number of 64-slot chunks, and
// the halving stops at 64 slots. The spans are halvings of the capacity,
// not doublings of 64, so that the last growth is about a doubling too: one
// from 16,384 slots to a capacity of 16,935 would place 12,288 keys anew
// for 551 more slots.
func nextSpan(span uint32, c int) uint32 {
	n := uint64(c)
	for n > slabChunk {
		half := ((n+1)/2 + slabMask) &^ slabMask
		if half <= uint64(span) {
			break
		}
		n = half
	}
	return uint32(n)
}

// home returns the slot a key hashed h takes when it is free: the low 32
// bits of h (the shard is chosen by the high ones) scaled to the shard's
// span.
func (s *memShard) home(h uint64) uint32 {
	return uint32(uint64(uint32(h)) * uint64(s.span) >> 32)
}

// guess returns the home slot of the key hashed h, or a slot of the
// shard's own that no key uses when that slot's chunk is not allocated.
// Requires s.mu.
func (s *memShard) guess(h uint64) *memSlot {
	i := s.home(h)
	if c := s.slab[i>>slabShift]; c != nil {
		return &c[i&slabMask]
	}
	return &s.none
}

// isUsed reports whether slot i holds a key. Requires s.mu.
func (s *memShard) isUsed(i uint32) bool { return s.used[i>>6]&(1<<(i&63)) != 0 }

// newSlot returns a free slot, zeroed and marked used, for the key hashed
// h: its home when free, else the last slot freed, else the first free one
// after its home within the span, wrapping around. The span has room for
// one more key (see add). Requires s.mu.
func (s *memShard) newSlot(h uint64) uint32 {
	i := s.home(h)
	if !s.isUsed(i) {
		s.athome++
	} else if f := s.freed; f != 0 && !s.isUsed(f-1) {
		i = f - 1
	} else {
		i = s.nextFree(i)
	}
	s.claim(i)
	return i
}

// claim marks slot i, which is free and zeroed, used, allocating its chunk
// if need be, and returns it. Requires s.mu.
func (s *memShard) claim(i uint32) *memSlot {
	s.used[i>>6] |= 1 << (i & 63)
	c := i >> slabShift
	if s.slab[c] == nil {
		s.slab[c] = make([]memSlot, min(slabChunk, s.cap-int(c<<slabShift)))
	}
	return &s.slab[c][i&slabMask]
}

// vacate frees slot i: zeroed, marked free, with no sliding log. Requires
// s.mu.
func (s *memShard) vacate(i uint32) {
	if len(s.logs) > 0 {
		delete(s.logs, i)
	}
	*s.at(i) = memSlot{}
	s.used[i>>6] &^= 1 << (i & 63)
	s.freed = i + 1
}

// nextFree returns the first free slot after i within the span, wrapping
// around. The span's last word of used bits needs no mask: a span short of
// the capacity is a multiple of 64 slots, and the bits past the capacity
// are kept set. Requires s.mu, and a free slot in the span.
func (s *memShard) nextFree(i uint32) uint32 {
	last := (s.span - 1) >> 6
	w := i >> 6
	free := ^s.used[w] &^ (1<<(i&63) - 1)
	for free == 0 {
		if w++; w > last {
			w = 0
		}
		free = ^s.used[w]
	}
	return w<<6 | uint32(bits.TrailingZeros64(free))
}

// evicted is the shard LRU's eviction callback: a key leaving the LRU
// (Remove, RemoveOldest) frees its slot, its sliding log, its count on its
// policy and its text. Requires s.mu.
func (s *memShard) evicted(h uint64, ref memRef) {
	if ref.slot == s.home(h) {
		s.athome--
	}
	s.setGuessing()
	s.vacate(ref.slot)
	s.release(ref.pol)
	if s.keys != nil {
		delete(s.keys, h)
	}
}

// acquire returns the index of p in the shard's policy table, adding it if
// absent, and counts one more record of p. Requires s.mu.
func (s *memShard) acquire(p *Policy) uint32 {
	i := s.lastPol
	if int(i) >= len(s.pols) || s.pols[i] != p {
		var ok bool
		if i, ok = s.polIndex[p]; !ok {
			if n := len(s.polFree); n > 0 {
				i = s.polFree[n-1]
				s.polFree = s.polFree[:n-1]
				s.pols[i] = p
			} else {
				i = uint32(len(s.pols))
				s.pols = append(s.pols, p)
				s.polRefs = append(s.polRefs, 0)
			}
			if s.polIndex == nil {
				s.polIndex = make(map[*Policy]uint32)
			}
			s.polIndex[p] = i
		}
		s.lastPol = i
	}
	s.polRefs[i]++
	return i
}

// release counts one record fewer of the policy at index i, and forgets
// the policy when none is left, so that the table holds only the policies
// of the shard's records however many rule sets are reloaded. Requires
// s.mu.
func (s *memShard) release(i uint32) {
	if s.polRefs[i]--; s.polRefs[i] == 0 {
		delete(s.polIndex, s.pols[i])
		s.pols[i] = nil
		s.polFree = append(s.polFree, i)
	}
}
