package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// A handler that shows the client its quota in the response body, read
// from the request context. HandlerWithResult stores the decision there;
// Handler does not (it saves two allocations per request).
func ExampleResultFromContext() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, ratelimit.WithClock(core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))))

	quota := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := ratelimit.ResultFromContext(r.Context())
		if !ok || len(res.Layers) == 0 {
			fmt.Fprintln(w, "no quota applies")
			return
		}
		d := res.Layers[0].Decision
		fmt.Fprintf(w, "%d of %d requests left this minute\n", d.Remaining, d.Limit)
	})
	h := l.HandlerWithResult(quota)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/quota", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Print(w.Code, " ", w.Body.String())
	}
	// Output:
	// 200 1 of 2 requests left this minute
	// 200 0 of 2 requests left this minute
	// 429 Too Many Requests
}
