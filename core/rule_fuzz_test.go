package core_test

import (
	"errors"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// FuzzRuleValidation feeds arbitrary rules to NewPolicy. Invariants: it never
// panics; it either returns a policy or an error wrapping ErrInvalidRule; and
// a policy it accepts decides without overflow at any cost in [1, capacity],
// at the extremes of time, with Remaining within [0, capacity] and no
// negative durations.
func FuzzRuleValidation(f *testing.F) {
	f.Add("api", uint8(0), int64(10), int64(time.Second), int64(0), int64(0))
	f.Add("", uint8(1), int64(core.MaxLimit), int64(core.MaxWindow), int64(core.MaxLimit), int64(core.MaxWindow))
	f.Add("x", uint8(4), int64(1<<32-1), int64(1), int64(0), int64(0))
	f.Add("y\"", uint8(2), int64(-1), int64(-1), int64(-1), int64(-1))
	f.Add("z", uint8(1), int64(1), int64(core.MaxWindow), int64(1), int64(core.MaxWindow))
	f.Add("w", uint8(3), int64(core.MaxLimit), int64(1), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, name string, alg uint8, limit, window, burst, delay int64) {
		algs := core.Algorithms()
		r := core.Rule{Name: name, Algorithm: algs[int(alg)%len(algs)], Limit: limit, Window: time.Duration(window), Burst: burst, MaxDelay: time.Duration(delay)}
		p, err := core.NewPolicy(r)
		if err != nil {
			if !errors.Is(err, core.ErrInvalidRule) {
				t.Fatalf("error %v does not wrap ErrInvalidRule", err)
			}
			return
		}
		c := p.Capacity()
		if c < 1 || c > core.MaxLimit {
			t.Fatalf("capacity %d", c)
		}
		for _, now := range []int64{0, int64(time.Now().UnixNano()), 1 << 61} {
			var s core.State
			for _, cost := range []int64{1, c, (c + 1) / 2} {
				var d core.Decision
				p.Algorithm().Decide(p, &s, cost, now, true, &d)
				if d.Remaining < 0 || d.Remaining > c || d.ResetAfter < 0 || d.RetryAfter < 0 || d.Delay < 0 {
					t.Fatalf("%v at %d cost %d: %+v", p, now, cost, d)
				}
				if exp := p.Algorithm().Expiry(p, &s); exp < 0 {
					t.Fatalf("%v: negative expiry %d", p, exp)
				}
			}
		}
	})
}
