package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// fixedClock makes the examples' output independent of when they run; real
// programs leave the clock out.
func fixedClock() ratelimit.Option {
	return ratelimit.WithClock(core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
}

// show sends r through h and prints the status and the rate-limit headers.
func show(h http.Handler, r *http.Request) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	fmt.Printf("%d limit=%s remaining=%s retry-after=%q\n", rec.Code,
		rec.Header().Get(ratelimit.HeaderRateLimitLimit),
		rec.Header().Get(ratelimit.HeaderRateLimitRemaining),
		rec.Header().Get(ratelimit.HeaderRetryAfter))
}

// request returns a GET / from peer with the given header pairs.
func request(peer string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

// Two requests per minute per client IP, in one line. The client is the
// connecting peer: a forged X-Forwarded-For is ignored.
func ExampleLimitByIP() {
	mux := http.NewServeMux()
	mux.Handle("GET /", hello)
	h := ratelimit.LimitByIP(2, time.Minute, fixedClock())(mux)

	show(h, request("192.0.2.1:1234"))
	show(h, request("192.0.2.1:1234"))
	show(h, request("192.0.2.1:1234", "X-Forwarded-For", "203.0.113.77"))
	show(h, request("198.51.100.7:999"))
	// Output:
	// 200 limit=2 remaining=1 retry-after=""
	// 200 limit=2 remaining=0 retry-after=""
	// 429 limit=2 remaining=0 retry-after="30"
	// 200 limit=2 remaining=1 retry-after=""
}

// Behind a load balancer, name its network: X-Forwarded-For is believed
// from it and from nobody else.
func ExampleLimitByIP_trustedProxies() {
	h := ratelimit.LimitByIP(1, time.Minute, fixedClock(),
		ratelimit.TrustedProxyCIDRs("10.0.0.0/8"))(hello)

	show(h, request("10.0.0.7:4000", "X-Forwarded-For", "203.0.113.9"))      // client 203.0.113.9
	show(h, request("10.0.0.7:4000", "X-Forwarded-For", "203.0.113.9"))      // the same client
	show(h, request("10.0.0.7:4000", "X-Forwarded-For", "203.0.113.10"))     // another client
	show(h, request("198.51.100.4:5555", "X-Forwarded-For", "203.0.113.10")) // direct: keyed by its own address
	// Output:
	// 200 limit=1 remaining=0 retry-after=""
	// 429 limit=1 remaining=0 retry-after="60"
	// 200 limit=1 remaining=0 retry-after=""
	// 200 limit=1 remaining=0 retry-after=""
}

// A quota per API key, hashed before it becomes a store key. A request
// without the header is limited by its client IP, at the same rate: leaving
// the header out does not escape the limit.
func ExampleLimitByHeader() {
	h := ratelimit.LimitByHeader("X-API-Key", 1, time.Hour, fixedClock())(hello)

	show(h, request("192.0.2.1:1", "X-API-Key", "sk_live_alpha"))
	show(h, request("198.51.100.2:1", "X-API-Key", "sk_live_alpha")) // same key, other address
	show(h, request("198.51.100.2:1", "X-API-Key", "sk_live_beta"))
	show(h, request("203.0.113.5:1")) // no key: limited per IP
	show(h, request("203.0.113.5:1"))
	// Output:
	// 200 limit=1 remaining=0 retry-after=""
	// 429 limit=1 remaining=0 retry-after="3600"
	// 200 limit=1 remaining=0 retry-after=""
	// 200 limit=1 remaining=0 retry-after=""
	// 429 limit=1 remaining=0 retry-after="3600"
}

// A quota per authenticated user. The application's authentication runs
// first and stores the user with WithUser; anonymous requests are limited
// by their client IP.
func ExampleLimitByUser() {
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if user := r.Header.Get("X-Demo-User"); user != "" { // a real application checks a session or token
				r = r.WithContext(ratelimit.WithUser(r.Context(), user))
			}
			next.ServeHTTP(w, r)
		})
	}
	h := auth(ratelimit.LimitByUser(1, time.Minute, fixedClock(),
		ratelimit.WithHeaders(ratelimit.IETFHeaders))(hello))

	for _, r := range []*http.Request{
		request("192.0.2.1:1", "X-Demo-User", "alice"),
		request("198.51.100.2:1", "X-Demo-User", "alice"), // alice from elsewhere
		request("198.51.100.2:1"),                         // anonymous
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitPolicy))
	}
	// Output:
	// 200 "per-user";q=1;w=60
	// 429 "per-user";q=1;w=60
	// 200 "per-user";q=1;w=60
}

// Rates from configuration: core.ParseRate reports a bad rate as an error,
// and every Rule it returns is one the one-liners accept.
func ExampleLimitByIP_fromConfig() {
	rule, err := core.ParseRate("1000-H") // e.g. from an environment variable
	if err != nil {
		panic(err)
	}
	h := ratelimit.LimitByIP(rule.Limit, rule.Window, fixedClock())(hello)
	show(h, request("192.0.2.1:1"))

	_, err = core.ParseRate("1000/fortnight")
	fmt.Println(err)
	// Output:
	// 200 limit=1000 remaining=999 retry-after=""
	// ratelimit: invalid rate "1000/fortnight": unknown unit "fortnight", want ms, s, sec, second, m, min, minute, h, hr, hour, d or day, or a duration such as 10m
}

// Two one-liners sharing a store (a Redis store in a fleet) need distinct
// layer names, or they share their quotas.
func ExampleLayerName() {
	store, err := core.NewMemoryStore(nil) // the fleet would use a Redis store
	if err != nil {
		panic(err)
	}
	api := ratelimit.LimitByIP(100, time.Minute, ratelimit.WithStore(store), fixedClock())
	login := ratelimit.LimitByIP(1, time.Minute, ratelimit.WithStore(store), fixedClock(),
		ratelimit.LayerName("login"), ratelimit.WithHeaders(ratelimit.IETFHeaders))

	mux := http.NewServeMux()
	mux.Handle("POST /login", login(hello))
	mux.Handle("/", hello)
	h := api(mux)

	for range 2 {
		r := request("192.0.2.1:1")
		r.Method, r.URL.Path = http.MethodPost, "/login"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Printf("%d api: remaining=%s login: %s\n", rec.Code,
			rec.Header().Get(ratelimit.HeaderRateLimitRemaining), rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	show(h, request("192.0.2.1:1"))
	// Output:
	// 200 api: remaining=99 login: "login";r=0;t=60
	// 429 api: remaining=98 login: "login";r=0;t=60
	// 200 limit=100 remaining=97 retry-after=""
}
