package core

import "math"

// How a shard of a MemoryStore keeps its keys' order of use.
//
// A new key enters the shard's ring: a first-in-first-out queue of the
// keys added since and not gone to the front of the shard's order again,
// each with the stamp it was added with (adding a key counts as its going
// to the front). The first time a ring key goes to the front again (a
// decision after it drifted into the back half of the shard, a batch, a
// change of policy, see put; or a full shard's second chance to a key
// examined for room that still holds state, see makeRoom), it moves to the
// shard's golang-lru list, which orders the keys that have gone there
// again, by their last time.
// Stamps are given in that same order, one tick each, so the ring's first
// key and the list's last are each the oldest of their own, and the older
// of the two, by their stamps, is the least recently used key of the
// shard: eviction (makeRoom) takes it, in the order one list holding every
// key would give. A key used once, the common case under a flood of new
// keys, then costs 12 bytes of the ring and no allocation, and its
// addition and eviction touch the ring in order, where golang-lru would
// allocate its list entry, link it in and probe its map on both.
//
// A key leaving the ring (to the list, or removed) is not searched for:
// its entry stays, stale, and is told by its stamp, which is no longer the
// key's (the key has a new one, or is gone). The ring drops stale entries
// as they reach its front, and drops them all (a compaction, which reads
// each entry's slot): when the ring is full and at most half of its
// entries are live (else it doubles); when fewer than a quarter of its
// entries are live, halving it as often as that allows (so that a ring
// holds at most four entries per key it holds, or ringMin); and before
// restamp moves the drifted keys' stamps, which could make a stale
// entry's stamp its key's again. A store with KeepActive keeps every key
// in the list, whose last key its eviction examines.

// ringMin is the fewest entries a shard's ring is made with.
const ringMin = 64

// memRing is a shard's ring (see above): n entries from index head,
// wrapping around, in order of addition, with their keys' hashes in h and
// their stamps in st.
type memRing struct {
	h    []uint64
	st   []uint32
	head int
	n    int // entries, live and stale
	live int // keys held in the ring: its live entries
}

// count returns the number of keys the shard holds. Requires s.mu.
func (s *memShard) count() int { return s.lru.Len() + s.ring.live }

// holds reports whether the shard holds the key hashed h. Requires s.mu.
func (s *memShard) holds(h uint64) bool {
	_, ok := s.lookup(h)
	return ok
}

// stampOf returns the stamp of the key hashed h (its hot record's when it
// is the hot key), and whether the shard holds the key. Requires s.mu.
func (s *memShard) stampOf(h uint64) (uint32, bool) {
	if s.hotOK && s.hotH == h {
		return s.hotRef.stamp, true
	}
	i, ok := s.lookup(h)
	if !ok {
		return 0, false
	}
	return s.slab[i].stamp, true
}

// ringLive reports whether the ring's entry at index j is live: its key
// is held, with the stamp the entry holds. Requires s.mu.
func (s *memShard) ringLive(j int) bool {
	st, ok := s.stampOf(s.ring.h[j])
	return ok && st == s.ring.st[j]
}

// advance moves the shard's tick on by one, for a key going to the front,
// and returns its stamp. Requires s.mu.
func (s *memShard) advance() uint32 {
	s.tick++
	if uint32(s.tick)&(restampEvery-1) == 0 {
		s.restamp()
	}
	return uint32(s.tick)
}

// push adds the new key hashed h, whose stamp is st, at the back of the
// ring. Requires s.mu.
func (s *memShard) push(h uint64, st uint32) {
	r := &s.ring
	if r.n == len(r.h) {
		if r.n > 0 && r.live <= r.n/2 {
			s.compact(len(r.h))
		} else {
			r.resize(max(ringMin, 2*len(r.h)))
		}
	}
	j := r.head + r.n
	if j >= len(r.h) {
		j -= len(r.h)
	}
	r.h[j], r.st[j] = h, st
	r.n++
	r.live++
}

// left counts one key fewer in the ring (it went to the list, or was
// removed: its entry is stale), and halves the ring while fewer than a
// quarter of its entries would be live. Requires s.mu.
func (s *memShard) left() {
	r := &s.ring
	r.live--
	size := len(r.h)
	for size > ringMin && r.live*4 < size {
		size /= 2
	}
	if size < len(r.h) {
		s.compact(max(size, ringMin))
	}
}

// resize moves the ring's entries, stale ones too, to arrays of size
// entries, from index 0. size is at least r.n.
func (r *memRing) resize(size int) {
	h, st := make([]uint64, size), make([]uint32, size)
	r.copyTo(h, st)
	r.h, r.st, r.head = h, st, 0
}

// copyTo copies the ring's entries, in order, to the start of h and st.
func (r *memRing) copyTo(h []uint64, st []uint32) {
	if k := len(r.h) - r.head; r.n > k {
		copy(h, r.h[r.head:])
		copy(h[k:], r.h[:r.n-k])
		copy(st, r.st[r.head:])
		copy(st[k:], r.st[:r.n-k])
		return
	}
	copy(h, r.h[r.head:r.head+r.n])
	copy(st, r.st[r.head:r.head+r.n])
}

