package core

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"
)

// order returns the shard's keys in its order of use, oldest first: its
// ring's live keys and its list's, merged by stamp, as eviction takes
// them. It checks that the ring's live entries and the list hold each key
// once, in order of their stamps, which are all distinct, that the ring
// counts its live entries, and that it holds at most four entries per
// key (or ringMin).
func order(t *testing.T, s *memShard) []uint64 {
	t.Helper()
	r := &s.ring
	if r.n > len(r.h) || len(r.h) != len(r.st) || r.n > 0 && (r.head < 0 || r.head >= len(r.h)) {
		t.Fatalf("a ring of %d entries, %d slots, head %d", r.n, len(r.h), r.head)
	}
	if !s.ringed && len(r.h) > 0 {
		t.Fatalf("a KeepActive shard has a ring")
	}
	if len(r.h) > ringMin && r.live*4 < len(r.h) {
		t.Fatalf("a ring of %d slots for %d keys", len(r.h), r.live)
	}
	now := uint32(s.tick)
	var ring []uint64
	var ages []uint32
	for k, j := 0, r.head; k < r.n; k++ {
		if s.ringLive(j) {
			ring = append(ring, r.h[j])
			ages = append(ages, now-r.st[j])
		}
		if j++; j == len(r.h) {
			j = 0
		}
	}
	if len(ring) != r.live {
		t.Fatalf("the ring counts %d keys, %d entries are live", r.live, len(ring))
	}
	list := s.lru.Keys() // oldest first
	lages := make([]uint32, len(list))
	for i, h := range list {
		st, ok := s.stampOf(h)
		if !ok {
			t.Fatalf("key %x listed but not held", h)
		}
		lages[i] = now - st
	}
	for _, a := range [][]uint32{ages, lages} {
		for i := 1; i < len(a); i++ {
			if a[i] >= a[i-1] {
				t.Fatalf("ages out of order, or equal: %v", a)
			}
		}
	}
	var out []uint64
	seen := map[uint64]bool{}
	i, j := 0, 0
	for i < len(ring) || j < len(list) {
		var h uint64
		if i < len(ring) && j < len(list) && ages[i] == lages[j] {
			t.Fatalf("a key of the ring and one of the list share a stamp, %d ticks back", ages[i])
		}
		if j == len(list) || i < len(ring) && ages[i] > lages[j] {
			h = ring[i]
			i++
		} else {
			h = list[j]
			j++
		}
		if seen[h] {
			t.Fatalf("key %x held twice in the shard's order", h)
		}
		seen[h] = true
		out = append(out, h)
	}
	return out
}

