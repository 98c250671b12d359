package core

// How a shard of a MemoryStore holds its records.
//
// The shard's slab is its index: each memSlot holds a key's hash beside
// its record (its two integers, the index of the policy that wrote it and
// its stamp), and keys are placed by linear probing from their home slot,
// a function of the hash, in Robin Hood order: along a run of slots, keys
// sit in the order of their homes, so that a search for a key stops as
// soon as it passes the slots where the key would be. A lookup reads the
// slab alone, from the key's home slot (see lookup). The keys' order of
// use, for eviction, is kept by hash apart from the slab (see memring.go):
// a key used once in its shard's ring, a key that has gone to the front
// again in its golang-lru list, which holds no value and is touched only
// when a key goes to its front (see front) and when a full shard makes
// room (see makeRoom).
//
// A key that takeOne decides twice in a row becomes the shard's hot
// record: its State moves to fields of the shard on the cache line of its
// lock, and while only that key's single requests under its own policy
// reach the shard, a decision touches that line alone (with two cores
// deciding one key, the line the lock hands over already holds the
// State), and looks nothing up. Any other access flushes it first: the
// State goes back to its slot, and the shard is as if there had been no
// hot record (see memShard.flush). Slots move only when a key is added,
// removed or placed anew by grow, never while a hot record is held.
//
// The policy that wrote the record is kept once per shard, in a table of
// the policies its records use, counted so that a policy no record uses
// any more is forgotten; index 0 of the table is never used, and marks a
// free slot. A sliding log's timestamps, the only state behind a pointer,
// are kept in a map of the shard by hash, made when the first one is
// stored.
//
// Writing in place lets a decision leave the LRU list alone unless its key
// may have drifted into the back half of the shard (see put): most
// decisions then write only the shard's lock and the key's slot (a held
// key under its own built-in policy is decided on the caller's stack, see
// MemoryStore.takeOne), where moving the key to the front would also
// write its two neighbours in the list, the list's head and the former
// first entry, memory that the other cores use too.

// memRef names a held key's slot, with copies of the slot's policy index
// and stamp: what put needs to write the record back.
type memRef struct {
	slot uint32 // memShard.slab[slot]
	pol  uint32 // the policy that last wrote the record: memShard.pols[pol]
	// stamp is the low 32 bits of the shard's tick when the key last went
	// to the front: at most tick-stamp other keys have gone there since,
	// so the key is at most that far from the front (see restamp).
	stamp uint32
}

// memSlot is a slot of a shard's slab: a key's hash and record, or a free
// slot (pol 0, all zero).
type memSlot struct {
	h     uint64 // the key's hash
	A, B  int64  // the integers of its State
	pol   uint32 // its memRef.pol; 0 for a free slot
	stamp uint32 // its memRef.stamp
}

// minSpan bounds a shard's first span: the halving of its full span stops
// at minSpan slots or fewer (from minSpan/2, unless the full span is
// smaller; see nextSpan).
const minSpan = 64

// maxShardCapacity is the most keys one shard can hold: its slots, 1/8
// more than its keys, are numbered by a uint32.
const maxShardCapacity uint64 = 1 << 31

// fullSpan returns the slots of a shard of capacity c once it has grown
// fully: 1/8 more than c, so that a full shard's searches stay short (at
// a load of 8/9, about five slots a successful search on average) and a
// shard always has a free slot to place a new key in.
func fullSpan(c int) uint32 { return uint32(c + c/8 + 1) }

// memEntry is a working copy of a record: its State and the policy that
// last wrote it. find and put move it out of and into the shard.
type memEntry struct {
	st  State
	pol *Policy
}

// lookup returns the slot of the key hashed h, and whether the shard holds
// it. Requires s.mu.
func (s *memShard) lookup(h uint64) (uint32, bool) {
	n := s.span
	i := s.home(h)
	for d := uint32(0); ; d++ {
		sl := &s.slab[i]
		if sl.h == h && sl.pol != 0 {
			return i, true
		}
		// A free slot, or a key nearer its home than h would be here:
		// Robin Hood order puts h before it.
		if sl.pol == 0 || s.dist(i, sl.h) < d {
			return 0, false
		}
		if i++; i == n {
			i = 0
		}
	}
}

