package ratelimit_test

import (
	"testing"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// BenchmarkInFlight measures a per-IP rate layer with a per-IP concurrency
// layer beside it, against the rate layer alone (BenchmarkHandler).
func BenchmarkInFlight(b *testing.B) {
	layers := func() []ratelimit.Layer {
		return append(perIPLayer(), ratelimit.Layer{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 4})
	}
	b.Run("sequential", func(b *testing.B) { runSequential(b, benchHandler(b, layers())) })
	b.Run("parallel", func(b *testing.B) { runParallel(b, benchHandler(b, layers())) })
	b.Run("only/sequential", func(b *testing.B) {
		runSequential(b, benchHandler(b, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 4}}))
	})
}
