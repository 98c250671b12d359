package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// featClock returns a fake clock at a fixed instant, so that the examples
// print the same numbers on every run.
func featClock() *core.FakeClock {
	return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// featServe sends r through h and returns the recorded response.
// (httptest.NewRequest gives every request the peer 192.0.2.1:1234.)
func featServe(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// featOK answers 200 with an empty body.
var featOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})

// Requests weigh what they cost the server: a search 5 units, anything else
// 1, out of 10 per minute per client IP. A request refused for its weight
// charges nothing, so lighter requests still fit.
func ExampleWithCost() {
	weight := func(r *http.Request) int64 {
		if r.URL.Path == "/search" {
			return 5
		}
		return 1
	}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(10).Named("per-ip"),
	}}, ratelimit.WithCost(weight), ratelimit.WithClock(featClock())))
	h := l.Handler(featOK)
	for _, path := range []string{"/search", "/item", "/search", "/item"} {
		rec := featServe(h, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code, "remaining", rec.Header().Get(ratelimit.HeaderRateLimitRemaining))
	}
	// Output:
	// /search 200 remaining 5
	// /item 200 remaining 4
	// /search 429 remaining 4
	// /item 200 remaining 3
}

// A layer with a Cost of its own: uploads are charged by the kilobyte
// against 1000 KB per minute, while the per-IP layer beside it charges
// every request 1 (the Limiter's cost). The IETF RateLimit field shows both.
func ExampleLayer_cost() {
	kilobytes := func(r *http.Request) int64 { return max(1, (r.ContentLength+1023)/1024) }
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(100).Named("per-ip")},
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1000).Named("upload-kb"), Cost: kilobytes},
	}, ratelimit.WithHeaders(ratelimit.IETFHeaders), ratelimit.WithClock(featClock())))
	h := l.Handler(featOK)
	for _, kb := range []int{600, 500, 300} {
		body := strings.NewReader(strings.Repeat("x", kb*1024))
		rec := featServe(h, httptest.NewRequest(http.MethodPost, "/upload", body))
		fmt.Println(kb, "KB:", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	// Output:
	// 600 KB: 200 "per-ip";r=99;t=1, "upload-kb";r=400;t=36
	// 500 KB: 429 "per-ip";r=99;t=1, "upload-kb";r=400;t=6
	// 300 KB: 200 "per-ip";r=98;t=2, "upload-kb";r=100;t=54
}

// featDownStore is a core.Store whose backend is unreachable: every Take
// fails.
type featDownStore struct{}

func (featDownStore) Take(context.Context, time.Time, []core.Request, []core.Decision) error {
	return errors.New("connection refused")
}

// When the store fails, the default (fail-open) serves the request without
// rate-limit headers; WithFailClosed refuses it with 503 instead.
func ExampleWithFailClosed() {
	layers := []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")}}
	open := ratelimit.Must(ratelimit.New(layers, ratelimit.WithStore(featDownStore{}),
		ratelimit.WithLogger(nil))) // no one-time "served fail-open" warning in this example
	closed := ratelimit.Must(ratelimit.New(layers, ratelimit.WithStore(featDownStore{}), ratelimit.WithFailClosed()))

	rec := featServe(open.Handler(featOK), httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Printf("fail-open:   %d limit=%q\n", rec.Code, rec.Header().Get(ratelimit.HeaderRateLimitLimit))
	rec = featServe(closed.Handler(featOK), httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Printf("fail-closed: %d %s", rec.Code, rec.Body.String())
	// Output:
	// fail-open:   200 limit=""
	// fail-closed: 503 Service Unavailable: rate limiter unavailable
}

// The pk parameter tells a client which quota partition it is charged to,
// without revealing the key: here a hash of each client's address.
func ExampleWithPartitionKey() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(10).Named("per-ip"),
	}}, ratelimit.WithHeaders(ratelimit.IETFHeaders), ratelimit.WithPartitionKey(), ratelimit.WithClock(featClock())))
	h := l.Handler(featOK)
	for _, peer := range []string{"192.0.2.1:1234", "198.51.100.7:999"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = peer
		rec := featServe(h, r)
		fmt.Println(rec.Header().Get(ratelimit.HeaderRateLimitPolicy))
		fmt.Println(rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	// Output:
	// "per-ip";q=10;w=60;pk=:N/z/JL9iA1srCAIK:
	// "per-ip";r=9;t=6;pk=:N/z/JL9iA1srCAIK:
	// "per-ip";q=10;w=60;pk=:4YMiC2mcEKg8p740:
	// "per-ip";r=9;t=6;pk=:4YMiC2mcEKg8p740:
}

// featDelayed signals on a channel each decision that delays its request.
type featDelayed struct {
	core.NopObserver
	ch chan struct{}
}

func (o featDelayed) ObserveDecision(e core.DecisionEvent) {
	if e.Decision.Delay > 0 {
		o.ch <- struct{}{}
	}
}

// A shaping leaky bucket (one request per 10 s, delaying up to a minute)
// with room for one waiting request. The first request is served at once,
// the second waits for its slot, and a third, finding the room full, is
// refused before it is charged, told to retry once the waiting request
// has been served. (The second request's client then gives up.)
func ExampleWithMaxWaiting() {
	delayed := featDelayed{ch: make(chan struct{}, 1)}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key: ratelimit.Global("backend"),
		Rule: core.Rule{Name: "smooth", Algorithm: core.LeakyBucket, Limit: 1, Window: 10 * time.Second,
			MaxDelay: time.Minute},
	}}, ratelimit.WithMaxWaiting(1), ratelimit.WithObserver(delayed), ratelimit.WithClock(featClock())))
	h := l.Handler(featOK)

	fmt.Println("first:", featServe(h, httptest.NewRequest(http.MethodGet, "/", nil)).Code)

	ctx, giveUp := context.WithCancel(context.Background())
	second := make(chan int)
	go func() {
		second <- featServe(h, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)).Code
	}()
	<-delayed.ch // the second request holds the only waiting slot

	rec := featServe(h, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println("third:", rec.Code, "Retry-After", rec.Header().Get(ratelimit.HeaderRetryAfter))
	giveUp()
	fmt.Println("second:", <-second)
	fmt.Println("next delay:", l.Peek(httptest.NewRequest(http.MethodGet, "/", nil)).Delay)
	// Output:
	// first: 200
	// third: 429 Retry-After 60
	// second: 503
	// next delay: 20s
}

