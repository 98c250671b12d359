package core

import (
	"math"
	"testing"
)

// TestDefaultShardsCompactIndexes checks the default shard count: small
// stores keep DefaultShards halved to minShardCapacity keys per shard;
// large ones get a count in [48, 96] whose shards, when full, average at
// most mapTableFill keys per hash table, and whose indexes never take more
// slots than DefaultShards shards would.
func TestDefaultShardsCompactIndexes(t *testing.T) {
	for c, want := range map[int]int{1: 1, 100: 1, 128: 2, 1000: 8, 4096: 64, 10_000: 64} {
		if got := defaultShards(c); got != want {
			t.Errorf("defaultShards(%d) = %d, want %d", c, got, want)
		}
	}
	for c := 48 * mapTableKeys; c <= 20_000_000; c = c*11/10 + 7 {
		s := defaultShards(c)
		if s < DefaultShards*3/4 || s > DefaultShards*3/2 {
			t.Fatalf("defaultShards(%d) = %d, want in [48, 96]", c, s)
		}
		per := c / s
		slots := indexSlots(per)
		if tables := slots / mapTableSlots; per > tables*mapTableFill {
			t.Errorf("capacity %d: %d shards of %d keys over %d tables, more than %d keys per table", c, s, per, tables, mapTableFill)
		}
		if got, def := s*slots, DefaultShards*indexSlots(c/DefaultShards); got > def {
			t.Errorf("capacity %d: %d shards take %d slots, more than %d with %d shards", c, s, got, def, DefaultShards)
		}
	}
	// The capacity of the heap benchmarks: 64 shards of 16,406 keys would
	// need 32 tables each, 2,048 in all; 81 shards need 16 each, 1,296.
	if s := defaultShards(1_050_000); s*indexSlots(1_050_000/s) > 1400*mapTableSlots {
		t.Errorf("defaultShards(1050000) = %d: %d tables", s, s*indexSlots(1_050_000/s)/mapTableSlots)
	}
}

// TestShardIndexInRange checks that shard maps every hash into
// [0, shards), the extremes included, for counts that are not powers of
// two.
func TestShardIndexInRange(t *testing.T) {
	for _, n := range []int{1, 3, 48, 81, 96, 1000} {
		m := &MemoryStore{nshards: uint64(n)}
		if got := m.shard(0); got != 0 {
			t.Errorf("%d shards: shard(0) = %d", n, got)
		}
		if got := m.shard(math.MaxUint64); got != n-1 {
			t.Errorf("%d shards: shard(MaxUint64) = %d, want %d", n, got, n-1)
		}
		seen := make([]int, n)
		for i := uint64(0); i < uint64(n)*64; i++ {
			seen[m.shard(i*0x9e3779b97f4a7c15)]++
		}
		for i, c := range seen {
			if c == 0 {
				t.Errorf("%d shards: shard %d never chosen", n, i)
			}
		}
	}
}
