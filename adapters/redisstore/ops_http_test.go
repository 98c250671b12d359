package redisstore_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestRefundFailedLoginsSharedRedis: two middleware instances sharing one
// Redis count only failed logins, 5 per IP per 15 minutes (a sliding log,
// which refunds a charge by its exact time): successful logins on either
// instance never count, the 6th failure is refused on both, and a Reset on
// one instance lets the IP in again on the other. On the server's clock
// too, where the refunds name their charges by the server's time
// (core.Decision.At).
func TestRefundFailedLoginsSharedRedis(t *testing.T) {
	addr := redistest.Server(t)
	for _, clientTime := range []bool{true, false} {
		t.Run(map[bool]string{true: "ClientTime", false: "server clock"}[clientTime], func(t *testing.T) {
			refundFailedLogins(t, addr, clientTime)
		})
	}
}

func refundFailedLogins(t *testing.T, addr string, clientTime bool) {
	prefix := "rltest:refund:" + time.Now().Format("150405.000000000") + ":"
	clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Password") != "good" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	var limiters [2]*ratelimit.Limiter
	var handlers [2]http.Handler
	for i := range limiters {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		store, err := redisstore.New(client, &redisstore.Config{Prefix: prefix, ClientTime: clientTime, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		l, err := ratelimit.New([]ratelimit.Layer{{
			Key:  ratelimit.MustClientIP(),
			Rule: core.Rule{Name: "login", Algorithm: core.SlidingWindowLog, Limit: 5, Window: 15 * time.Minute},
		}}, ratelimit.WithStore(store), ratelimit.WithClock(clock), ratelimit.WithLogger(nil), ratelimit.WithRefund(ratelimit.RefundSuccessful))
		if err != nil {
			t.Fatal(err)
		}
		limiters[i], handlers[i] = l, l.Handler(login)
	}
	do := func(i int, password string) int {
		r := httptest.NewRequest(http.MethodPost, "http://example.com/login", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set("Password", password)
		rec := httptest.NewRecorder()
		handlers[i%2].ServeHTTP(rec, r)
		return rec.Code
	}
	step := 0
	for failed := 0; failed < 5; failed++ {
		for j := 0; j < 4; j++ {
			clock.Advance(time.Second)
			if code := do(step, "good"); code != 200 {
				t.Fatalf("successful login after %d failures: %d", failed, code)
			}
			step++
		}
		clock.Advance(time.Second)
		if code := do(step, "bad"); code != http.StatusUnauthorized {
			t.Fatalf("failed login %d: %d", failed+1, code)
		}
		step++
	}
	for i := 0; i < 2; i++ {
		if code := do(i, "bad"); code != http.StatusTooManyRequests {
			t.Fatalf("6th failed login on instance %d: %d, want 429", i, code)
		}
		if code := do(i, "good"); code != http.StatusTooManyRequests {
			t.Fatalf("a login once refused, on instance %d: %d, want 429", i, code)
		}
	}
	if err := limiters[0].Reset(context.Background(), "login", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if code := do(1, "good"); code != 200 {
		t.Fatalf("after a Reset on the other instance: %d, want 200", code)
	}
}
