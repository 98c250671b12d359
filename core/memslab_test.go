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
	for slot, l := range s.logs {
		if !used[slot] || l == nil {
			t.Fatalf("sliding log of slot %d, held %v", slot, used[slot])
		}
	}
}

// Random decisions, batches, refunds, peeks and rule changes over more
// keys than a one-shard store holds keep the shard's bookkeeping exact.
func TestMemShardBookkeeping(t *testing.T) {
	for _, keepActive := range []bool{false, true} {
		t.Run(fmt.Sprint("KeepActive=", keepActive), func(t *testing.T) {
			m := MustMemoryStore(&MemoryConfig{Capacity: 16, Shards: 1, KeepActive: keepActive})
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
				switch op := rng.IntN(10); {
				case op < 6:
					m.Take(ctx, now, []Request{req()}, out[:1])
				case op < 8:
					a, b := req(), req()
					if a.Key != b.Key || a.Policy.rule.Name != b.Policy.rule.Name {
						m.Take(ctx, now, []Request{a, b}, out[:2])
					}
				case op < 9:
					m.Refund(ctx, now, []Request{req()})
				default:
					m.Peek(ctx, now, []Request{req()}, out[:1])
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