// checkShard verifies the bookkeeping of a shard against its order of use
// (see order): every key is found in its own slot, which holds its hash,
// and no other slot holds a key; the slab is in Robin Hood order (no key
// is further from its home than the key before it, plus one, and none
// after a free slot); free slots are zeroed; the policy table counts
// exactly the records using each policy and holds no other (index 0,
// which marks a free slot, none); every sliding log belongs to a held
// key; and no key is further from the front than its stamp allows.
func checkShard(t *testing.T, s *memShard) {
	t.Helper()
	keys := order(t, s) // oldest first
	n := len(keys)
	if len(s.slab) != int(s.span) {
		t.Fatalf("a slab of %d slots, span %d", len(s.slab), s.span)
	}
	full := fullSpan(s.cap)
	if s.span == 0 || s.span > full || s.span < full && uint64(n)*4 > uint64(s.span)*3 || uint64(n) >= uint64(s.span) {
		t.Fatalf("span %d for %d keys in a shard of %d (full span %d)", s.span, n, s.cap, full)
	}
	slots := map[uint32]bool{}
	held := map[uint64]bool{}
	refs := map[uint32]uint32{}
	for pos, h := range keys {
		i, ok := s.lookup(h)
		if !ok {
			t.Fatalf("key %x listed but not found in the slab", h)
		}
		if slots[i] || s.slab[i].h != h {
			t.Fatalf("slot %d found for key %x holds %x (or another key's too)", i, h, s.slab[i].h)
		}
		slots[i], held[h] = true, true
		sl := s.slab[i]
		if int(sl.pol) >= len(s.pols) || sl.pol == 0 || s.pols[sl.pol] == nil {
			t.Fatalf("key %x names policy %d, which the table does not hold", h, sl.pol)
		}
		refs[sl.pol]++
		stamp := sl.stamp
		if s.hotOK && s.hotH == h {
			stamp = s.hotRef.stamp
			if s.hotRef.slot != i {
				t.Fatalf("the hot record names slot %d, its key is at %d", s.hotRef.slot, i)
			}
		}
		// A stamp more than s.lazy behind says only that the key may have
		// drifted (see restamp).
		if fromFront, d := uint32(n-1-pos), uint32(s.tick)-stamp; uint64(d) <= s.lazy && fromFront > d {
			t.Fatalf("key %x is %d from the front, but only %d keys went there since its stamp", h, fromFront, d)
		}
	}
	used := 0
	for i := range s.slab {
		sl := s.slab[i]
		if sl.pol == 0 {
			if sl != (memSlot{}) {
				t.Fatalf("free slot %d not cleared: %+v", i, sl)
			}
			continue
		}
		used++
		if !slots[uint32(i)] || !held[sl.h] {
			t.Fatalf("slot %d holds key %x, which the LRU does not list there", i, sl.h)
		}
		if d := s.dist(uint32(i), sl.h); d > 0 {
			prev := (uint32(i) + s.span - 1) % s.span
			p := s.slab[prev]
			if p.pol == 0 || s.dist(prev, p.h)+1 < d {
				t.Fatalf("slot %d is %d from its key's home, after slot %d (%+v): not in Robin Hood order", i, d, prev, p)
			}
		}
	}
	if used != n {
		t.Fatalf("%d slots used, %d keys held", used, n)
	}
	if s.pols[0] != nil || s.polRefs[0] != 0 || slices.Contains(s.polFree, 0) {
		t.Fatalf("policy index 0 is in use: %v, %d records, free %v", s.pols[0], s.polRefs[0], s.polFree)
	}
	live := 0
	for i, p := range s.pols[1:] {
		i++
		if p == nil {
			if s.polRefs[i] != 0 {
				t.Fatalf("free policy index %d counts %d records", i, s.polRefs[i])
			}
			continue
		}
		live++
		if s.polRefs[i] != refs[uint32(i)] {
			t.Fatalf("policy %d counts %d records, %d use it", i, s.polRefs[i], refs[uint32(i)])
		}
		if j, ok := s.polIndex[p]; !ok || j != uint32(i) {
			t.Fatalf("policy %d indexed at %d, %v", i, j, ok)
		}
	}
	if live != len(s.polIndex) || 1+live+len(s.polFree) != len(s.pols) {
		t.Fatalf("%d live policies, %d indexed, %d free, %d in the table", live, len(s.polIndex), len(s.polFree), len(s.pols))
	}
	if s.keys != nil {
		if len(s.keys) != n {
			t.Fatalf("%d key texts for %d keys", len(s.keys), n)
		}
		for _, h := range keys {
			if _, ok := s.keys[h]; !ok {
				t.Fatalf("no text for key %x", h)
			}
		}
	}
	for h, l := range s.logs {
		if !held[h] || l == nil {
			t.Fatalf("sliding log of key %x, held %v", h, held[h])
		}
	}
}