// featKey prints the key keyFn gives a request from peer with the
// X-Forwarded-For header xff (none when empty), or its error.
func featKey(keyFn ratelimit.KeyFunc, peer, xff string) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = peer
	if xff != "" {
		r.Header.Set("X-Forwarded-For", xff)
	}
	header := fmt.Sprintf("X-Forwarded-For %q", xff)
	if xff == "" {
		header = "no X-Forwarded-For"
	}
	key, err := keyFn(r)
	if err != nil {
		fmt.Printf("from %s, %s: %v\n", peer, header, err)
		return
	}
	fmt.Printf("from %s, %s: key %s\n", peer, header, key)
}

// Exactly one proxy (whose addresses are unknown) stands in front of the
// server and appends the address it sees: the client is the rightmost
// X-Forwarded-For entry, whatever the client wrote to its left. A request
// without the header, which the proxy always sets, is a key error.
func ExampleTrustedHops() {
	key := ratelimit.MustClientIP(ratelimit.TrustedHops(1))
	featKey(key, "10.0.0.7:4000", "203.0.113.9")
	featKey(key, "10.0.0.7:4000", "6.6.6.6, 203.0.113.9") // 6.6.6.6 is forged
	featKey(key, "10.0.0.7:4000", "")
	// Output:
	// from 10.0.0.7:4000, X-Forwarded-For "203.0.113.9": key 203.0.113.9
	// from 10.0.0.7:4000, X-Forwarded-For "6.6.6.6, 203.0.113.9": key 203.0.113.9
	// from 10.0.0.7:4000, no X-Forwarded-For: ratelimit: cannot determine client IP: forwarded header has fewer entries than trusted hops
}