// dist returns how far slot i is from the home of a key hashed h, along
// the span (wrapping around). Requires s.mu.
func (s *memShard) dist(i uint32, h uint64) uint32 {
	j := s.home(h)
	if i >= j {
		return i - j
	}
	return i + s.span - j
}

// at returns the memRef of the key in slot i, and the slot. Requires
// s.mu.
func (s *memShard) at(i uint32) (memRef, *memSlot) {
	sl := &s.slab[i]
	return memRef{slot: i, pol: sl.pol, stamp: sl.stamp}, sl
}

// get returns the memRef and the slot of the key hashed h, which the
// shard holds. Requires s.mu.
func (s *memShard) get(h uint64) (memRef, *memSlot) {
	i, _ := s.lookup(h)
	return s.at(i)
}

// find looks up the key hashed h: when the shard holds it, find copies its
// record into e and returns its memRef and its slot. Requires s.mu.
func (s *memShard) find(h uint64, e *memEntry) (memRef, *memSlot, bool) {
	i, ok := s.lookup(h)
	if !ok {
		return memRef{}, nil, false
	}
	ref, sl := s.at(i)
	s.fill(sl, e)
	return ref, sl, true
}

// load copies the record of the key hashed h, which the shard holds, into
// e, and returns its slot. Requires s.mu.
func (s *memShard) load(h uint64, e *memEntry) *memSlot {
	_, sl := s.get(h)
	s.fill(sl, e)
	return sl
}

// fill copies into e the record sl holds. Requires s.mu.
func (s *memShard) fill(sl *memSlot, e *memEntry) {
	e.st.A, e.st.B, e.st.log = sl.A, sl.B, nil
	if len(s.logs) > 0 {
		e.st.log = s.logs[sl.h]
	}
	e.pol = s.pols[sl.pol]
}

// put writes e back into sl, the slot of the key hashed h, which ref
// names, and returns the key's memRef. It moves the key to the front when
// e's policy is not the one ref names, or when the key may have left the
// front half of the shard: more than s.lazy keys have gone to the front
// since it last did, and the shard holds more than s.lazy+1 keys.
// Requires s.mu.
func (s *memShard) put(h uint64, ref memRef, sl *memSlot, e *memEntry) memRef {
	s.write(sl, &e.st)
	front := false
	if e.pol != s.pols[ref.pol] {
		old := ref.pol
		ref.pol = s.acquire(e.pol)
		s.release(old)
		sl.pol = ref.pol
		front = true
	}
	if front || s.drifted(ref) {
		ref.stamp = s.front(h)
		sl.stamp = ref.stamp
	}
	return ref
}

// drifted reports whether the key whose memRef is ref may have left the
// front half of the shard (see put). Requires s.mu.
func (s *memShard) drifted(ref memRef) bool {
	return uint64(uint32(s.tick)-ref.stamp) > s.lazy && uint64(s.count()) > s.lazy+1
}

// write stores st in the slot sl (and its log in the shard's logs).
// Requires s.mu.
func (s *memShard) write(sl *memSlot, st *State) {
	sl.A, sl.B = st.A, st.B
	if st.log != nil || len(s.logs) > 0 {
		s.setLog(sl.h, st.log)
	}
}

// putAgain is put for the key hashed h as the shard holds it now: a batch
// whose requests share a hash (distinct (Name, key) pairs, see
// MemoryStore) writes their one record once per request, the last write
// winning, as for any shared record. Requires s.mu.
func (s *memShard) putAgain(h uint64, e *memEntry) {
	if i, ok := s.lookup(h); ok {
		ref, sl := s.at(i)
		s.put(h, ref, sl, e)
	}
}

// setLog records l as the sliding log of the key hashed h (nil for none).
// Requires s.mu.
func (s *memShard) setLog(h uint64, l *timeLog) {
	if l == nil {
		delete(s.logs, h)
		return
	}
	if s.logs == nil {
		s.logs = make(map[uint64]*timeLog)
	}
	s.logs[h] = l
}

// front moves the key hashed h to the front of the shard's LRU, and
// returns its new stamp, which the caller writes to the key's slot (or,
// for the hot record, flush does). Requires s.mu.
func (s *memShard) front(h uint64) uint32 {
	st := s.advance()
	n := s.lru.Len()
	s.lru.Add(h, struct{}{})
	if s.ringed && s.lru.Len() > n {
		// A key of the ring, going to the front again: it moves to the
		// list, and its ring entry is stale once its slot (or the hot
		// record) has the new stamp, which the caller writes.
		s.left()
	}
	return st
}

