package core

// How a shard of a MemoryStore holds its records.
//
// The shard's golang-lru list maps each key's hash to a memRef of 16
// bytes, which keeps golang-lru's list entry at 80 bytes (one size class).
// The record's two integers live in the shard's slab, a list of fixed
// chunks of memSlot, at the slot the memRef names, and are written there in
// place; the policy that wrote the record is kept once per shard, in a
// table of the policies its records use, counted so that a policy no record
// uses any more is forgotten. A sliding log's timestamps, the only state
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

// The slab's chunks: 256 slots, 4 KiB each.
const (
	slabShift = 8
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
	e.st.A, e.st.B, e.st.log = sl.A, sl.B, nil
	if len(s.logs) > 0 {
		e.st.log = s.logs[ref.slot]
	}
	e.pol = s.pols[ref.pol]
	return sl
}

// put writes e back into sl, the slot of the key hashed h, whose LRU value
// is ref. It moves the key to the front when e's policy is not the one ref
// names, or when the key may have left the front half of the shard: more
// than s.lazy keys have gone to the front since it last did, and the shard
// holds more than s.lazy+1 keys. Requires s.mu.
func (s *memShard) put(h uint64, ref memRef, sl *memSlot, e *memEntry) {
	sl.A, sl.B = e.st.A, e.st.B
	if e.st.log != nil || len(s.logs) > 0 {
		s.setLog(ref.slot, e.st.log)
	}
	front := false
	if e.pol != s.pols[ref.pol] {
		old := ref.pol
		ref.pol = s.acquire(e.pol)
		s.release(old)
		front = true
	}
	if front || s.tick-ref.stamp > s.lazy && uint64(s.lru.Len()) > s.lazy+1 {
		s.front(h, ref)
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
func (s *memShard) add(h uint64, e *memEntry) {
	ref := memRef{slot: s.newSlot(), pol: s.acquire(e.pol)}
	sl := s.at(ref.slot)
	sl.A, sl.B = e.st.A, e.st.B
	if e.st.log != nil {
		s.setLog(ref.slot, e.st.log)
	}
	s.front(h, ref)
}

// newSlot returns a free slot, zeroed: the last one freed, or a new one at
// the end of the slab. Requires s.mu.
func (s *memShard) newSlot() uint32 {
	if s.free != 0 {
		i := s.free - 1
		sl := s.at(i)
		s.free = uint32(sl.A)
		*sl = memSlot{}
		return i
	}
	i := s.nslots
	if i&slabMask == 0 {
		// A shard never holds more than cap slots (a slot is freed with
		// its key, and reused first): the last chunk holds no more.
		s.slab = append(s.slab, make([]memSlot, min(slabChunk, s.cap-int(i))))
	}
	s.nslots++
	return i
}

// evicted is the shard LRU's eviction callback: a key leaving the LRU
// (Remove, RemoveOldest) frees its slot, its sliding log, its count on its
// policy and its text. Requires s.mu.
func (s *memShard) evicted(h uint64, ref memRef) {
	if len(s.logs) > 0 {
		delete(s.logs, ref.slot)
	}
	// The free slots form a list linked through A: 1 + the next one.
	*s.at(ref.slot) = memSlot{A: int64(s.free)}
	s.free = ref.slot + 1
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
