package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// exampleClock makes the examples' output independent of the time they run.
var exampleClock = func() *core.FakeClock { return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) }

// exGet sends a GET / from remoteAddr through h and returns the response.
func exGet(h http.Handler, remoteAddr string, user string) *http.Response {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = remoteAddr
	if user != "" {
		r = r.WithContext(ratelimit.WithUser(r.Context(), user))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Result()
}

var exHello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

// A per-client-IP limit of 3 requests per minute in front of a handler.
func ExampleLimiter_Handler() {
	l, err := ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(), // r.RemoteAddr: no proxy trusted
		Rule: core.PerMinute(3).Named("per-ip"),
	}}, ratelimit.WithClock(exampleClock()), ratelimit.WithResetDelta())
	if err != nil {
		panic(err)
	}
	h := l.Handler(exHello)
	for range 4 {
		res := exGet(h, "192.0.2.1:1234", "")
		fmt.Printf("%d remaining=%s reset=%s retry-after=%q\n", res.StatusCode,
			res.Header.Get(ratelimit.HeaderRateLimitRemaining),
			res.Header.Get(ratelimit.HeaderRateLimitReset),
			res.Header.Get(ratelimit.HeaderRetryAfter))
	}
	// Another client has its own quota.
	fmt.Println(exGet(h, "198.51.100.7:999", "").StatusCode)
	// Output:
	// 200 remaining=2 reset=20 retry-after=""
	// 200 remaining=1 reset=40 retry-after=""
	// 200 remaining=0 reset=60 retry-after=""
	// 429 remaining=0 reset=60 retry-after="20"
	// 200
}

// Layered limits: per client IP, then per authenticated user, decided and
// charged atomically. A request refused by the per-user layer does not use
// up the per-IP quota, and anonymous requests meet only the per-IP layer.
func ExampleNew_layered() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(2).Named("per-user")},
	}, ratelimit.WithClock(exampleClock()), ratelimit.WithHeaders(ratelimit.IETFHeaders)))
	h := l.Handler(exHello)
	for _, user := range []string{"alice", "alice", "alice", ""} {
		res := exGet(h, "192.0.2.1:1234", user)
		fmt.Printf("%-6q %d %s\n", user, res.StatusCode, res.Header.Get(ratelimit.HeaderRateLimit))
	}
	// Output:
	// "alice" 200 "per-ip";r=9;t=6, "per-user";r=1;t=30
	// "alice" 200 "per-ip";r=8;t=12, "per-user";r=0;t=60
	// "alice" 429 "per-ip";r=8;t=12, "per-user";r=0;t=30
	// ""     200 "per-ip";r=7;t=18
}

// Dry-run decides, charges and reports every request but refuses none: the
// headers and an Observer show what enforcement would do.
func ExampleWithDryRun() {
	obs := &printObserver{}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("per-ip")},
	}, ratelimit.WithDryRun(), ratelimit.WithObserver(obs), ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	for range 3 {
		res := exGet(h, "192.0.2.1:1234", "")
		fmt.Println("status", res.StatusCode, "remaining", res.Header.Get(ratelimit.HeaderRateLimitRemaining))
	}
	// Output:
	// observed per-ip admitted=true dry-run=true
	// status 200 remaining 1
	// observed per-ip admitted=true dry-run=true
	// status 200 remaining 0
	// observed per-ip admitted=false dry-run=true
	// status 200 remaining 0
}

type printObserver struct{ core.NopObserver }

func (printObserver) ObserveDecision(e core.DecisionEvent) {
	fmt.Println("observed", e.Decision.Policy.Name(), "admitted="+fmt.Sprint(e.Admitted), "dry-run="+fmt.Sprint(e.DryRun))
}

