package ratelimit_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// slowFails is a handler that answers 200, or, for a request with a Slow
// header, runs during and fails with 502 (a status RefundFailed refunds).
func slowFails(during func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Slow") == "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		during()
		w.WriteHeader(http.StatusBadGateway)
	})
}

// TestRefundAfterEvictionKeepsCharge: a key evicted from a full memory
// store while its handler runs, and charged anew meanwhile, keeps the
// refunded request's charge, as after a Reset: its record holds only the
// later charges, none of which a refund may give back.
func TestRefundAfterEvictionKeepsCharge(t *testing.T) {
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 16, Shards: 1})
	var h http.Handler
	client := "192.0.2.1:1"
	var during []int
	next := slowFails(func() {
		// While this failed call runs: a flood of other clients evicts
		// the caller's key, and the caller makes two more calls.
		for i := 0; i < 64; i++ {
			serve(h, mwReq(fmt.Sprintf("198.51.100.%d:1", i)))
		}
		for i := 0; i < 2; i++ {
			during = append(during, serve(h, mwReq(client)).Code)
		}
	})
	_, h, _ = refundEnv(t, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "calls", Algorithm: core.FixedWindow, Limit: 2, Window: time.Hour},
	}}, next, ratelimit.WithRefund(ratelimit.RefundFailed), ratelimit.WithStore(store))
	if rec := serve(h, mwReq(client, "Slow", "1")); rec.Code != http.StatusBadGateway {
		t.Fatalf("slow call: %d", rec.Code)
	}
	if store.Evictions() == 0 {
		t.Fatalf("the flood evicted nothing")
	}
	t.Logf("calls during the slow one: %v, evictions %d", during, store.Evictions())
	// The two calls made while the slow one ran hold the whole (fresh)
	// quota of 2: the slow call's refund must give neither back.
	if rec := serve(h, mwReq(client)); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("third call after the refund: %d, want 429 (the refund gave back a charge made while the handler ran)", rec.Code)
	}
}

// TestRefundBucketEvictedKeepsCharge: as TestRefundAfterEvictionKeepsCharge,
// with a token bucket and a single eviction, before the refund's ChargedAt
// (the bucket's ChargeStart, later than the charge): the refund keeps the
// charge made on the key's fresh record while the handler ran.
func TestRefundBucketEvictedKeepsCharge(t *testing.T) {
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 2, Shards: 1})
	var h http.Handler
	var clk *core.FakeClock
	client := "192.0.2.1:1"
	var during []int
	next := slowFails(func() {
		clk.Advance(500 * time.Millisecond)
		// Two other clients evict the caller's key (one eviction).
		serve(h, mwReq("198.51.100.1:1"))
		serve(h, mwReq("198.51.100.2:1"))
		clk.Advance(500 * time.Millisecond)
		during = append(during, serve(h, mwReq(client)).Code) // a fresh record, one charge
	})
	_, h, clk = refundEnv(t, []ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "calls", Algorithm: core.TokenBucket, Limit: 4, Window: 4 * time.Second},
	}}, next, ratelimit.WithRefund(ratelimit.RefundFailed), ratelimit.WithStore(store))
	serve(h, mwReq(client))
	serve(h, mwReq(client))
	if rec := serve(h, mwReq(client, "Slow", "1")); rec.Code != http.StatusBadGateway {
		t.Fatalf("slow call: %d", rec.Code)
	}
	if store.Evictions() == 0 || len(during) != 1 || during[0] != 200 {
		t.Fatalf("evictions %d, calls during %v", store.Evictions(), during)
	}
	// The caller's fresh record holds the one charge made during the slow
	// call: 3 more calls fit, not 4.
	n := 0
	for serve(h, mwReq(client)).Code == http.StatusOK {
		n++
	}
	if n != 3 {
		t.Fatalf("%d calls admitted after the refund, want 3 (the refund gave back the charge made after the eviction)", n)
	}
}
