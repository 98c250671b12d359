package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// A retry that carries the same Idempotency-Key as an admitted request gets
// the same headers and is charged nothing.
func ExampleIdempotency() {
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}))
	idem, err := ratelimit.NewIdempotency(limiter, nil)
	if err != nil {
		panic(err)
	}
	h := idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, key := range []string{"k1", "k1", "k2", "k3"} {
		r := httptest.NewRequest("POST", "/charge", nil)
		r.RemoteAddr = "192.0.2.1:4321"
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(key, w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// k1 200 1
	// k1 200 1
	// k2 200 0
	// k3 429 0
}
