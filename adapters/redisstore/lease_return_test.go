package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// TestLeaseReturnsLeftovers: units left in a lease when it ends go back to
// a backend that can refund, so they are not lost to the quota.
func TestLeaseReturnsLeftovers(t *testing.T) {
	backend := core.MustMemoryStore(nil)
	ls, err := NewLeaseStore(backend, &LeaseConfig{Size: 10, MaxAge: time.Second, HotThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := core.MustPolicy(core.Rule{Name: "api", Limit: 20, Window: time.Minute})
	t0 := time.Unix(1_800_000_000, 0)
	take := func(at time.Time) core.Decision {
		var out [1]core.Decision
		if err := ls.Take(context.Background(), at, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for i := range 3 {
		if d := take(t0.Add(time.Duration(i) * time.Millisecond)); !d.Allowed {
			t.Fatalf("request %d refused", i)
		}
	}
	// The lease of 10 ends with 7 units left; the next decision returns
	// them, then leases 10 again.
	after := t0.Add(time.Second + time.Millisecond)
	take(after)
	if st := ls.Stats(); st.ReturnedUnits != 7 || st.ExpiredUnits != 0 {
		t.Fatalf("stats %+v, want 7 units returned and none lost", st)
	}
	var out [1]core.Decision
	if err := backend.Peek(context.Background(), after, []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	// 20 - 10 (first lease) + 7 (returned) - 10 (second lease), with the
	// third of a unit the bucket refilled in a second rounded down, is 7;
	// a peek reports Remaining after its own cost of 1.
	if out[0].Remaining != 6 {
		t.Fatalf("backend remaining %d, want 6 (without the return the peek would be refused)", out[0].Remaining)
	}
}