// Random decisions, batches, refunds, peeks, resets and rule changes over
// more keys than a one-shard store holds keep the shard's bookkeeping
// exact, for shards of 1 to 130 keys, with and without KeepActive and an
// Observer.
func TestMemShardBookkeeping(t *testing.T) {
	for _, c := range []MemoryConfig{
		{Capacity: 16}, {Capacity: 16, KeepActive: true}, {Capacity: 16, Observer: NopObserver{}},
		{Capacity: 1}, {Capacity: 2}, {Capacity: 3, Observer: NopObserver{}}, {Capacity: 5, KeepActive: true},
		// a span that grows twice
		{Capacity: 2*minSpan + 2}, {Capacity: 2*minSpan + 2, KeepActive: true},
		{Capacity: 2*minSpan + 2, Observer: NopObserver{}},
	} {
		c.Shards = 1
		t.Run(fmt.Sprintf("%d,KeepActive=%v,Observer=%v", c.Capacity, c.KeepActive, c.Observer != nil), func(t *testing.T) {
			m := MustMemoryStore(&c)
			rng := rand.New(rand.NewPCG(1, 2))
			var pols []*Policy
			for _, r := range []Rule{
				{Name: "a", Limit: 5, Window: time.Second},
				{Name: "a", Limit: 3, Window: time.Second, Algorithm: SlidingWindowLog},
				{Name: "a", Limit: 4, Window: time.Second, Algorithm: FixedWindow},
				{Name: "b", Limit: 2, Window: time.Minute, Algorithm: SlidingWindowLog},
				{Name: "b", Limit: 6, Window: time.Minute, Algorithm: LeakyBucket},
			} {
				pols = append(pols, MustPolicy(r))
			}
			ctx := context.Background()
			now := time.Unix(1_700_000_000, 0)
			var out [4]Decision
			nkeys := max(40, 2*c.Capacity)
			for step := 0; step < 5000; step++ {
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				req := func() Request {
					return Request{Policy: pols[rng.IntN(len(pols))], Key: fmt.Sprint("k", rng.IntN(nkeys)), Cost: 1}
				}
				switch op := rng.IntN(20); {
				case op < 11:
					m.Take(ctx, now, []Request{req()}, out[:1])
				case op < 16:
					batch := []Request{req(), req(), req(), req()}[:2+rng.IntN(3)]
					m.Take(ctx, now, batch, out[:len(batch)]) // ErrDuplicateRequest at times
				case op < 18:
					m.Refund(ctx, now, []Request{req()})
				case op < 19:
					m.Peek(ctx, now, []Request{req()}, out[:1])
				default:
					r := req()
					m.Reset(ctx, r.Policy, r.Key)
				}
				checkShard(t, &m.shards[0])
			}
		})
	}
}

