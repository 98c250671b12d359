package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

func TestRuleValidation(t *testing.T) {
	ok := core.Rule{Name: "api", Limit: 10, Window: time.Second}
	tests := []struct {
		name  string
		rule  core.Rule
		field string // a word the error must contain; "" means valid
	}{
		{"valid", ok, ""},
		{"defaults", core.Rule{Limit: 1, Window: time.Nanosecond}, ""},
		{"zero limit", core.Rule{Limit: 0, Window: time.Second}, "Limit"},
		{"negative limit", core.Rule{Limit: -5, Window: time.Second}, "Limit"},
		{"limit too large", core.Rule{Limit: core.MaxLimit + 1, Window: time.Second}, "Limit"},
		{"zero window", core.Rule{Limit: 1}, "Window"},
		{"negative window", core.Rule{Limit: 1, Window: -time.Second}, "Window"},
		{"window too large", core.Rule{Limit: 1, Window: core.MaxWindow + 1}, "Window"},
		{"negative burst", core.Rule{Limit: 1, Window: time.Second, Burst: -1}, "Burst"},
		{"burst too large", core.Rule{Limit: 1, Window: time.Second, Burst: core.MaxLimit + 1}, "Burst"},
		{"burst on a window", core.Rule{Algorithm: core.FixedWindow, Limit: 1, Window: time.Second, Burst: 2}, "Burst"},
		{"refill overflow", core.Rule{Limit: 1, Window: core.MaxWindow, Burst: 2}, "refill"},
		{"negative delay", core.Rule{Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: -1}, "MaxDelay"},
		{"delay on token bucket", core.Rule{Limit: 1, Window: time.Second, MaxDelay: time.Second}, "MaxDelay"},
		{"delay on a window", core.Rule{Algorithm: core.SlidingWindowLog, Limit: 1, Window: time.Second, MaxDelay: time.Second}, "MaxDelay"},
		{"delay too large", core.Rule{Algorithm: core.LeakyBucket, Limit: 1, Window: time.Second, MaxDelay: core.MaxWindow + 1}, "MaxDelay"},
		{"counter limit too large", core.Rule{Algorithm: core.SlidingWindowCounter, Limit: 1 << 32, Window: time.Second}, "Limit"},
		{"name too long", core.Rule{Name: strings.Repeat("x", core.MaxNameLen+1), Limit: 1, Window: time.Second}, "Name"},
		{"name with quote", core.Rule{Name: `a"b`, Limit: 1, Window: time.Second}, "Name"},
		{"name with newline", core.Rule{Name: "a\nb", Limit: 1, Window: time.Second}, "Name"},
		{"nameless algorithm", core.Rule{Algorithm: nameless{}, Limit: 1, Window: time.Second}, "Algorithm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.rule.Validate()
			p, perr := core.NewPolicy(tt.rule)
			if (err == nil) != (perr == nil) {
				t.Fatalf("Validate = %v but NewPolicy = %v", err, perr)
			}
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if p.Name() == "" || p.Algorithm() == nil {
					t.Fatalf("defaults not filled: %v", p)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want one naming %s", tt.field)
			}
			if !errors.Is(err, core.ErrInvalidRule) {
				t.Errorf("error %v does not wrap ErrInvalidRule", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %s", err, tt.field)
			}
			if _, err := core.New(tt.rule); err == nil {
				t.Error("New accepted the invalid rule")
			}
		})
	}
}

type nameless struct{ core.Algorithm }

func (nameless) Name() string { return "" }

func TestPolicyDefaults(t *testing.T) {
	p := core.MustPolicy(core.PerMinute(60))
	if p.Name() != core.DefaultName || p.Algorithm() != core.TokenBucket || p.Capacity() != 60 || p.Limit() != 60 || p.Window() != time.Minute {
		t.Fatalf("PerMinute defaults: %v", p)
	}
	if c := core.MustPolicy(core.PerSecond(5).Using(core.LeakyBucket)).Capacity(); c != 1 {
		t.Errorf("leaky bucket default capacity = %d, want 1", c)
	}
	if c := core.MustPolicy(core.PerHour(5).WithBurst(9).Named("h")).Capacity(); c != 9 {
		t.Errorf("burst capacity = %d, want 9", c)
	}
	for _, tt := range []struct {
		r    core.Rule
		want string
	}{
		{core.PerSecond(1).Named("x"), "x: 1 per 1s (token_bucket, capacity 1)"},
		{core.PerMinute(100).Named("api"), "api: 100 per 1m0s (token_bucket, capacity 100)"}, // String's doc
		{core.PerHour(5).WithBurst(9).Named("h"), "h: 5 per 1h0m0s (token_bucket, capacity 9)"},
	} {
		if got := core.MustPolicy(tt.r).String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustPolicy did not panic on an invalid rule")
		}
	}()
	core.MustPolicy(core.Rule{})
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range core.Algorithms() {
		got, err := core.ParseAlgorithm(a.Name())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.Name(), got, err)
		}
	}
	if _, err := core.ParseAlgorithm("token-bucket"); !errors.Is(err, core.ErrUnknownAlgorithm) {
		t.Errorf("unknown name: err = %v", err)
	}
}