// The load balancers live in 10.0.0.0/8 and fd00::/8: X-Forwarded-For is
// read only from them, walked right to left past every trusted entry. A
// peer outside them is the client, whatever it sends.
func ExampleTrustedProxies() {
	key := ratelimit.MustClientIP(ratelimit.TrustedProxies(
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8"),
	))
	featKey(key, "10.0.0.7:4000", "203.0.113.9")
	featKey(key, "10.0.0.7:4000", "6.6.6.6, 203.0.113.9, 10.1.2.3") // two proxies
	featKey(key, "[fd00::1]:443", "203.0.113.9")
	featKey(key, "198.51.100.4:5555", "6.6.6.6") // direct: the header is ignored
	// Output:
	// from 10.0.0.7:4000, X-Forwarded-For "203.0.113.9": key 203.0.113.9
	// from 10.0.0.7:4000, X-Forwarded-For "6.6.6.6, 203.0.113.9, 10.1.2.3": key 203.0.113.9
	// from [fd00::1]:443, X-Forwarded-For "203.0.113.9": key 203.0.113.9
	// from 198.51.100.4:5555, X-Forwarded-For "6.6.6.6": key 198.51.100.4
}

// Trusting every address lets every client choose its key, so ClientIP
// refuses it unless AllowTrustAll says the server can only be reached
// through proxies that overwrite the header.
func ExampleAllowTrustAll() {
	_, err := ratelimit.ClientIP(ratelimit.TrustedProxyCIDRs("0.0.0.0/0"))
	fmt.Println(err)

	key := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("0.0.0.0/0"), ratelimit.AllowTrustAll())
	featKey(key, "10.0.0.7:4000", "203.0.113.9")
	// Output:
	// ratelimit: invalid key function configuration: the trusted proxies cover every IPv4 address, so any client could choose its key with a forged header; list your proxies' networks, or add AllowTrustAll if no client can reach the server directly
	// from 10.0.0.7:4000, X-Forwarded-For "203.0.113.9": key 203.0.113.9
}

// RawPath keys by the method's class and the path, without the query.
// HEAD counts as GET, and unknown or lower-case methods share one class.
func ExampleRawPath() {
	key := ratelimit.RawPath()
	for _, c := range []struct{ method, target string }{
		{"GET", "/users/42?fields=name"},
		{"HEAD", "/users/42"},
		{"POST", "/users"},
		{"post", "/users"},
		{"PURGE", "/users"},
	} {
		k, err := key(httptest.NewRequest(c.method, c.target, nil))
		fmt.Printf("%-5s %-22s %q %v\n", c.method, c.target, k, err)
	}
	// Output:
	// GET   /users/42?fields=name  "GET /users/42" <nil>
	// HEAD  /users/42              "GET /users/42" <nil>
	// POST  /users                 "POST /users" <nil>
	// post  /users                 "OTHER /users" <nil>
	// PURGE /users                 "OTHER /users" <nil>
}

// Idempotency keys remembered in memory for an hour, on the Limiter's fake
// clock: a retry with the same Idempotency-Key is charged once, until the
// key expires.
func ExampleNewMemoryReplayStore() {
	clock := featClock()
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Algorithm: core.FixedWindow, Limit: 5, Window: 24 * time.Hour},
	}}, ratelimit.WithClock(clock)))
	replays := ratelimit.NewMemoryReplayStore(10_000, clock)
	idem, err := ratelimit.NewIdempotency(l, &ratelimit.IdempotencyConfig{Store: replays, TTL: time.Hour})
	if err != nil {
		panic(err)
	}
	h := idem.Handler(featOK)
	for _, step := range []string{"pay-1", "pay-1", "wait", "pay-1"} {
		if step == "wait" {
			clock.Advance(2 * time.Hour)
			fmt.Println("two hours later")
			continue
		}
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.Header.Set("Idempotency-Key", step)
		rec := featServe(h, r)
		fmt.Println(step, rec.Code, "remaining", rec.Header().Get(ratelimit.HeaderRateLimitRemaining), "keys", replays.Len())
	}
	// Output:
	// pay-1 200 remaining 4 keys 1
	// pay-1 200 remaining 4 keys 1
	// two hours later
	// pay-1 200 remaining 3 keys 1
}