// compact drops the ring's stale entries, keeping the live ones in order
// in arrays of size entries (at least the number of live entries, plus
// one for a key going to the front whose slot has not yet been given its
// new stamp: see front). Requires s.mu.
func (s *memShard) compact(size int) {
	r := &s.ring
	h, st := make([]uint64, size), make([]uint32, size)
	k := 0
	for i, j := 0, r.head; i < r.n; i++ {
		if s.ringLive(j) {
			h[k], st[k] = r.h[j], r.st[j]
			k++
		}
		if j++; j == len(r.h) {
			j = 0
		}
	}
	r.h, r.st, r.head, r.n = h, st, 0, k
}

// pop drops the ring's first entry. Requires s.mu.
func (r *memRing) pop() {
	if r.head++; r.head == len(r.h) {
		r.head = 0
	}
	r.n--
}

// ringFront returns the hash and stamp of the ring's first key, dropping
// the stale entries before it; ok is false when the ring holds no key.
// Requires s.mu.
func (s *memShard) ringFront() (h uint64, st uint32, ok bool) {
	r := &s.ring
	for r.live > 0 && r.n > 0 {
		if s.ringLive(r.head) {
			return r.h[r.head], r.st[r.head], true
		}
		r.pop()
	}
	return 0, 0, false
}

// oldest returns the shard's least recently used key (see above), and
// whether it is the ring's first. The shard holds a key. Requires s.mu.
func (s *memShard) oldest() (uint64, bool) {
	rh, rst, rok := s.ringFront()
	lh, _, lok := s.lru.GetOldest()
	switch {
	case !lok:
		return rh, true
	case !rok:
		return lh, false
	}
	lst, _ := s.stampOf(lh)
	now := uint32(s.tick)
	if now-rst >= now-lst { // stamps are distinct: restamp keeps them so
		return rh, true
	}
	return lh, false
}

// dropOldest removes h, the key oldest returned, from the shard: the
// ring's first (ringed) or the list's last. Requires s.mu.
func (s *memShard) dropOldest(h uint64, ringed bool) {
	if !ringed {
		s.lru.RemoveOldest()
		return
	}
	s.ring.pop()
	s.evicted(h, struct{}{})
	s.left()
}

// remove forgets the record under h, wherever the shard keeps its order
// (evicted frees what it held). Requires s.mu.
func (s *memShard) remove(h uint64) {
	if s.lru.Remove(h) {
		return
	}
	if s.holds(h) {
		s.evicted(h, struct{}{})
		s.left()
	}
}

// evictLogSize is how many evictions a shard's eviction log holds.
const evictLogSize = 32

// memEvictLog is a shard's last evictions of keys holding state, each with
// its time, so that a refund by charge (Request.ChargedAt) of a key
// evicted since, whose record then holds only later charges, gives nothing
// back (see evictedSince).
type memEvictLog struct {
	h    [evictLogSize]uint64
	at   [evictLogSize]int64
	next int // the entry written next, the first written once the log is full
	n    int // entries written, up to evictLogSize
	// horizon is the latest time of the entries overwritten (the times
	// of concurrent callers, read before they lock the shard, arrive a
	// little out of order); math.MinInt64 while none is.
	horizon int64
}

// noteEviction records the eviction of the key hashed h, holding state,
// at now. Requires s.mu.
func (s *memShard) noteEviction(h uint64, now int64) {
	if s.evicts == nil {
		s.evicts = &memEvictLog{horizon: math.MinInt64}
	}
	l := s.evicts
	if l.n == evictLogSize {
		l.horizon = max(l.horizon, l.at[l.next])
	}
	l.h[l.next], l.at[l.next] = h, now
	if l.next++; l.next == evictLogSize {
		l.next = 0
	}
	l.n = min(l.n+1, evictLogSize)
}

// evictedSince reports whether the key hashed h may have been evicted,
// holding state, at or after t: the log holds such an eviction, or an
// entry at or after t has been overwritten, which may have been one (a
// shard evicting keys faster than its log holds them keeps the charges of
// the refunds made meanwhile, which limits more, never less). Requires
// s.mu.
func (s *memShard) evictedSince(h uint64, t int64) bool {
	l := s.evicts
	if l == nil {
		return false
	}
	for k := 0; k < l.n; k++ {
		if l.h[k] == h && l.at[k] >= t {
			return true
		}
	}
	return l.horizon >= t
}

// chargeLead returns the most a charge's Request.ChargedAt under p (its
// Policy.ChargeStart) can lie after the charge itself: a bucket's charge
// starts to give its units back once the units in use before it have,
// at most tau + MaxDelay later (and ClockTolerance for a state ahead of
// the clock); a window algorithm's is recorded at the charge's time or
// the key's, within ClockTolerance.
func chargeLead(p *Policy) int64 {
	lead := int64(ClockTolerance)
	if isGCRA(p) {
		for _, d := range []int64{p.tauQ, 1, p.maxDelay} {
			if lead > math.MaxInt64-d {
				return math.MaxInt64
			}
			lead += d
		}
	}
	return lead
}

// before returns t less lead (lead >= 0), or math.MinInt64 below it.
func before(t, lead int64) int64 {
	if t < math.MinInt64+lead {
		return math.MinInt64
	}
	return t - lead
}
