package ratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// exLogin answers 200 for the password "good", 401 otherwise.
var exLogin = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.FormValue("password") != "good" {
		http.Error(w, "wrong password", http.StatusUnauthorized)
		return
	}
	fmt.Fprintln(w, "welcome")
})

func exPost(h http.Handler, password string) *http.Response {
	r := httptest.NewRequest(http.MethodPost, "http://example.com/login?password="+password, nil)
	r.RemoteAddr = "192.0.2.1:1234"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Result()
}

// Count only failed logins: 3 per IP per 15 minutes. Successful logins are
// refunded after the handler ran. The headers were written before it ran:
// they describe the charge.
func ExampleWithRefund() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "login", Algorithm: core.FixedWindow, Limit: 3, Window: 15 * time.Minute},
	}}, ratelimit.WithClock(exampleClock()), ratelimit.WithRefund(ratelimit.RefundSuccessful)))
	h := l.Handler(exLogin)
	for _, pw := range []string{"good", "good", "bad", "good", "bad", "bad", "bad", "good"} {
		res := exPost(h, pw)
		fmt.Println(pw, res.StatusCode, "remaining", res.Header.Get(ratelimit.HeaderRateLimitRemaining))
	}
	// Output:
	// good 200 remaining 2
	// good 200 remaining 2
	// bad 401 remaining 2
	// good 200 remaining 1
	// bad 401 remaining 1
	// bad 401 remaining 0
	// bad 429 remaining 0
	// good 429 remaining 0
}

// RefundSuccessful counts only failed requests.
func ExampleRefundSuccessful() {
	fmt.Println(ratelimit.RefundSuccessful(nil, 200), ratelimit.RefundSuccessful(nil, 302), ratelimit.RefundSuccessful(nil, 401))
	// Output: true true false
}

// Count only successful calls: failures of the upstream do not use up
// the client's quota.
func ExampleRefundFailed() {
	calls := 0
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls%2 == 1 {
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(2).Named("calls"),
	}}, ratelimit.WithClock(exampleClock()), ratelimit.WithRefund(ratelimit.RefundFailed)))
	h := l.Handler(upstream)
	for range 6 {
		fmt.Print(exGet(h, "192.0.2.1:1234", "").StatusCode, " ")
	}
	fmt.Println()
	// Output: 502 200 502 200 429 429
}

// Peek tells what a request would get, for a quota page, without charging
// it or writing headers.
func ExampleLimiter_Peek() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(3).Named("per-ip"),
	}}, ratelimit.WithClock(exampleClock())))
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	for range 2 {
		res := l.Peek(r)
		fmt.Println("proceed:", res.Proceed, "remaining after it:", res.Layers[0].Decision.Remaining)
	}
	// Output:
	// proceed: true remaining after it: 2
	// proceed: true remaining after it: 2
}

// Reset a user's login quota after a successful login.
func ExampleLimiter_Reset() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.User(),
		Rule: core.PerHour(2).Named("login"),
	}}, ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	fmt.Println(exGet(h, "192.0.2.1:1", "alice").StatusCode, exGet(h, "192.0.2.1:1", "alice").StatusCode, exGet(h, "192.0.2.1:1", "alice").StatusCode)
	if err := l.Reset(context.Background(), "login", "alice"); err != nil {
		panic(err)
	}
	fmt.Println(exGet(h, "192.0.2.1:1", "alice").StatusCode)
	// Output:
	// 200 200 429
	// 200
}

// Refund gives back a charge made by Decide, for flows that decide on a
// refund themselves (here: the request turned out to be a cache hit).
func ExampleLimiter_Refund() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(3).Named("per-ip"),
	}}, ratelimit.WithClock(exampleClock())))
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	res := l.Decide(r)
	fmt.Println("charged, remaining", res.Layers[0].Decision.Remaining)
	if err := l.Refund(context.Background(), &res); err != nil {
		panic(err)
	}
	fmt.Println("refunded, a peek shows", l.Peek(r).Layers[0].Decision.Remaining, "left after one more")
	// Output:
	// charged, remaining 2
	// refunded, a peek shows 2 left after one more
}