// renew moves the key hashed h, whose slot is sl, to the front of the
// shard's LRU. Requires s.mu.
func (s *memShard) renew(h uint64, sl *memSlot) { sl.stamp = s.front(h) }

// restampEvery is how many keys go to the front between two restamps.
const restampEvery = 1 << 30

// restamp keeps the 32-bit stamps exact about what drifted asks of them,
// and about the shard's order of use: the keys that have drifted (more
// than s.lazy keys have gone to the front since their stamps) get, in
// their order, the stamps of keys that have just drifted, one tick apart,
// the oldest furthest back. Run every restampEvery keys gone to the front,
// it lets no stamp's distance from the tick wrap around 2³², which would
// make a key in the back of the order look near the front; until it runs,
// the distances are exact (at most restampEvery plus the shard's
// capacity). Requires s.mu.
func (s *memShard) restamp() {
	if s.ring.n > 0 {
		// Stale entries go first: restamped, a stale entry's stamp could
		// become its key's again.
		s.compact(len(s.ring.h))
	}
	now := uint32(s.tick)
	drifted := func(st uint32) bool { return uint64(now-st) > s.lazy }
	// The drifted keys of the ring (a prefix of its entries, after the
	// compaction all live) and of the list (its oldest), each oldest
	// first, merged by their exact distances.
	r := &s.ring
	var ring []int // indexes of r's drifted entries
	for k, j := 0, r.head; k < r.n && drifted(r.st[j]); k++ {
		ring = append(ring, j)
		if j++; j == len(r.st) {
			j = 0
		}
	}
	var list []uint64
	var lst []uint32
	for _, h := range s.lru.Keys() { // oldest first
		st, _ := s.stampOf(h)
		if !drifted(st) {
			break
		}
		list, lst = append(list, h), append(lst, st)
	}
	n := len(ring) + len(list)
	for i, k := 0, 0; i < len(ring) || k < len(list); {
		// The back of the drifted keys, n-1 ticks behind the last of them.
		st := now - uint32(s.lazy) - uint32(n)
		n--
		if k == len(list) || i < len(ring) && now-r.st[ring[i]] >= now-lst[k] {
			j := ring[i]
			s.setStamp(r.h[j], st)
			r.st[j] = st
			i++
		} else {
			s.setStamp(list[k], st)
			k++
		}
	}
}

// setStamp writes st as the stamp of the key hashed h, which the shard
// holds (in its hot record too, when it is the hot key). Requires s.mu.
func (s *memShard) setStamp(h uint64, st uint32) {
	if s.hotOK && s.hotH == h {
		s.hotRef.stamp = st
	}
	if i, ok := s.lookup(h); ok {
		s.slab[i].stamp = st
	}
}

// add stores e as the record of the new key hashed h, at the front of the
// shard's order (at the back of its ring, or with KeepActive at the front
// of its list); makeRoom has made space. Requires s.mu.
//
// A shard places its keys in a slab of span slots, and about doubles the
// span when its keys fill more than three quarters of it (see grow and
// nextSpan): searches stay short, and the keys a shard holds stay close
// together (a span of the whole capacity would spread a few keys over
// all of it, each on a cache line of its own).
func (s *memShard) add(h uint64, e *memEntry) {
	pol := s.acquire(e.pol)
	var stamp uint32
	if s.ringed {
		stamp = s.advance()
	} else {
		stamp = s.front(h)
	}
	s.place(memSlot{h: h, A: e.st.A, B: e.st.B, pol: pol, stamp: stamp})
	if s.ringed {
		s.push(h, stamp)
	}
	if e.st.log != nil {
		s.setLog(h, e.st.log)
	}
	if n := uint64(s.count()); n*4 > uint64(s.span)*3 && s.span < fullSpan(s.cap) {
		s.grow()
	}
}

