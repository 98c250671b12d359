package core_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/limitry/ratelimit/core"
)

func TestSlotTable(t *testing.T) {
	ctx := context.Background()
	tab := core.NewSlotTable(0)
	out := make([]core.SlotDecision, 2)
	a := core.SlotRequest{Name: "a", Key: "k", Limit: 2}
	b := core.SlotRequest{Name: "b", Key: "k", Limit: 1}

	rel1, err := tab.Acquire(ctx, []core.SlotRequest{a, b}, out)
	if err != nil || rel1 == nil {
		t.Fatalf("first: %v, %v", rel1 != nil, err)
	}
	if out[0] != (core.SlotDecision{Allowed: true, Limit: 2, InFlight: 1}) || out[1] != (core.SlotDecision{Allowed: true, Limit: 1, InFlight: 1}) {
		t.Fatalf("first decisions %+v", out)
	}
	// b is full: the batch takes nothing, not even a's free slot.
	rel2, err := tab.Acquire(ctx, []core.SlotRequest{a, b}, out)
	if err != nil || rel2 != nil {
		t.Fatalf("second: %v, %v, want a refusal", rel2 != nil, err)
	}
	if !out[0].Allowed || out[0].InFlight != 1 || out[1].Allowed || out[1].InFlight != 1 {
		t.Fatalf("second decisions %+v", out)
	}
	if got := tab.InFlight("a", "k"); got != 1 {
		t.Fatalf("a holds %d after a refused batch, want 1", got)
	}
	rel1()
	rel1() // never twice
	if tab.Len() != 0 || tab.InFlight("a", "k") != 0 {
		t.Fatalf("after release: %d keys", tab.Len())
	}
	rel3, _ := tab.Acquire(ctx, []core.SlotRequest{a}, out)
	rel4, _ := tab.Acquire(ctx, []core.SlotRequest{a}, out)
	rel1() // a stale release must not free the slots of others
	if got := tab.InFlight("a", "k"); got != 2 {
		t.Fatalf("a holds %d, want 2", got)
	}
	rel3()
	rel4()
}

func TestSlotTableErrors(t *testing.T) {
	ctx := context.Background()
	tab := core.NewSlotTable(2)
	out := make([]core.SlotDecision, core.MaxBatch+1)
	cases := []struct {
		name string
		reqs []core.SlotRequest
		want error
	}{
		{"zero limit", []core.SlotRequest{{Name: "a", Key: "k"}}, core.ErrInvalidSlotRequest},
		{"no name", []core.SlotRequest{{Key: "k", Limit: 1}}, core.ErrInvalidSlotRequest},
		{"duplicate", []core.SlotRequest{{Name: "a", Key: "k", Limit: 1}, {Name: "a", Key: "k", Limit: 2}}, core.ErrDuplicateRequest},
		{"too large", make([]core.SlotRequest, core.MaxBatch+1), core.ErrBatchTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if rel, err := tab.Acquire(ctx, c.reqs, out); !errors.Is(err, c.want) || rel != nil {
				t.Fatalf("err %v, want %v", err, c.want)
			}
		})
	}
	if _, err := tab.Acquire(ctx, []core.SlotRequest{{Name: "a", Key: "k", Limit: 1}}, nil); !errors.Is(err, core.ErrShortOutput) {
		t.Fatalf("short output: %v", err)
	}
	// Bounded: two keys hold slots; a third is refused, an old one is not.
	r1, _ := tab.Acquire(ctx, []core.SlotRequest{{Name: "a", Key: "1", Limit: 5}}, out)
	r2, _ := tab.Acquire(ctx, []core.SlotRequest{{Name: "a", Key: "2", Limit: 5}}, out)
	if rel, err := tab.Acquire(ctx, []core.SlotRequest{{Name: "a", Key: "3", Limit: 5}}, out); !errors.Is(err, core.ErrStoreFull) || rel != nil || out[0].Allowed {
		t.Fatalf("third key: %v, want ErrStoreFull", err)
	}
	if rel, err := tab.Acquire(ctx, []core.SlotRequest{{Name: "a", Key: "1", Limit: 5}}, out); err != nil || rel == nil {
		t.Fatalf("a key already held: %v", err)
	} else {
		rel()
	}
	r1()
	r2()
	if tab.Len() != 0 {
		t.Fatalf("%d keys left", tab.Len())
	}
}

// TestSlotTableConcurrent: 64 goroutines on one key with a limit of 7 hold
// exactly 7 slots, and every slot comes back.
func TestSlotTableConcurrent(t *testing.T) {
	const goroutines, limit = 64, 7
	tab := core.NewSlotTable(0)
	var (
		wg       sync.WaitGroup
		admitted atomic.Int64
		mu       sync.Mutex
		rels     []func()
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out [1]core.SlotDecision
			rel, err := tab.Acquire(context.Background(), []core.SlotRequest{{Name: "c", Key: "k", Limit: limit}}, out[:])
			if err != nil {
				t.Error(err)
				return
			}
			if rel != nil {
				admitted.Add(1)
				mu.Lock()
				rels = append(rels, rel)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != limit || tab.InFlight("c", "k") != limit {
		t.Fatalf("admitted %d, in flight %d, want %d", admitted.Load(), tab.InFlight("c", "k"), limit)
	}
	for _, rel := range rels {
		wg.Add(2)
		go func() { defer wg.Done(); rel() }()
		go func() { defer wg.Done(); rel() }()
	}
	wg.Wait()
	if tab.Len() != 0 {
		t.Fatalf("%d keys left after every release (twice)", tab.Len())
	}
}

// A burst of keys in flight does not keep its memory once the slots are
// given back: the table's memory follows the requests in flight.
func TestSlotTableMemoryFollowsInFlight(t *testing.T) {
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := heap()
	tbl := core.NewSlotTable(0)
	var out [1]core.SlotDecision
	const burst = 200_000
	rels := make([]func(), 0, burst)
	for i := range burst {
		rel, err := tbl.Acquire(context.Background(), []core.SlotRequest{{Name: "in-flight", Key: "2001:db8:" + strconv.Itoa(i) + "::/64", Limit: 2}}, out[:])
		if err != nil || rel == nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	peak := heap()
	for i := 1; i < len(rels); i++ {
		rels[i]()
		rels[i] = nil // nor does the test keep what it gave back
	}
	after := heap()
	if tbl.Len() != 1 {
		t.Fatalf("Len %d with one request in flight", tbl.Len())
	}
	if after > base+(peak-base)/8 {
		t.Errorf("one request in flight after a burst of %d: the table keeps %d bytes (%d at the burst's peak)", burst, after-base, peak-base)
	}
	rels[0]()
	if tbl.Len() != 0 {
		t.Fatalf("Len %d with nothing in flight", tbl.Len())
	}
}