// A decision leaves a key in the front half of its shard where it is, and
// moves a key that may have drifted into the back half to the front.
func TestMemShardLazyRecency(t *testing.T) {
	m := MustMemoryStore(&MemoryConfig{Capacity: 16, Shards: 1})
	s := &m.shards[0]
	p := MustPolicy(Rule{Name: "r", Limit: 100, Window: time.Hour})
	ctx := context.Background()
	var out [1]Decision
	take := func(k string) {
		t.Helper()
		if err := m.Take(ctx, time.Unix(0, 0), []Request{{Policy: p, Key: k, Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 16; i++ {
		take(fmt.Sprint("k", i)) // k15 at the front, k0 at the back
	}
	order := func() []uint64 { return order(t, s) }
	hash := func(k string) uint64 { return m.hash(&Request{Policy: p, Key: k}) }
	before := order()
	take("k10") // 5 from the front: stays
	if got := order(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("k10, in the front half, moved")
	}
	take("k7") // 8 from the front (s.lazy): stays
	if got := order(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("k7, at the edge of the front half, moved")
	}
	take("k6") // 9 from the front: to the front
	if got := order(); got[len(got)-1] != hash("k6") {
		t.Fatalf("k6, in the back half, was not moved to the front")
	}
	checkShard(t, s)
}

// Records written under policies that no record uses any more (rule sets
// reloaded over and over) leave nothing in a shard's policy table.
func TestMemShardForgetsUnusedPolicies(t *testing.T) {
	m := MustMemoryStore(&MemoryConfig{Capacity: 8, Shards: 1})
	ctx := context.Background()
	var out [1]Decision
	for i := 0; i < 1000; i++ {
		p := MustPolicy(Rule{Name: "r", Limit: int64(10 + i%7), Window: time.Minute})
		for _, k := range []string{"a", "b", "c"} {
			if err := m.Take(ctx, time.Unix(int64(i), 0), []Request{{Policy: p, Key: k, Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := &m.shards[0]
	checkShard(t, s)
	if len(s.polIndex) != 1 || len(s.pols) > 3 {
		t.Fatalf("%d policies indexed, a table of %d, after 1000 rule sets on 3 keys; want 1 and at most 3 (index 0 unused)", len(s.polIndex), len(s.pols))
	}
}

// Two requests of one batch whose (Name, key) pairs share a hash share one
// record, as the store documents, and leave its bookkeeping exact, new or
// held, with or without a change of policy.
func TestMemShardBatchHashCollision(t *testing.T) {
	m := MustMemoryStore(&MemoryConfig{Capacity: 8, Shards: 1})
	ctx := context.Background()
	newPair := func(limit int64) (a, b *Policy) {
		a = MustPolicy(Rule{Name: "A", Limit: limit, Window: time.Minute})
		b = MustPolicy(Rule{Name: "B", Limit: limit + 1, Window: time.Minute})
		// Make hash(B, "y") equal hash(A, "x").
		b.nameHash = a.nameHash ^ maphashString(m, "x") ^ maphashString(m, "y")
		return a, b
	}
	var out [2]Decision
	for i := 0; i < 20; i++ {
		a, b := newPair(int64(5 + i%3))
		reqs := []Request{{Policy: a, Key: "x", Cost: 1}, {Policy: b, Key: "y", Cost: 1}}
		if m.hash(&reqs[0]) != m.hash(&reqs[1]) {
			t.Fatal("the test's hashes do not collide")
		}
		if err := m.Take(ctx, time.Unix(int64(i), 0), reqs, out[:]); err != nil {
			t.Fatal(err)
		}
		checkShard(t, &m.shards[0])
		if n := m.Len(); n != 1 {
			t.Fatalf("%d keys held, want the one record both requests share", n)
		}
		if i%5 == 4 {
			m.Reset(ctx, a, "x")
			checkShard(t, &m.shards[0])
		}
	}
}

func maphashString(m *MemoryStore, s string) uint64 {
	return m.hash(&Request{Policy: &Policy{}, Key: s})
}

// A shard smaller than minSpan gets a slab of its full span at once.
func TestMemShardSmallSlab(t *testing.T) {
	m := MustMemoryStore(&MemoryConfig{Capacity: 10, Shards: 1})
	p := MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Minute})
	var out [1]Decision
	for i := 0; i < 50; i++ {
		m.Take(context.Background(), time.Unix(int64(i), 0), []Request{{Policy: p, Key: fmt.Sprint(i), Cost: 1}}, out[:])
	}
	s := &m.shards[0]
	if len(s.slab) != 12 || s.span != 12 {
		t.Fatalf("a slab of %d slots, span %d; want 12 (10 keys, 1/8 more, and one)", len(s.slab), s.span)
	}
	checkShard(t, s)
}

// A key takes its home slot when it is free, and is then found there; a
// key whose home another key holds is decided on its own record, never on
// the one its home holds.
func TestMemShardHomeSlots(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 4 * minSpan})
	p := MustPolicy(Rule{Name: "r", Limit: 3, Window: time.Hour})
	take := func(k string) bool { return do(Request{Policy: p, Key: k, Cost: 1}).Allowed }
	home := func(k string) uint32 { return s.home(m.hash(&Request{Policy: p, Key: k})) }
	slot := func(k string) uint32 {
		i, ok := s.lookup(m.hash(&Request{Policy: p, Key: k}))
		if !ok {
			t.Fatalf("%q not held", k)
		}
		return i
	}

	// Two keys sharing a home slot: the first takes it, the second goes
	// elsewhere.
	first := "k0"
	second := ""
	for i := 1; second == ""; i++ {
		if k := fmt.Sprint("k", i); home(k) == home(first) {
			second = k
		}
	}
	take(first)
	if slot(first) != home(first) {
		t.Fatalf("the first key is at slot %d, its home is %d", slot(first), home(first))
	}
	take(second)
	if slot(second) == home(second) || slot(first) != home(first) {
		t.Fatal("the second key took the home slot the first holds")
	}
	// The first key spends its quota; the second, whose search starts at
	// the first's slot, still has all of its own.
	for i := 1; i < 3; i++ {
		take(first)
	}
	if take(first) {
		t.Fatal("the first key was admitted beyond its limit")
	}
	for i := 1; i < 3; i++ {
		if !take(second) {
			t.Fatalf("the second key was refused on its request %d of 3: decided on the first key's record", i+1)
		}
	}
	if take(second) {
		t.Fatal("the second key was admitted beyond its limit")
	}
	checkShard(t, s)
}

// Filling a shard to capacity places every key, and a key added to the
// full shard after an eviction is found, the evicted key no longer.
func TestMemShardFillsEverySlot(t *testing.T) {
	const capacity = 2*minSpan + 3
	m, s, take := oneShard(t, MemoryConfig{Capacity: capacity})
	p := MustPolicy(Rule{Name: "r", Limit: 3, Window: time.Hour})
	for i := 0; i < capacity; i++ {
		if d := take(Request{Policy: p, Key: fmt.Sprint(i), Cost: 1}); !d.Allowed {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	if n := s.count(); n != capacity {
		t.Fatalf("%d keys held, want %d", n, capacity)
	}
	if s.span != fullSpan(capacity) {
		t.Fatalf("span %d for a full shard; want %d", s.span, fullSpan(capacity))
	}
	checkShard(t, s)
	oldest := order(t, s)[0]
	if d := take(Request{Policy: p, Key: "new", Cost: 1}); !d.Allowed {
		t.Fatalf("new key: %+v", d)
	}
	if _, ok := s.lookup(m.hash(&Request{Policy: p, Key: "new"})); !ok {
		t.Fatal("the new key is not found")
	}
	if _, ok := s.lookup(oldest); ok {
		t.Fatal("the evicted key is still found")
	}
	checkShard(t, s)
}

// When a shard's span grows, every key is placed anew under the new span;
// the LRU keeps its order and every key its stamp, and every record (a
// sliding log too) keeps its state.
//
// The store keeps exact recency (KeepActive), so that the keys' second
// requests, made in reverse, reorder the LRU before the span grows.
func TestMemShardGrow(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 8 * minSpan, KeepActive: true})
	pols := []*Policy{
		MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour}),
		MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour, Algorithm: SlidingWindowLog}),
	}
	req := func(i int) Request {
		return Request{Policy: pols[i%2], Key: fmt.Sprint("k", i), Cost: 1}
	}
	take := func(i int) Decision { return do(req(i)) }
	first := s.span
	// Fill the first span to three quarters, each key charged twice, in
	// an order that differs from the keys' first requests.
	n := int(first) * 3 / 4
	for i := 0; i < n; i++ {
		take(i)
	}
	for i := n - 1; i >= 0; i-- {
		take(i)
	}
	if s.span != first {
		t.Fatalf("span %d with %d keys; want %d", s.span, n, first)
	}
	order := s.lru.Keys()
	if r := req(0); order[len(order)-1] != m.hash(&r) {
		t.Fatal("the second requests did not reorder the LRU")
	}
	stamps := map[uint64]uint32{}
	for _, h := range order {
		_, sl := s.get(h)
		stamps[h] = sl.stamp
	}
	// One more key about doubles the span.
	take(n)
	if want := nextSpan(first, fullSpan(s.cap)); s.span != want || want < 2*first-1 {
		t.Fatalf("span %d with %d keys; want %d", s.span, n+1, want)
	}
	n++
	after := s.lru.Keys()
	r := req(n - 1)
	if want := append(order, m.hash(&r)); !slices.Equal(after, want) {
		t.Fatal("the LRU order changed when the span grew")
	}
	atHome := 0
	for _, h := range order {
		i, sl := s.get(h)
		if sl.stamp != stamps[h] {
			t.Fatalf("key %x: stamp %d after the growth, %d before", h, sl.stamp, stamps[h])
		}
		if i.slot == s.home(h) {
			atHome++
		}
	}
	if atHome == 0 {
		t.Fatal("no key is at its home")
	}
	checkShard(t, s)
	// Every record kept its state: each key has its remaining requests.
	for i := 0; i < n; i++ {
		left := 3
		if i == n-1 {
			left = 4
		}
		for j := 0; j < left; j++ {
			if d := take(i); !d.Allowed {
				t.Fatalf("key %d refused with %d of its requests left", i, left-j)
			}
		}
		if d := take(i); d.Allowed {
			t.Fatalf("key %d admitted beyond its limit", i)
		}
	}
	checkShard(t, s)
}

// A full shard that keeps evicting keeps its slab in order (checkShard),
// and its keys are still decided on their own records.
func TestMemShardChurn(t *testing.T) {
	const capacity = 2 * minSpan
	_, s, do := oneShard(t, MemoryConfig{Capacity: capacity})
	p := MustPolicy(Rule{Name: "r", Limit: 2, Window: time.Hour})
	take := func(k string) bool { return do(Request{Policy: p, Key: k, Cost: 1}).Allowed }
	for i := 0; i < 4*capacity; i++ {
		take(fmt.Sprint(i))
	}
	checkShard(t, s)
	// The keys held are the last capacity ones: each has one request left.
	for i := 3 * capacity; i < 4*capacity; i++ {
		if !take(fmt.Sprint(i)) {
			t.Fatalf("key %d refused on its second request", i)
		}
		if take(fmt.Sprint(i)) {
			t.Fatalf("key %d admitted beyond its limit", i)
		}
	}
	checkShard(t, s)
}

// A key left idle while 2^32 keys go to the front of its shard is still
// seen to have drifted when it is decided again (and goes to the front),
// though its 32-bit stamp has wrapped around: restamp keeps it marked.
func TestMemShardStampWraps(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 16})
	p := MustPolicy(Rule{Name: "r", Limit: 1 << 20, Window: time.Hour})
	take := func(k string) { do(Request{Policy: p, Key: k, Cost: 1}) }
	hash := func(k string) uint64 { return m.hash(&Request{Policy: p, Key: k}) }
	for i := 0; i < 16; i++ {
		take(fmt.Sprint("k", i)) // k0 at the back, its stamp 1
	}
	// Four times, jump to just before a restamp and send a drifted key to
	// the front: 2^32 keys have then gone there since k0's stamp.
	for j := 1; j <= 4; j++ {
		s.tick = uint64(j)*restampEvery - 1
		take(fmt.Sprint("k", 16-j))
	}
	if uint32(s.tick) != 0 {
		t.Fatalf("tick %d", s.tick)
	}
	// A few keys more go to the front: k0's raw distance, modulo 2^32,
	// is now less than s.lazy.
	for i := 1; i <= 4; i++ {
		take(fmt.Sprint("k", i))
	}
	checkShard(t, s)
	take("k0")
	if got := order(t, s); got[len(got)-1] != hash("k0") {
		t.Fatalf("k0, idle while 2^32 keys went to the front, was not moved there")
	}
	checkShard(t, s)
}

