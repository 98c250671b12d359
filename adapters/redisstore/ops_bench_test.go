package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// BenchmarkOps measures one peek, and one take followed by its refund,
// per algorithm, in server-time mode: one round trip each.
func BenchmarkOps(b *testing.B) {
	for _, a := range core.Algorithms() {
		s, _ := benchStore(b, nil)
		p := benchPolicy(b, a)
		if a == core.SlidingWindowLog {
			p = mustPolicy(b, core.Rule{Name: "bench-log", Algorithm: a, Limit: 1 << 40, Window: time.Millisecond})
		}
		reqs := []core.Request{{Policy: p, Key: "203.0.113.7", Cost: 1}}
		var out [1]core.Decision
		ctx := context.Background()
		if err := s.Take(ctx, time.Time{}, reqs, out[:]); err != nil {
			b.Fatal(err)
		}
		b.Run("Peek/"+a.Name(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Peek(ctx, time.Time{}, reqs, out[:]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("TakeRefund/"+a.Name(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Take(ctx, time.Time{}, reqs, out[:]); err != nil {
					b.Fatal(err)
				}
				if err := s.Refund(ctx, time.Time{}, reqs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
