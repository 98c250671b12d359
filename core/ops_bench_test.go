package core_test

import (
	"context"
	"testing"

	"github.com/limitry/ratelimit/core"
)

// BenchmarkMemoryOps measures a take, a peek and a take followed by its
// refund on one held key of the memory store.
func BenchmarkMemoryOps(b *testing.B) {
	m := core.MustMemoryStore(nil)
	p := core.MustPolicy(core.PerSecond(1 << 40))
	reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}}
	out := make([]core.Decision, 1)
	ctx := context.Background()
	m.Take(ctx, t0, reqs, out)
	b.Run("Take", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Take(ctx, t0, reqs, out)
		}
	})
	b.Run("Peek", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Peek(ctx, t0, reqs, out)
		}
	})
	b.Run("TakeRefund", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Take(ctx, t0, reqs, out)
			m.Refund(ctx, t0, reqs)
		}
	})
}
