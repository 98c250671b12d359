package core_test

import (
	"errors"
	"fmt"

	"github.com/limitry/ratelimit/core"
)

// Rates read from configuration, in the "/" form and in ulule/limiter's
// "-" form. A mistake is an error, never a silently different limit.
func ExampleParseRate() {
	for _, s := range []string{"100/min", "5000/h", "10/s", "5/10m", "100/1h30m", "1000-H", "1000/day"} {
		r, err := core.ParseRate(s)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-9s %d per %v\n", s, r.Limit, r.Window)
	}
	for _, s := range []string{"0/s", "100/fortnight", "-1/min"} {
		_, err := core.ParseRate(s)
		fmt.Println(errors.Is(err, core.ErrInvalidRate), err)
	}
	// Output:
	// 100/min   100 per 1m0s
	// 5000/h    5000 per 1h0m0s
	// 10/s      10 per 1s
	// 5/10m     5 per 10m0s
	// 100/1h30m 100 per 1h30m0s
	// 1000-H    1000 per 1h0m0s
	// 1000/day  1000 per 24h0m0s
	// true ratelimit: invalid rate "0/s": count must be positive, got 0
	// true ratelimit: invalid rate "100/fortnight": unknown unit "fortnight", want ms, s, sec, second, m, min, minute, h, hr, hour, d or day, or a duration such as 10m
	// true ratelimit: invalid rate "-1/min": count "-1" is not a positive decimal integer
}

// A parsed rate is a Rule like any other: name it, pick its algorithm, and
// validate it into a Policy.
func ExampleParseRate_rule() {
	rule, err := core.ParseRate("1000-D")
	if err != nil {
		panic(err)
	}
	p, err := core.NewPolicy(rule.Named("daily").Using(core.SlidingWindowCounter))
	if err != nil {
		panic(err)
	}
	fmt.Println(p)
	// Output: daily: 1000 per 24h0m0s (sliding_window_counter, capacity 1000)
}

func ExamplePerDay() {
	fmt.Println(core.MustPolicy(core.PerDay(10000).Named("daily")))
	// Output: daily: 10000 per 24h0m0s (token_bucket, capacity 10000)
}

// MustParseRate suits rates written in the program, where a typo should stop
// it at start-up.
func ExampleMustParseRate() {
	var (
		search = core.MustParseRate("30/min").Named("search")
		export = core.MustParseRate("5/1h").Named("export").Using(core.FixedWindow)
	)
	fmt.Println(core.MustPolicy(search))
	fmt.Println(core.MustPolicy(export))
	// Output:
	// search: 30 per 1m0s (token_bucket, capacity 30)
	// export: 5 per 1h0m0s (fixed_window, capacity 5)
}
