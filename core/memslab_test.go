package core

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// checkShard verifies the bookkeeping of a shard against its LRU: every key
// has its own slot, the free list holds exactly the other slots (zeroed but
// for its links), the policy table counts exactly the records using each
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
	free := 0
	for i := s.free; i != 0; {
		slot := i - 1
		if used[slot] {
			t.Fatalf("slot %d is both free and held", slot)
		}
		sl := s.at(slot)
		if sl.B != 0 {
			t.Fatalf("free slot %d not cleared: %+v", slot, *sl)
		}
		if free++; free > int(s.nslots) {
			t.Fatal("the free list loops")
		}
		i = uint32(sl.A)
	}
	if free+n != int(s.nslots) {
		t.Fatalf("%d free and %d held slots, %d handed out", free, n, s.nslots)
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
// exact, for shards of 1 to 16 keys, with and without KeepActive and an
// Observer.
func TestMemShardBookkeeping(t *testing.T) {
	for _, c := range []MemoryConfig{
		{Capacity: 16}, {Capacity: 16, KeepActive: true}, {Capacity: 16, Observer: NopObserver{}},
		{Capacity: 1}, {Capacity: 2}, {Capacity: 3, Observer: NopObserver{}}, {Capacity: 5, KeepActive: true},
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
			for step := 0; step < 5000; step++ {
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				req := func() Request {
					return Request{Policy: pols[rng.IntN(len(pols))], Key: fmt.Sprint("k", rng.IntN(40)), Cost: 1}
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