func TestClocks(t *testing.T) {
	c := core.SystemClock()
	a := c.Now()
	if d := time.Since(a); d < 0 || d > time.Minute {
		t.Fatalf("system clock reads %v, %v from time.Now", a, d)
	}
	b := c.Now()
	if b.Before(a) {
		t.Fatalf("system clock went backwards: %v then %v", a, b)
	}
	t0 := time.Unix(100, 0)
	f := core.NewFakeClock(t0)
	if !f.Now().Equal(t0) {
		t.Fatal("fake clock start")
	}
	if got := f.Advance(time.Second); !got.Equal(t0.Add(time.Second)) || !f.Now().Equal(got) {
		t.Fatal("fake clock Advance")
	}
	f.Set(t0.Add(-time.Hour))
	if !f.Now().Equal(t0.Add(-time.Hour)) {
		t.Fatal("fake clock Set backwards")
	}
}

func TestPolicyIdentity(t *testing.T) {
	base := core.Rule{Name: "id", Algorithm: core.TokenBucket, Limit: 10, Window: time.Minute}
	id := core.MustPolicy(base).Identity()
	if want := "token_bucket;l=10;w=60000000000;c=10"; id != want {
		t.Fatalf("Identity = %q, want %q", id, want)
	}
	differ := map[string]core.Rule{
		"algorithm": base.Using(core.FixedWindow),
		"limit":     func() core.Rule { r := base; r.Limit = 11; return r }(),
		"window":    func() core.Rule { r := base; r.Window = time.Hour; return r }(),
		"capacity":  base.WithBurst(20),
	}
	for what, r := range differ {
		if got := core.MustPolicy(r).Identity(); got == id {
			t.Errorf("another %s, same Identity %q", what, got)
		}
	}
	same := map[string]core.Rule{
		"name":           base.Named("other"),
		"explicit burst": base.WithBurst(10),
		"copy":           base,
	}
	for what, r := range same {
		if got := core.MustPolicy(r).Identity(); got != id {
			t.Errorf("%s: Identity %q, want %q", what, got, id)
		}
	}
	lb := core.Rule{Name: "lb", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Minute, Burst: 5}
	shaping := lb
	shaping.MaxDelay = time.Second
	if a, b := core.MustPolicy(lb).Identity(), core.MustPolicy(shaping).Identity(); a != b {
		t.Errorf("MaxDelay changed the Identity: %q vs %q", a, b)
	}
}

func TestTiersListsPolicies(t *testing.T) {
	res, err := core.Tiers(func(_ context.Context, key string) string { return key }, map[string]core.Rule{
		"pro":  core.PerMinute(600).Named("pro"),
		"free": core.PerMinute(60).Named("free"),
	})
	if err != nil {
		t.Fatal(err)
	}
	pl, ok := res.(core.PolicyLister)
	if !ok {
		t.Fatalf("the Tiers resolver %T does not implement PolicyLister", res)
	}
	ps := pl.Policies()
	if len(ps) != 2 || ps[0].Name() != "free" || ps[1].Name() != "pro" || ps[0].Limit() != 60 || ps[1].Limit() != 600 {
		t.Fatalf("Policies() = %v, want free then pro", ps)
	}
	// They are the very policies the resolver returns.
	for _, want := range ps {
		if p, _ := res.Resolve(context.Background(), want.Name()); p != want {
			t.Fatalf("tier %q resolves to %p, Policies lists %p", want.Name(), p, want)
		}
	}
}

// TestClampTime checks that ClampTime is the identity on [MinTime,
// MaxTime], to the nanosecond at both ends (the instants just after
// MinTime included, whose Unix seconds round down past MinTime's), and
// clamps what lies outside, however far.
func TestClampTime(t *testing.T) {
	for _, ns := range []int64{core.MinTime, core.MinTime + 1, core.MinTime + int64(400*time.Millisecond), core.MinTime + int64(time.Second), -1, 0, core.MaxTime - int64(time.Second), core.MaxTime - 1, core.MaxTime} {
		if got := core.ClampTime(time.Unix(0, ns)); got != ns {
			t.Errorf("ClampTime(%d) = %d, want it unchanged", ns, got)
		}
	}
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Unix(0, core.MinTime-1), core.MinTime},
		{time.Unix(0, core.MaxTime).Add(1), core.MaxTime},
		{time.Time{}, core.MinTime},
		{time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), core.MaxTime},
	} {
		if got := core.ClampTime(c.t); got != c.want {
			t.Errorf("ClampTime(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}