// Problem details (RFC 9457) instead of a plain-text 429.
func ExampleWithProblemDetails() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip")},
	}, ratelimit.WithProblemDetails(), ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	exGet(h, "192.0.2.1:1234", "")
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	h.ServeHTTP(rec, r)
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	fmt.Print(rec.Body.String())
	// Output:
	// 429 application/problem+json
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Quota exceeded; retry after 60 seconds.","violated-policies":["per-ip"]}
}

// Health checks and internal networks bypass the limit.
func ExampleWithSkipCIDRs() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("per-ip")},
	},
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		ratelimit.WithSkipCIDRs("10.0.0.0/8"), // by peer address: a forged X-Forwarded-For cannot match
		ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	for _, peer := range []string{"10.1.2.3:1", "10.1.2.3:1", "192.0.2.1:1", "192.0.2.1:1"} {
		res := exGet(h, peer, "")
		fmt.Printf("%s %d limit=%q\n", peer, res.StatusCode, res.Header.Get(ratelimit.HeaderRateLimitLimit))
	}
	// Output:
	// 10.1.2.3:1 200 limit=""
	// 10.1.2.3:1 200 limit=""
	// 192.0.2.1:1 200 limit="1"
	// 192.0.2.1:1 429 limit="1"
}

// Behind a load balancer, allowlist by the client address that ClientIP
// finds through the trusted proxies, never by a header an untrusted peer
// sent.
func ExampleWithSkipCIDRsFrom() {
	clientIP := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: clientIP, Rule: core.PerMinute(100).Named("per-ip")},
	}, ratelimit.WithSkipCIDRsFrom(clientIP, "192.0.2.0/24")))
	for _, c := range []struct{ peer, xff string }{
		{"10.0.0.1:1", "192.0.2.9"},    // via the load balancer: allowlisted
		{"203.0.113.5:1", "192.0.2.9"}, // direct, forged header: not
		{"10.0.0.1:1", "203.0.113.5"},  // via the load balancer, outside: not
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.peer
		r.Header.Set("X-Forwarded-For", c.xff)
		fmt.Println(c.peer, c.xff, "skipped:", l.Decide(r).Skipped)
	}
	// Output:
	// 10.0.0.1:1 192.0.2.9 skipped: true
	// 203.0.113.5:1 192.0.2.9 skipped: false
	// 10.0.0.1:1 203.0.113.5 skipped: false
}

// Shaping: a LeakyBucket with MaxDelay delays bursts instead of refusing
// them, as nginx limit_req does. Handler waits out Result.Delay; Decide
// shows the delays without waiting.
func ExampleLimiter_Decide() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.Global("backend"),
		Rule: core.Rule{Name: "smooth", Algorithm: core.LeakyBucket, Limit: 4, Window: time.Second,
			MaxDelay: 600 * time.Millisecond},
	}}, ratelimit.WithClock(exampleClock())))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for range 5 {
		res := l.Decide(r)
		fmt.Printf("proceed=%v delay=%v retry-after=%v\n", res.Proceed, res.Delay, res.RetryAfter())
	}
	// Output:
	// proceed=true delay=0s retry-after=0s
	// proceed=true delay=250ms retry-after=0s
	// proceed=true delay=500ms retry-after=0s
	// proceed=false delay=0s retry-after=150ms
	// proceed=false delay=0s retry-after=150ms
}

// Middleware suits routers that take a func(http.Handler) http.Handler.
func ExampleMiddleware() {
	mw, err := ratelimit.Middleware([]ratelimit.Layer{
		{Key: ratelimit.Header("X-API-Key", ratelimit.HashKey()), Rule: core.PerHour(1000).Named("per-key")},
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(60).Named("per-ip")},
	}, ratelimit.WithHeaders(ratelimit.AllHeaders))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /", exHello)
	handler := mw(mux)
	res := exGet(handler, "192.0.2.1:1", "")
	fmt.Println(res.StatusCode, res.Header.Get(ratelimit.HeaderRateLimitPolicy))
	// Output:
	// 200 "per-ip";q=60;w=60
}