// oneShard returns a store of one shard made with cfg, its shard, and a
// function taking one unit of r's key at a fixed time.
func oneShard(t *testing.T, cfg MemoryConfig) (*MemoryStore, *memShard, func(r Request) Decision) {
	t.Helper()
	cfg.Shards = 1
	m := MustMemoryStore(&cfg)
	now := time.Unix(1_700_000_000, 0)
	take := func(r Request) Decision {
		t.Helper()
		var out [1]Decision
		if err := m.Take(context.Background(), now, []Request{r}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	return m, &m.shards[0], take
}

// A batch whose new key makes the span grow charges all its keys, the
// held one on the record it had before the shard placed its keys anew.
func TestMemShardGrowInBatch(t *testing.T) {
	m, s, take := oneShard(t, MemoryConfig{Capacity: 4 * minSpan})
	p := MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour})
	first := s.span
	n := int(first) * 3 / 4
	for i := 0; i < n; i++ {
		take(Request{Policy: p, Key: fmt.Sprint("k", i), Cost: 1})
	}
	take(Request{Policy: p, Key: "k0", Cost: 1}) // k0 has 3 left
	if s.span != first {
		t.Fatalf("span %d before the batch; want %d", s.span, first)
	}
	// The new key first: the held key's record is written after the
	// shard has placed its keys anew.
	batch := []Request{{Policy: p, Key: "new", Cost: 1}, {Policy: p, Key: "k0", Cost: 2}}
	var out [2]Decision
	if err := m.Take(context.Background(), time.Unix(1_700_000_000, 0), batch, out[:]); err != nil {
		t.Fatal(err)
	}
	if want := nextSpan(first, fullSpan(s.cap)); s.span != want {
		t.Fatalf("span %d after the batch; want %d", s.span, want)
	}
	if !out[0].Allowed || out[0].Remaining != 4 || !out[1].Allowed || out[1].Remaining != 1 {
		t.Fatalf("batch decisions %+v, %+v; want admitted with 4 and 1 remaining", out[0], out[1])
	}
	checkShard(t, s)
	if d := take(Request{Policy: p, Key: "k0", Cost: 1}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("k0 after the batch: %+v; want its last unit", d)
	}
	if d := take(Request{Policy: p, Key: "k0", Cost: 1}); d.Allowed {
		t.Fatal("k0 admitted beyond its limit")
	}
}

