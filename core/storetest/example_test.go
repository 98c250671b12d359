package storetest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
)

// A store's own test runs the whole suite with storetest.Run (see the
// package documentation). The traces can also be replayed on their own:
// here against a fresh MemoryStore each (a store author puts the store
// under test in its place), every step at storetest.T0 plus its At.
func ExampleTraces() {
	ctx := context.Background()
	for _, tr := range storetest.Traces() {
		store := core.MustMemoryStore(nil)
		p, err := core.NewPolicy(tr.Rule)
		if err != nil {
			fmt.Println(tr.Name, err)
			continue
		}
		ok := 0
		for _, s := range tr.Steps {
			var out [1]core.Decision
			err := store.Take(ctx, storetest.T0.Add(s.At), []core.Request{{Policy: p, Key: "k", Cost: s.Cost}}, out[:])
			d := out[0]
			got := storetest.Step{At: s.At, Cost: s.Cost, Allowed: d.Allowed, Remaining: d.Remaining,
				RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter, Delay: d.Delay, Err: s.Err}
			want := s
			if s.Err != nil {
				got.ResetAfter, want.ResetAfter = 0, 0 // not specified over capacity
			}
			if errors.Is(err, s.Err) && got == want {
				ok++
			}
		}
		fmt.Printf("%s: %d of %d steps as expected\n", tr.Name, ok, len(tr.Steps))
	}
	// Output:
	// TokenBucket: 8 of 8 steps as expected
	// TokenBucketBurst: 4 of 4 steps as expected
	// LeakyBucket: 5 of 5 steps as expected
	// LeakyBucketShaping: 5 of 5 steps as expected
	// FixedWindow: 7 of 7 steps as expected
	// SlidingWindowLog: 7 of 7 steps as expected
	// SlidingWindowCounter: 6 of 6 steps as expected
}