// place puts x, the record of a key the shard does not hold, in the slab
// in Robin Hood order: along its search from home, x goes before the
// first key whose home is past its own (at the first free slot, or at a
// key nearer its home than x would be there), and the keys from there to
// the next free slot move one slot on, each one further from its home.
// The span has a free slot. Requires s.mu.
func (s *memShard) place(x memSlot) {
	n := s.span
	i := s.home(x.h)
	for d := uint32(0); ; d++ {
		sl := &s.slab[i]
		if sl.pol == 0 {
			*sl = x
			return
		}
		if s.dist(i, sl.h) < d {
			break
		}
		if i++; i == n {
			i = 0
		}
	}
	// Slot i holds a key whose home is past x's: shift the keys from i to
	// the next free slot f on by one, and put x at i.
	f := i + 1
	for ; ; f++ {
		if f == n {
			f = 0
		}
		if s.slab[f].pol == 0 {
			break
		}
	}
	if f < i { // the keys to move wrap around the end of the slab
		copy(s.slab[1:f+1], s.slab[:f])
		s.slab[0] = s.slab[n-1]
		copy(s.slab[i+1:], s.slab[i:n-1])
	} else {
		copy(s.slab[i+1:f+1], s.slab[i:f])
	}
	s.slab[i] = x
}

// vacate frees slot i, moving back by one slot the keys after it that are
// away from their homes (up to the next free slot or key at its home), so
// that no search stops short of them. Requires s.mu.
func (s *memShard) vacate(i uint32) {
	n := s.span
	j := i + 1
	for ; ; j++ {
		if j == n {
			j = 0
		}
		if sl := &s.slab[j]; sl.pol == 0 || s.dist(j, sl.h) == 0 {
			break
		}
	}
	// The keys in slots i+1 to j-1 move back by one; slot j-1 is then free.
	if j < i || j == 0 && i != n-1 { // they wrap around the end of the slab
		copy(s.slab[i:n-1], s.slab[i+1:])
		if j > 0 {
			s.slab[n-1] = s.slab[0]
			copy(s.slab[:j-1], s.slab[1:j])
		}
	} else if j > i {
		copy(s.slab[i:j-1], s.slab[i+1:j])
	}
	if j == 0 {
		j = n
	}
	s.slab[j-1] = memSlot{}
}

// grow about doubles the shard's span (see nextSpan) and places every key
// anew in a slab of the new span, so that each key's home is again where
// lookup starts. It moves the records alone: the LRU, the stamps and the
// logs, which do not name slots, stay as they are. Its cost, about a
// placement and 32 bytes of allocation per slot, is paid only while the
// shard fills: ⌈log2(fullSpan/64)⌉ times at most. Requires s.mu.
func (s *memShard) grow() {
	old := s.slab
	s.span = nextSpan(s.span, fullSpan(s.cap))
	s.slab = make([]memSlot, s.span)
	for i := range old {
		if old[i].pol != 0 {
			s.place(old[i])
		}
	}
}

// nextSpan returns the span a shard whose full span is c takes after span:
// the least of c, c/2, c/4, ... (rounded up) above span, or the first of
// them when span is 0. The halving stops once at most minSpan slots are
// left (so the first span has minSpan/2 to minSpan slots, or the full
// span when that is smaller). The spans are
// halvings of the full span, not doublings of minSpan, so that the last
// growth is about a doubling too: one from 16,384 slots to a full span of
// 16,935 would place 12,288 keys anew for 551 more slots.
func nextSpan(span, c uint32) uint32 {
	n := c
	for n > minSpan {
		half := n - n/2
		if half <= span {
			break
		}
		n = half
	}
	return n
}

// home returns the slot a key hashed h is searched from: the low 32 bits
// of h (the shard is chosen by the high ones) scaled to the shard's span.
func (s *memShard) home(h uint64) uint32 {
	return uint32(uint64(uint32(h)) * uint64(s.span) >> 32)
}

// evicted frees what the key hashed h held: its slot, its sliding log, its
// count on its policy and its text. It is the shard's golang-lru eviction
// callback (a key leaving the list: Remove, RemoveOldest), and is called
// directly for a key of the ring (see remove and dropOldest). Requires s.mu.
func (s *memShard) evicted(h uint64, _ struct{}) {
	if i, ok := s.lookup(h); ok {
		s.release(s.slab[i].pol)
		if len(s.logs) > 0 {
			delete(s.logs, h)
		}
		s.vacate(i)
	}
	if s.keys != nil {
		delete(s.keys, h)
	}
}

// acquire returns the index of p in the shard's policy table, adding it if
// absent, and counts one more record of p. Requires s.mu.
func (s *memShard) acquire(p *Policy) uint32 {
	i := s.lastPol
	if s.pols[i] != p {
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
