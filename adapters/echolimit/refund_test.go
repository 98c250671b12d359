package echolimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/echolimit"
	"github.com/limitry/ratelimit/core"
)

// TestRefundByStatusRefused: echo's middleware cannot see the status, so a
// Limiter that refunds by it is refused at construction, not left without
// refunds.
func TestRefundByStatusRefused(t *testing.T) {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "login", Limit: 5, Window: time.Hour},
	}}, ratelimit.WithRefund(ratelimit.RefundSuccessful)))
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "WithRefund") {
			t.Fatalf("panic %v, want one naming WithRefund", p)
		}
	}()
	echolimit.Middleware(l)
}
