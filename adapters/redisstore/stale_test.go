package redisstore

import (
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestStaleConvertedLogRefund: a refund (no ChargedAt) under a sliding log
// rule, 500ms behind a fixed window's record of the same Name whose window
// starts then, converts the record's units to one log entry at the
// record's time in both stores, and gives one back: the entry stays at
// that time, and leaves the window at the same time in both.
func TestStaleConvertedLogRefund(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	a := mustPolicy(t, core.Rule{Name: "conv", Algorithm: core.FixedWindow, Limit: 10, Window: 10 * time.Second})
	b := mustPolicy(t, core.Rule{Name: "conv", Algorithm: core.SlidingWindowLog, Limit: 20, Window: 10 * time.Second})
	t2 := time.Minute
	var got [][]core.Decision
	for _, s := range []core.Store{core.MustMemoryStore(nil), newStore(t, client, &Config{ClientTime: true})} {
		h := storetest.Harness{T: t, Store: s}
		if d, err := h.Take(a, "k", 10, t2); err != nil || !d.Allowed {
			t.Fatalf("10 at t2: %+v %v", d, err)
		}
		if err := h.Refund([]core.Request{{Policy: b, Key: "k", Cost: 1}}, t2-500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		var peeks []core.Decision
		for _, at := range []time.Duration{t2, t2 + b.Window() - 250*time.Millisecond, t2 + b.Window()} {
			out, err := h.Peek([]core.Request{{Policy: b, Key: "k", Cost: 1}}, at)
			if err != nil {
				t.Fatal(err)
			}
			peeks = append(peeks, out[0])
		}
		got = append(got, peeks)
	}
	for i := range got[0] {
		if got[0][i] != got[1][i] {
			t.Errorf("peek %d: memory %+v; redis %+v", i, got[0][i], got[1][i])
		}
	}
}