// TargetHost, the Transport's default key, writes one host in one form, so
// that its spellings share one quota.
func ExampleTargetHost() {
	for _, u := range []string{
		"https://API.example.com/v1",
		"https://api.example.com.:443/v2",
		"http://api.example.com:8080/",
		"http://[::ffff:192.0.2.1]:80/",
	} {
		fmt.Println(ratelimit.TargetHost(httptest.NewRequest(http.MethodGet, u, nil)))
	}
	// Output:
	// api.example.com <nil>
	// api.example.com <nil>
	// api.example.com:8080 <nil>
	// 192.0.2.1 <nil>
}

// An outbound Transport keyed by the host it calls: each API may be called
// once a minute, and a call beyond that fails at once (FailFast) without
// being sent. The two test servers listen on different ports, so they are
// different hosts with a quota each.
func ExampleTransportConfig_key() {
	apiA, apiB := httptest.NewServer(featOK), httptest.NewServer(featOK)
	defer apiA.Close()
	defer apiB.Close()

	limiter := core.Must(core.New(core.PerMinute(1).Named("outbound"), core.WithClock(featClock())))
	tr, err := ratelimit.NewTransport(limiter, &ratelimit.TransportConfig{
		Key:      ratelimit.TargetHost, // the default; any KeyFunc, e.g. ratelimit.Header("X-Tenant")
		FailFast: true,
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}
	for _, call := range []struct{ name, url string }{{"A", apiA.URL}, {"A", apiA.URL}, {"B", apiB.URL}} {
		res, err := client.Get(call.url)
		if err != nil {
			fmt.Println(call.name, "not sent:", errors.Is(err, ratelimit.ErrOutboundLimited))
			continue
		}
		res.Body.Close()
		fmt.Println(call.name, res.StatusCode)
	}
	// Output:
	// A 200
	// A not sent: true
	// B 200
}

// A framework-style flow: AdmitWithResult decides the request and writes
// the headers (and the 429), and hands the decision to the handler through
// the request's context.
func ExampleLimiter_AdmitWithResult() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(2).Named("per-ip"),
	}}, ratelimit.WithClock(featClock())))

	serve := func(w http.ResponseWriter, r *http.Request) {
		r, ok := l.AdmitWithResult(w, r)
		if !ok {
			return // refused: the response is written
		}
		res, _ := ratelimit.ResultFromContext(r.Context())
		fmt.Fprintf(w, "%d left\n", res.Layers[0].Decision.Remaining)
	}
	for range 3 {
		rec := httptest.NewRecorder()
		serve(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 200 1 left
	// 200 0 left
	// 429 Too Many Requests
}

// Tiers per key: users on the pro plan get 100 requests per minute, every
// other user the layer's Rule (2 per minute). Each tier speaks in the
// headers under its own name.
func ExampleLayer_resolver() {
	plans := map[string]string{"alice": "pro"}
	tiers, err := core.Tiers(func(_ context.Context, user string) string { return plans[user] },
		map[string]core.Rule{"pro": core.PerMinute(100).Named("per-user-pro")})
	if err != nil {
		panic(err)
	}
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:      ratelimit.User(),
		Rule:     core.PerMinute(2).Named("per-user-free"),
		Resolver: tiers,
	}}, ratelimit.WithHeaders(ratelimit.IETFHeaders), ratelimit.WithClock(featClock())))
	h := l.Handler(featOK)
	for _, user := range []string{"alice", "bob", "bob", "bob"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		rec := featServe(h, r.WithContext(ratelimit.WithUser(r.Context(), user)))
		fmt.Println(user, rec.Code, rec.Header().Get(ratelimit.HeaderRateLimit))
	}
	// Output:
	// alice 200 "per-user-pro";r=99;t=1
	// bob 200 "per-user-free";r=1;t=30
	// bob 200 "per-user-free";r=0;t=60
	// bob 429 "per-user-free";r=0;t=30
}
