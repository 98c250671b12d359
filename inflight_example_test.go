package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// A concurrency layer admits at most InFlight requests per key at once.
// AdmitFunc returns the function that gives the request's slot back; Handler
// calls it when the next handler returns.
func ExampleLayer_inFlight() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
	}, ratelimit.WithHeaders(ratelimit.XRateLimitHeaders|ratelimit.IETFHeaders)))

	r := httptest.NewRequest(http.MethodGet, "/slow", nil)
	var dones []func()
	for i := 1; i <= 3; i++ {
		rec := httptest.NewRecorder()
		ok, done := l.AdmitFunc(rec, r)
		dones = append(dones, done)
		fmt.Printf("request %d: admitted %v, remaining %s\n", i, ok, rec.Header().Get("X-RateLimit-Remaining"))
		if !ok {
			fmt.Println(rec.Code, "Retry-After:", rec.Header().Get("Retry-After"))
			fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
		}
	}
	dones[0]() // the first request ends

	rec := httptest.NewRecorder()
	ok, done := l.AdmitFunc(rec, r)
	defer done()
	fmt.Println("after one ended: admitted", ok)
	// Output:
	// request 1: admitted true, remaining 1
	// request 2: admitted true, remaining 0
	// request 3: admitted false, remaining 0
	// 429 Retry-After: 1
	// RateLimit-Policy: "in-flight";q=2;qu="concurrent-requests"
	// after one ended: admitted true
}

// A framework adapter calls AdmitFunc and defers done, so the request's
// slot comes back when it has been served, even if it panics.
func ExampleLimiter_AdmitFunc() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1},
	}))
	serve := func(w http.ResponseWriter, r *http.Request) { // what a framework adapter does
		ok, done := l.AdmitFunc(w, r)
		defer done()
		if ok {
			fmt.Fprintln(w, "served")
		}
	}
	for range 2 {
		rec := httptest.NewRecorder()
		serve(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code)
	}
	// Output:
	// 200
	// 200
}
