package promlimit_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/promlimit"
	"github.com/limitry/ratelimit/core"
)

var _ ratelimit.RulesObserver = (*promlimit.Metrics)(nil)

func TestRuleGaugesFollowSetRules(t *testing.T) {
	m := promlimit.Must(promlimit.New(prometheus.NewRegistry()))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Minute},
	}}, ratelimit.WithObserver(m)))
	want := func(alg string, limit, window int) string {
		return fmt.Sprintf(`# HELP ratelimit_rule_limit Units each rule admits per window, as last set by ratelimit.New or Limiter.SetRules.
# TYPE ratelimit_rule_limit gauge
ratelimit_rule_limit{algorithm="%[1]s",rule="per-ip"} %[2]d
# HELP ratelimit_rule_window_seconds Window of each rule, as last set by ratelimit.New or Limiter.SetRules.
# TYPE ratelimit_rule_window_seconds gauge
ratelimit_rule_window_seconds{algorithm="%[1]s",rule="per-ip"} %[3]d
`, alg, limit, window)
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(want("token_bucket", 5, 600)), "ratelimit_rule_limit", "ratelimit_rule_window_seconds"); err != nil {
		t.Fatalf("after New: %v", err)
	}
	if err := l.SetRules(map[string]core.Rule{"per-ip": {Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	// The old algorithm's series is gone: one series per rule.
	if err := testutil.CollectAndCompare(m, strings.NewReader(want("fixed_window", 10, 60)), "ratelimit_rule_limit", "ratelimit_rule_window_seconds"); err != nil {
		t.Fatalf("after SetRules: %v", err)
	}
}
