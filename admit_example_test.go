package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// Admit is Handler without the call to the next handler: the caller serves
// the request when it returns true. When it returns false the response (the
// 429 here) is already written. This is how a framework adapter, or a
// handler that limits only some of its work, uses a Limiter.
func ExampleLimiter_Admit() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(1).Named("per-ip"),
	}}, fixedClock()))

	search := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("q") == "" {
			http.Error(w, "missing q", http.StatusBadRequest) // free: not limited
			return
		}
		if !l.Admit(w, r) {
			return // refused: the 429 and Retry-After are written
		}
		fmt.Fprintln(w, "results for", r.URL.Query().Get("q"))
	}

	for _, target := range []string{"/search", "/search?q=go", "/search?q=go"} {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.RemoteAddr = "192.0.2.1:1234"
		rec := httptest.NewRecorder()
		search(rec, r)
		fmt.Printf("%s: %d retry-after=%q %s", target, rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter), rec.Body.String())
	}
	// Output:
	// /search: 400 retry-after="" missing q
	// /search?q=go: 200 retry-after="" results for go
	// /search?q=go: 429 retry-after="60" Too Many Requests
}

// The error handler sees every error: here a key error (a trusted proxy sent
// a garbage X-Forwarded-For) answered with its own JSON, and a store failure
// it only reports, so the default applies (fail-open: the request is served
// without rate-limit headers).
func ExampleWithErrorHandler() {
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		switch {
		case errors.Is(err, ratelimit.ErrStoreFailure):
			fmt.Println("error handler: store failure") // e.g. count it and alert
		case errors.Is(err, ratelimit.ErrInvalidClientIP):
			fmt.Println("error handler: invalid client IP")

			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintln(w, `{"error":"bad forwarding chain"}`)
		}
		// Unless it writes a response, the default action follows.
	}
	key := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))

	working := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: key, Rule: core.PerMinute(10).Named("per-ip")}},
		ratelimit.WithErrorHandler(onError), fixedClock())).Handler(hello)
	broken := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: key, Rule: core.PerMinute(10).Named("per-ip")}},
		ratelimit.WithErrorHandler(onError), ratelimit.WithStore(downStore{}), fixedClock())).Handler(hello)

	for _, c := range []struct {
		h   http.Handler
		xff string
	}{{working, "203.0.113.9, not-an-ip"}, {broken, "203.0.113.9"}} {
		rec := httptest.NewRecorder()
		c.h.ServeHTTP(rec, request("10.0.0.7:4000", "X-Forwarded-For", c.xff))
		fmt.Printf("%d %s", rec.Code, rec.Body.String())
	}
	// Output:
	// error handler: invalid client IP
	// 400 {"error":"bad forwarding chain"}
	// error handler: store failure
	// 200 hello
}

// downStore is a Store whose backend is unreachable.
type downStore struct{}

func (downStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return errors.New("store is down")
}

// The denied handler writes the refusal: here JSON naming the refusing layers
// and the wait. Retry-After and the rate-limit headers are already set.
func ExampleWithDeniedHandler() {
	denied := func(w http.ResponseWriter, r *http.Request, res *ratelimit.Result) {
		var refused []string
		for _, ly := range res.Layers {
			if ly.Refused {
				refused = append(refused, ly.Decision.Policy.Name())
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":"slow down","limits":"%s","retry_after_seconds":%d}`+"\n",
			strings.Join(refused, ","), int(res.RetryAfter().Seconds()))
	}
	h := ratelimit.LimitByIP(1, 30*time.Second, ratelimit.WithDeniedHandler(denied), fixedClock())(hello)

	for range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request("192.0.2.1:1234"))
		fmt.Printf("%d retry-after=%q %s", rec.Code, rec.Header().Get(ratelimit.HeaderRetryAfter), rec.Body.String())
	}
	// Output:
	// 200 retry-after="" hello
	// 429 retry-after="30" {"error":"slow down","limits":"per-ip","retry_after_seconds":30}
}
