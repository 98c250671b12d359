package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// A running Limiter takes new rules without forgetting usage: three
// requests under 5 per 10 minutes still count once the limit is 10.
func ExampleLimiter_SetRules() {
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.MustParseRate("5/10m").Named("per-ip"),
	}}))
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func() {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:4321"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, "limit", w.Header().Get("X-RateLimit-Limit"), "remaining", w.Header().Get("X-RateLimit-Remaining"))
	}
	for range 3 {
		get()
	}
	if err := limiter.SetRules(map[string]core.Rule{"per-ip": core.MustParseRate("10/10m")}); err != nil {
		panic(err)
	}
	get()
	// Output:
	// 200 limit 5 remaining 4
	// 200 limit 5 remaining 3
	// 200 limit 5 remaining 2
	// 200 limit 10 remaining 6
}