// A shard's spans run from minSpan slots (its full span, when smaller) up
// to its full span, each step at most a doubling (so that a shard's slab
// stays dense), at most ⌈log2(c/minSpan)⌉ steps, and, from a full span of
// 1,000 slots, the last step about a doubling too: a shard filling up
// then places at most 0.94 of a key anew per slot in all, and at most 0.8
// from 8,192 slots.
func TestNextSpan(t *testing.T) {
	caps := []uint32{1<<20 + 5}
	for c := uint32(1); c <= 20_000; c++ {
		caps = append(caps, c)
	}
	caps = append(caps, fullSpan(int(maxShardCapacity)), 1<<32-1)
	for _, c := range caps {
		span := nextSpan(0, c)
		if span > max(minSpan, (c+1)/2) || span > c || span < min(c, minSpan/2) {
			t.Fatalf("full span %d: first span %d", c, span)
		}
		placed, steps, last := 0.0, 0, 0.0
		for span < c {
			next := nextSpan(span, c)
			if next <= span || next > c {
				t.Fatalf("full span %d: span %d grows to %d", c, span, next)
			}
			last = float64(next) / float64(span)
			if last > 2 || span >= 2048 && last < 1.9 {
				t.Fatalf("full span %d: span %d grows to %d (%.3fx)", c, span, next, last)
			}
			placed += 0.75 * float64(span)
			steps++
			span = next
		}
		if c > minSpan && steps > int(math.Ceil(math.Log2(float64(c)/minSpan))) {
			t.Fatalf("full span %d: %d steps", c, steps)
		}
		perSlot := placed / float64(c)
		if c >= 1000 && (last < 1.75 || perSlot > 0.94) || c >= 8192 && perSlot > 0.8 {
			t.Fatalf("full span %d: last step %.3fx, %.3f keys placed anew per slot", c, last, perSlot)
		}
	}
	var got []uint32
	for span := uint32(0); span < 16935; {
		span = nextSpan(span, 16935)
		got = append(got, span)
	}
	if want := []uint32{34, 67, 133, 265, 530, 1059, 2117, 4234, 8468, 16935}; !slices.Equal(got, want) {
		t.Fatalf("spans of a full span of 16,935: %v; want %v", got, want)
	}
	if got := fullSpan(int(maxShardCapacity)); uint64(got) <= maxShardCapacity {
		t.Fatalf("full span %d for %d keys", got, maxShardCapacity)
	}
}

