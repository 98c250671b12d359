package chilimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
	"github.com/limitry/ratelimit/core"
)

// TestRefundThroughChi counts only failed logins through the adapter: with
// ratelimit.WithRefund(ratelimit.RefundSuccessful), successful logins are
// refunded, failed ones count, the sixth failure is refused.
func TestRefundThroughChi(t *testing.T) {
	for _, withResult := range []bool{false, true} {
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "login", Limit: 5, Window: time.Hour},
		}}, ratelimit.WithRefund(ratelimit.RefundSuccessful)))
		var opts []chilimit.Option
		if withResult {
			opts = append(opts, chilimit.WithResult())
		}
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l, opts...))
		r.Post("/login", func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Password") != "right" {
				w.WriteHeader(http.StatusUnauthorized)
			}
		})
		login := func(password string) int {
			req := httptest.NewRequest("POST", "/login", nil)
			req.RemoteAddr = "192.0.2.1:1"
			req.Header.Set("X-Password", password)
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			return w.Code
		}
		for range 20 {
			if c := login("right"); c != 200 {
				t.Fatalf("result %v: a successful login: %d, want 200 (successes are refunded)", withResult, c)
			}
		}
		for i := range 5 {
			if c := login("wrong"); c != http.StatusUnauthorized {
				t.Fatalf("result %v: failed login %d: %d, want 401", withResult, i+1, c)
			}
		}
		if c := login("wrong"); c != http.StatusTooManyRequests {
			t.Fatalf("result %v: sixth failed login: %d, want 429", withResult, c)
		}
	}
}
