package core

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// checkShard verifies the bookkeeping of a shard against its LRU: every key
// has its own slot, marked used, and the other slots are marked free and
// zeroed, the policy table counts exactly the records using each
// policy and holds no other, every sliding log belongs to a live slot, and
// no key is further from the front than its stamp allows.
func checkShard(t *testing.T, s *memShard) {
	t.Helper()
	keys := s.lru.Keys() // oldest first
	n := len(keys)
	used := map[uint32]bool{}
	refs := map[uint32]uint32{}
	for pos, h := range keys {
		ref, ok := s.lru.Peek(h)
		if !ok {
			t.Fatalf("key %x listed but not held", h)
		}
		if used[ref.slot] {
			t.Fatalf("slot %d held by two keys", ref.slot)
		}
		used[ref.slot] = true
		if int(ref.pol) >= len(s.pols) || s.pols[ref.pol] == nil {
			t.Fatalf("key %x names policy %d, which the table does not hold", h, ref.pol)
		}
		refs[ref.pol]++
		if fromFront := uint64(n - 1 - pos); fromFront > s.tick-ref.stamp {
			t.Fatalf("key %x is %d from the front, but only %d keys went there since its stamp", h, fromFront, s.tick-ref.stamp)
		}
	}
	if s.span == 0 || int(s.span) > s.cap || int(s.span) < s.cap && uint64(n)*4 > uint64(s.span)*3 {
		t.Fatalf("span %d for %d keys in a shard of %d", s.span, n, s.cap)
	}
	home := uint32(0)
	for _, h := range keys {
		if ref, _ := s.lru.Peek(h); ref.slot == s.home(h) {
			home++
		}
	}
	if home != s.athome || s.guessing != (home*2 >= uint32(n)) {
		t.Fatalf("%d of %d keys at home; the shard counts %d, guessing %v", home, n, s.athome, s.guessing)
	}
	held := 0
	for i := uint32(0); i < uint32(len(s.used))*64; i++ {
		switch {
		case i >= s.span && i < uint32(s.cap) && s.isUsed(i):
			t.Fatalf("slot %d, past the span (%d), is used", i, s.span)
		case i >= uint32(s.cap):
			if !s.isUsed(i) {
				t.Fatalf("bit %d, past the last slot (%d), is clear", i, s.cap)
			}
		case s.isUsed(i):
			if !used[i] {
				t.Fatalf("slot %d marked used, but no key holds it", i)
			}
			held++
		case used[i]:
			t.Fatalf("slot %d held by a key, but marked free", i)
		default:
			if c := s.slab[i>>slabShift]; c != nil && c[i&slabMask] != (memSlot{}) {
				t.Fatalf("free slot %d not cleared: %+v", i, c[i&slabMask])
			}
		}
	}
	if held != n {
		t.Fatalf("%d slots marked used, %d keys held", held, n)
	}
	if s.none != (memSlot{}) {
		t.Fatalf("the shard's unused slot was written: %+v", s.none)
	}
	live := 0
	for i, p := range s.pols {
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
	if live != len(s.polIndex) || live+len(s.polFree) != len(s.pols) {
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
	for slot, l := range s.logs {
		if !used[slot] || l == nil {
			t.Fatalf("sliding log of slot %d, held %v", slot, used[slot])
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
		// slots in three chunks and three words of the used bits, a span
		// that grows twice
		{Capacity: 2*slabChunk + 2}, {Capacity: 2*slabChunk + 2, KeepActive: true},
		{Capacity: 2*slabChunk + 2, Observer: NopObserver{}},
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
	order := func() []uint64 { return s.lru.Keys() }
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
	if len(s.polIndex) != 1 || len(s.pols) > 2 {
		t.Fatalf("%d policies indexed, a table of %d, after 1000 rule sets on 3 keys; want 1 and at most 2", len(s.polIndex), len(s.pols))
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

// A shard smaller than a slab chunk gets a chunk of its own size.
func TestMemShardSmallSlab(t *testing.T) {
	m := MustMemoryStore(&MemoryConfig{Capacity: 10, Shards: 1})
	p := MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Minute})
	var out [1]Decision
	for i := 0; i < 50; i++ {
		m.Take(context.Background(), time.Unix(int64(i), 0), []Request{{Policy: p, Key: fmt.Sprint(i), Cost: 1}}, out[:])
	}
	s := &m.shards[0]
	if len(s.slab) != 1 || len(s.slab[0]) != 10 {
		t.Fatalf("slab of %d chunks, the first of %d slots; want one of 10", len(s.slab), len(s.slab[0]))
	}
	checkShard(t, s)
}

// A key takes its home slot when it is free, and is then found there; a
// key whose home another key holds is decided on its own record, never on
// the one its home holds; and a shard allocates only the chunks of slots
// its keys use.
func TestMemShardHomeSlots(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 4 * slabChunk})
	p := MustPolicy(Rule{Name: "r", Limit: 3, Window: time.Hour})
	take := func(k string) bool { return do(Request{Policy: p, Key: k, Cost: 1}).Allowed }
	home := func(k string) uint32 { return s.home(m.hash(&Request{Policy: p, Key: k})) }
	slot := func(k string) uint32 {
		ref, ok := s.lru.Peek(m.hash(&Request{Policy: p, Key: k}))
		if !ok {
			t.Fatalf("%q not held", k)
		}
		return ref.slot
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
	if chunks := allocatedChunks(s); chunks != 1 {
		t.Fatalf("%d chunks allocated for one key; want 1", chunks)
	}
	take(second)
	if slot(second) == home(second) {
		t.Fatal("the second key took the home slot the first holds")
	}
	// The first key spends its quota; the second, guessed at the first's
	// slot, still has all of its own.
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

func allocatedChunks(s *memShard) int {
	n := 0
	for _, c := range s.slab {
		if c != nil {
			n++
		}
	}
	return n
}

// Filling a shard to capacity places every key (the last ones by searching
// the used bits forward from their home, wrapping around), and a key added
// to the full shard after an eviction takes the slot freed.
func TestMemShardFillsEverySlot(t *testing.T) {
	const capacity = 2*slabChunk + 3
	m, s, take := oneShard(t, MemoryConfig{Capacity: capacity})
	p := MustPolicy(Rule{Name: "r", Limit: 3, Window: time.Hour})
	for i := 0; i < capacity; i++ {
		if d := take(Request{Policy: p, Key: fmt.Sprint(i), Cost: 1}); !d.Allowed {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	if n := s.lru.Len(); n != capacity {
		t.Fatalf("%d keys held, want %d", n, capacity)
	}
	if chunks := allocatedChunks(s); chunks != len(s.slab) || chunks != 3 {
		t.Fatalf("%d of %d chunks allocated; want all 3", chunks, len(s.slab))
	}
	checkShard(t, s)
	_, ref, _ := s.lru.GetOldest()
	if d := take(Request{Policy: p, Key: "new", Cost: 1}); !d.Allowed {
		t.Fatalf("new key: %+v", d)
	}
	got, ok := s.lru.Peek(m.hash(&Request{Policy: p, Key: "new"}))
	if !ok || got.slot != ref.slot {
		t.Fatalf("the new key is at slot %d (held %v); the evicted key's was %d", got.slot, ok, ref.slot)
	}
	checkShard(t, s)
}

// When a shard's span grows, every key is placed anew under the new span:
// at its home when free, else where a new key would go; the LRU keeps its
// order, each key's stamp is then exactly its distance from the front, and
// every record (a sliding log too) keeps its state.
//
// The store keeps exact recency (KeepActive), so that the keys' second
// requests, made in reverse, reorder the LRU before the span grows.
func TestMemShardGrow(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 8 * slabChunk, KeepActive: true})
	pols := []*Policy{
		MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour}),
		MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour, Algorithm: SlidingWindowLog}),
	}
	req := func(i int) Request {
		return Request{Policy: pols[i%2], Key: fmt.Sprint("k", i), Cost: 1}
	}
	take := func(i int) Decision { return do(req(i)) }
	// Fill the first span to three quarters, each key charged twice, in
	// an order that differs from the keys' first requests.
	n := slabChunk * 3 / 4
	for i := 0; i < n; i++ {
		take(i)
	}
	for i := n - 1; i >= 0; i-- {
		take(i)
	}
	if s.span != slabChunk {
		t.Fatalf("span %d with %d keys; want %d", s.span, n, slabChunk)
	}
	order := s.lru.Keys()
	if r := req(0); order[len(order)-1] != m.hash(&r) {
		t.Fatal("the second requests did not reorder the LRU")
	}
	// One more key doubles the span.
	take(n)
	if s.span != 2*slabChunk {
		t.Fatalf("span %d with %d keys; want %d", s.span, n+1, 2*slabChunk)
	}
	n++
	after := s.lru.Keys()
	r := req(n - 1)
	if want := append(order, m.hash(&r)); !slices.Equal(after, want) {
		t.Fatal("the LRU order changed when the span grew")
	}
	atHome := 0
	for pos, h := range after {
		ref, _ := s.lru.Peek(h)
		if d := uint64(len(after) - 1 - pos); s.tick-ref.stamp != d {
			t.Fatalf("key at %d from the front has stamp distance %d", d, s.tick-ref.stamp)
		}
		if home := s.home(h); ref.slot == home {
			atHome++
		} else if !s.isUsed(home) {
			t.Fatalf("a key is at slot %d while its home %d is free", ref.slot, home)
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

// A full shard that keeps evicting places its new keys in the slots freed,
// not at their homes: once fewer than half of its keys are at home, its
// decisions stop guessing (checkShard checks the count), and the keys are
// still decided on their own records.
func TestMemShardStopsGuessing(t *testing.T) {
	const capacity = 2 * slabChunk
	_, s, do := oneShard(t, MemoryConfig{Capacity: capacity})
	p := MustPolicy(Rule{Name: "r", Limit: 2, Window: time.Hour})
	take := func(k string) bool { return do(Request{Policy: p, Key: k, Cost: 1}).Allowed }
	for i := 0; i < 4*capacity; i++ {
		take(fmt.Sprint(i))
	}
	checkShard(t, s)
	if s.guessing {
		t.Fatalf("%d of %d keys at home after the shard evicted %d: still guessing", s.athome, s.lru.Len(), 3*capacity)
	}
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
	m, s, take := oneShard(t, MemoryConfig{Capacity: 4 * slabChunk})
	p := MustPolicy(Rule{Name: "r", Limit: 5, Window: time.Hour})
	n := slabChunk * 3 / 4
	for i := 0; i < n; i++ {
		take(Request{Policy: p, Key: fmt.Sprint("k", i), Cost: 1})
	}
	take(Request{Policy: p, Key: "k0", Cost: 1}) // k0 has 3 left
	if s.span != slabChunk {
		t.Fatalf("span %d before the batch; want %d", s.span, slabChunk)
	}
	// The new key first: the held key's record is written after the
	// shard has placed its keys anew.
	batch := []Request{{Policy: p, Key: "new", Cost: 1}, {Policy: p, Key: "k0", Cost: 2}}
	var out [2]Decision
	if err := m.Take(context.Background(), time.Unix(1_700_000_000, 0), batch, out[:]); err != nil {
		t.Fatal(err)
	}
	if s.span != 2*slabChunk {
		t.Fatalf("span %d after the batch; want %d", s.span, 2*slabChunk)
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

// A shard's spans run from 64 slots (its capacity, when smaller) up to
// its capacity, each short of the capacity a whole number of chunks, each
// step at most a doubling (so that a shard's slab stays dense), at most
// ⌈log2(c/64)⌉ steps, and, in a shard of 1,000 slots or more, the last
// step about a doubling too: a shard filling to its capacity then places
// at most 0.94 of a key anew per slot in all, and at most 0.8 from 8,192
// slots.
func TestNextSpan(t *testing.T) {
	caps := []int{1<<20 + 5}
	for c := 1; c <= 20_000; c++ {
		caps = append(caps, c)
	}
	if strconv.IntSize == 64 {
		for _, c := range []uint64{1<<31 + 1, maxShardCapacity} {
			caps = append(caps, int(c))
		}
	}
	for _, c := range caps {
		span := nextSpan(0, c)
		if want := uint32(min(c, slabChunk)); span != want {
			t.Fatalf("capacity %d: first span %d; want %d", c, span, want)
		}
		placed, steps, last := 0.0, 0, 0.0
		for int(span) < c {
			next := nextSpan(span, c)
			if next <= span || int(next) > c {
				t.Fatalf("capacity %d: span %d grows to %d", c, span, next)
			}
			if int(next) < c && next%slabChunk != 0 {
				t.Fatalf("capacity %d: span %d is not a whole number of chunks", c, next)
			}
			last = float64(next) / float64(span)
			if last > 2 || span >= 2048 && last < 1.9 {
				t.Fatalf("capacity %d: span %d grows to %d (%.3fx)", c, span, next, last)
			}
			placed += 0.75 * float64(span)
			steps++
			span = next
		}
		if c > slabChunk && steps > int(math.Ceil(math.Log2(float64(c)/slabChunk))) {
			t.Fatalf("capacity %d: %d steps", c, steps)
		}
		perSlot := placed / float64(c)
		if c >= 1000 && (last < 1.75 || perSlot > 0.94) || c >= 8192 && perSlot > 0.8 {
			t.Fatalf("capacity %d: last step %.3fx, %.3f keys placed anew per slot", c, last, perSlot)
		}
	}
	var got []uint32
	for span := uint32(0); int(span) < 16935; {
		span = nextSpan(span, 16935)
		got = append(got, span)
	}
	if want := []uint32{64, 128, 192, 320, 576, 1088, 2176, 4288, 8512, 16935}; !slices.Equal(got, want) {
		t.Fatalf("spans of a shard of 16,935: %v; want %v", got, want)
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
	if end := unsafe.Offsetof(s.hot) + unsafe.Sizeof(s.hot); end > 64 {
		t.Errorf("the hot record ends at byte %d of its shard, past the lock's cache line", end)
	}
}