// TestSlidingLogMemoryBound: a key's sliding log never holds room for more
// entries than its policy's capacity (each live entry holds a unit), so it
// keeps the documented 16 bytes per unit of Limit.
func TestSlidingLogMemoryBound(t *testing.T) {
	for _, limit := range []int64{1, 3, 5, 1025, 4096} {
		p := MustPolicy(Rule{Algorithm: SlidingWindowLog, Limit: limit, Window: time.Hour})
		var st State
		var d Decision
		for i := int64(0); i < limit; i++ {
			p.alg.Decide(p, &st, 1, 1_000+i, true, &d)
			if !d.Allowed {
				t.Fatalf("limit %d: request %d refused", limit, i)
			}
		}
		if n := int64(cap(st.log.ents)); n != limit {
			t.Errorf("limit %d: a log of %d entries has room for %d", limit, st.log.len, n)
		}
	}
}

// TestMemShardLayout checks that a shard's lock and hot record share one
// cache line, and that shards, allocated together, start cache lines.
func TestMemShardLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the padding is sized for 64-bit platforms")
	}
	var s memShard
	if n := unsafe.Sizeof(s); n%64 != 0 {
		t.Errorf("a memShard is %d bytes, not a whole number of 64-byte cache lines: adjust its padding", n)
	}
	if end := unsafe.Offsetof(s.hotB) + unsafe.Sizeof(s.hotB); end > 64 {
		t.Errorf("the hot record ends at byte %d of its shard, past the lock's cache line", end)
	}
}

// Keys whose runs of slots wrap around the end of the slab are placed,
// found, moved and removed as the others: a key inserted before a run
// that crosses the end shifts keys into the slab's first slots, and a key
// removed before it shifts them back.
func TestMemShardWrapAround(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 16})
	p := MustPolicy(Rule{Name: "r", Limit: 3, Window: time.Hour})
	n := s.span
	if n != fullSpan(16) {
		t.Fatalf("span %d; want the full span %d at once", n, fullSpan(16))
	}
	hash := func(k string) uint64 { return m.hash(&Request{Policy: p, Key: k}) }
	// keys returns count keys whose home is slot home.
	keys := func(home uint32, count int, prefix string) []string {
		var ks []string
		for i := 0; len(ks) < count; i++ {
			if k := fmt.Sprint(prefix, i); s.home(hash(k)) == home {
				ks = append(ks, k)
			}
		}
		return ks
	}
	slot := func(k string) uint32 {
		t.Helper()
		i, ok := s.lookup(hash(k))
		if !ok {
			t.Fatalf("%q not found", k)
		}
		return i
	}
	take := func(k string) Decision { return do(Request{Policy: p, Key: k, Cost: 1}) }
	a := keys(n-2, 2, "a") // home: the slot before the last
	b := keys(n-1, 2, "b") // home: the last slot
	take(a[0])             // slot n-2
	take(b[0])             // slot n-1
	take(b[1])             // wraps to slot 0
	if got := []uint32{slot(a[0]), slot(b[0]), slot(b[1])}; !slices.Equal(got, []uint32{n - 2, n - 1, 0}) {
		t.Fatalf("slots %v; want [%d %d 0]", got, n-2, n-1)
	}
	checkShard(t, s)
	// a[1] belongs before b[0]: b[0] and b[1] move on, across the end.
	take(a[1])
	if got := []uint32{slot(a[0]), slot(a[1]), slot(b[0]), slot(b[1])}; !slices.Equal(got, []uint32{n - 2, n - 1, 0, 1}) {
		t.Fatalf("slots %v; want [%d %d 0 1]", got, n-2, n-1)
	}
	checkShard(t, s)
	// Each key kept its own record: a second request leaves 1 of 3.
	for _, k := range append(a, b...) {
		if d := take(k); !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%q: %+v; want its second unit", k, d)
		}
	}
	// Removing a[0] moves the others back, across the end.
	m.Reset(context.Background(), p, a[0])
	if got := []uint32{slot(a[1]), slot(b[0]), slot(b[1])}; !slices.Equal(got, []uint32{n - 2, n - 1, 0}) {
		t.Fatalf("slots %v after a removal; want [%d %d 0]", got, n-2, n-1)
	}
	checkShard(t, s)
	for _, k := range []string{a[1], b[0], b[1]} {
		if d := take(k); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%q: %+v; want its last unit", k, d)
		}
	}
	if d := take(a[0]); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("%q after its reset: %+v; want a fresh quota", a[0], d)
	}
	checkShard(t, s)
}
