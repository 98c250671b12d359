package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// TestMain fails the package's tests if any goroutine outlives them: the
// middleware, its shaping timers and the test servers must all clean up.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestExactAdmissionOverHTTP sends a known number of requests from 64
// concurrent clients through a real HTTP server on a frozen clock: the
// number of 200s equals the capacity, exactly, for every algorithm.
func TestExactAdmissionOverHTTP(t *testing.T) {
	const clients, each, capacity = 64, 5, 100
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			rule := core.Rule{Name: "exact", Algorithm: alg, Limit: capacity, Window: time.Hour}
			if alg == core.LeakyBucket {
				rule.Burst = capacity
			}
			l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}},
				ratelimit.WithClock(core.NewFakeClock(mwT0))))
			srv := httptest.NewServer(l.Handler(mwOK))
			defer srv.Close()
			client := srv.Client()
			var codes [600]atomic.Int64
			var wg sync.WaitGroup
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						resp, err := client.Get(srv.URL)
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						codes[resp.StatusCode].Add(1)
					}
				}()
			}
			wg.Wait()
			client.CloseIdleConnections()
			if ok, refused := codes[200].Load(), codes[429].Load(); ok != capacity || ok+refused != clients*each {
				t.Fatalf("%d clients x %d requests: %d OK and %d refused, want exactly %d OK and the rest refused", clients, each, ok, refused, capacity)
			}
		})
	}
}

// chargedKeys returns the keys charged (or refused) for one request, as the
// Observer saw them.
type keyObserver struct {
	core.NopObserver
	mu   sync.Mutex
	keys []string
}

func (o *keyObserver) ObserveDecision(e core.DecisionEvent) {
	o.mu.Lock()
	o.keys = append(o.keys, e.Key)
	o.mu.Unlock()
}

func (o *keyObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.keys
	o.keys = nil
	return k
}

// TestHostileForwardingHeaders is the table of spoofing and malformed-input
// cases for the client-IP extractor, run through the middleware. Each case
// states whose quota is charged, or that the request fails closed (400,
// nothing charged). The server trusts the proxies in 10.0.0.0/8 and
// fd00::/8.
func TestHostileForwardingHeaders(t *testing.T) {
	huge := strings.Repeat("6.6.6.6, ", 200_000) // 1.8 MB
	tests := []struct {
		name    string
		peer    string
		headers []string // name, value pairs; repeated names are separate lines
		charged string   // "" means the request fails closed
	}{
		{"no headers", "203.0.113.7:1234", nil, "203.0.113.7"},
		{"forged XFF from untrusted peer", "203.0.113.7:1234", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"forged X-Real-IP from untrusted peer", "203.0.113.7:1234", []string{"X-Real-IP", "198.51.100.1"}, "203.0.113.7"},
		{"forged Forwarded from untrusted peer", "203.0.113.7:1234", []string{"Forwarded", "for=198.51.100.1"}, "203.0.113.7"},
		{"forged XFF naming a trusted proxy", "203.0.113.7:1234", []string{"X-Forwarded-For", "10.0.0.1"}, "203.0.113.7"},
		{"trusted proxy, one hop", "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"trusted proxy, client-forged leftmost ignored", "10.0.0.2:80", []string{"X-Forwarded-For", "1.2.3.4, 198.51.100.1"}, "198.51.100.1"},
		{"trusted chain of proxies", "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1, 10.9.9.9, 10.0.0.3"}, "198.51.100.1"},
		{"multiple XFF lines merged in order", "10.0.0.2:80", []string{"X-Forwarded-For", "1.2.3.4", "X-Forwarded-For", "198.51.100.1, 10.0.0.3"}, "198.51.100.1"},
		{"garbage inside the trusted part", "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1, not-an-ip, 10.0.0.3"}, ""},
		{"garbage left of the client is never reached", "10.0.0.2:80", []string{"X-Forwarded-For", "garbage, 198.51.100.1"}, "198.51.100.1"},
		{"all entries trusted: leftmost", "10.0.0.2:80", []string{"X-Forwarded-For", "10.1.1.1, 10.2.2.2"}, "10.1.1.1"},
		{"trusted proxy without header keys the proxy", "10.0.0.2:80", nil, "10.0.0.2"},
		{"v4-mapped client behind a trusted proxy", "10.0.0.2:80", []string{"X-Forwarded-For", "::ffff:198.51.100.1"}, "198.51.100.1"},
		{"v4-mapped trusted proxy is trusted", "[::ffff:10.0.0.2]:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"v4-mapped untrusted peer keyed as IPv4", "[::ffff:203.0.113.7]:80", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"IPv6 peer grouped by /64", "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 rotation inside one /64: same key", "[2001:db8:1:2:ffff:ffff:ffff:fffe]:443", nil, "2001:db8:1:2::/64"},
		{"another /64: another key", "[2001:db8:1:3::1]:443", nil, "2001:db8:1:3::/64"},
		{"zone stripped", "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"IPv6 client behind an IPv6 proxy", "[fd00::1]:443", []string{"X-Forwarded-For", "2001:db8:9::7"}, "2001:db8:9::/64"},
		{"RFC 7239 with brackets and port", "10.0.0.2:80", []string{"Forwarded", `for="[2001:db8:9::7]:4711"`}, "2001:db8:9::/64"},
		{"oversized forged XFF from untrusted peer", "203.0.113.7:1234", []string{"X-Forwarded-For", huge}, "203.0.113.7"},
		{"oversized XFF through a trusted proxy: rightmost untrusted entry", "10.0.0.2:80", []string{"X-Forwarded-For", huge + "10.0.0.7"}, "6.6.6.6"},
		{"trusted hops beyond the walk limit fail closed", "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1, " + strings.Repeat("10.0.0.1, ", 200_000) + "10.0.0.7"}, ""},
		{"oversized entry", "10.0.0.2:80", []string{"X-Forwarded-For", strings.Repeat("1", 5000)}, ""},
		{"garbage RemoteAddr", "not-an-address", nil, ""},
	}
	obs := &keyObserver{}
	xff := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8", "fd00::/8"))
	fwd := ratelimit.MustClientIP(ratelimit.TrustedProxyCIDRs("10.0.0.0/8", "fd00::/8"), ratelimit.FromHeader("Forwarded"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := xff
			for i := 0; i < len(tt.headers); i += 2 {
				if tt.headers[i] == "Forwarded" && strings.HasPrefix(tt.peer, "10.") {
					key = fwd
				}
			}
			l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: key, Rule: core.PerMinute(10).Named("ip")}},
				ratelimit.WithObserver(obs), ratelimit.WithClock(core.NewFakeClock(mwT0))))
			r := mwReq(tt.peer, tt.headers...)
			rec := httptest.NewRecorder()
			l.Handler(mwOK).ServeHTTP(rec, r)
			charged := obs.take()
			if tt.charged == "" {
				if rec.Code != http.StatusBadRequest || len(charged) != 0 {
					t.Fatalf("want fail closed (400, nothing charged); got %d, charged %q", rec.Code, charged)
				}
				return
			}
			if rec.Code != http.StatusOK || len(charged) != 1 || charged[0] != tt.charged {
				t.Fatalf("got %d charging %q, want 200 charging %q", rec.Code, charged, tt.charged)
			}
		})
	}
}

// TestFloodDoesNotReleaseLimitedClient floods the middleware's memory store
// with new client IPs while one client is over its limit: with KeepActive the
// client stays limited, and the new keys that find no room are refused with
// 429 and a Retry-After, under the default fail-open policy as under
// fail-closed: never served unlimited.
func TestFloodDoesNotReleaseLimitedClient(t *testing.T) {
	for _, policy := range []struct {
		name string
		opts []ratelimit.Option
	}{{"fail-open", nil}, {"fail-closed", []ratelimit.Option{ratelimit.WithFailClosed()}}} {
		t.Run(policy.name, func(t *testing.T) {
			store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 256, KeepActive: true})
			var handled []error
			opts := append([]ratelimit.Option{ratelimit.WithStore(store), ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				handled = append(handled, err)
			})}, policy.opts...)
			e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("ip")}}, opts...)
			victim := "203.0.113.7:1"
			for i := 0; i < 3; i++ {
				e.do(t, mwReq(victim))
			}
			if rec := e.do(t, mwReq(victim)); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("victim not limited: %d", rec.Code)
			}
			refused, admitted := 0, 0
			for i := 0; i < 5000; i++ {
				rec := e.do(t, mwReq(fmt.Sprintf("198.%d.%d.%d:1", i>>16&255, i>>8&255, i&255)))
				switch rec.Code {
				case http.StatusTooManyRequests:
					refused++
					if ra, err := strconv.Atoi(rec.Header().Get(ratelimit.HeaderRetryAfter)); err != nil || ra < 1 {
						t.Fatalf("store full: Retry-After %q, want at least 1", rec.Header().Get(ratelimit.HeaderRetryAfter))
					}
				case http.StatusOK:
					admitted++
				default:
					t.Fatalf("store full: status %d, want 429", rec.Code)
				}
			}
			if store.Evictions() != 0 {
				t.Fatalf("KeepActive store evicted %d keys", store.Evictions())
			}
			if refused == 0 || admitted+refused != 5000 || admitted > store.Capacity() {
				t.Fatalf("a full KeepActive store: %d admitted, %d refused", admitted, refused)
			}
			if len(handled) != refused || !errors.Is(handled[0], core.ErrStoreFull) || errors.Is(handled[0], ratelimit.ErrStoreFailure) {
				t.Fatalf("error handler saw %d errors (first %v), want %d wrapping core.ErrStoreFull", len(handled), handled, refused)
			}
			if rec := e.do(t, mwReq(victim)); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("flood of %d new keys released the limited client: %d", 5000, rec.Code)
			}
		})
	}
}

// TestFloodEvictsByDefault checks that without KeepActive the same flood
// evicts, and says so.
func TestFloodEvictsByDefault(t *testing.T) {
	store2 := core.MustMemoryStore(&core.MemoryConfig{Capacity: 256})
	e2 := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("ip")}}, ratelimit.WithStore(store2))
	for i := 0; i < 5000; i++ {
		e2.do(t, mwReq(fmt.Sprintf("198.%d.%d.%d:1", i>>16&255, i>>8&255, i&255)))
	}
	if store2.Evictions() == 0 || store2.Len() > store2.Capacity() {
		t.Fatalf("default store: %d evictions, %d of %d keys", store2.Evictions(), store2.Len(), store2.Capacity())
	}
}

// TestRefusalsAreNotCached checks that every refusal the middleware writes
// (text or problem details) forbids caches to store it (RFC 6585 §4).
func TestRefusalsAreNotCached(t *testing.T) {
	for _, opts := range [][]ratelimit.Option{nil, {ratelimit.WithProblemDetails()}} {
		e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(1).Named("ip")}}, opts...)
		if rec := e.do(t, mwReq("203.0.113.9:1")); rec.Code != http.StatusOK || rec.Header().Get("Cache-Control") != "" {
			t.Fatalf("admitted: %d, Cache-Control %q", rec.Code, rec.Header().Get("Cache-Control"))
		}
		rec := e.do(t, mwReq("203.0.113.9:1"))
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("refused: %d, Cache-Control %q, want 429 and no-store", rec.Code, rec.Header().Get("Cache-Control"))
		}
	}
}

// heldStore holds the first Take after hold is set until release is
// closed: a request that read the clock and then waited for a store's
// lock while others went first.
type heldStore struct {
	core.Store
	hold    atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func (s *heldStore) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	if s.hold.CompareAndSwap(true, false) {
		close(s.reached)
		<-s.release
	}
	return s.Store.Take(ctx, now, reqs, out)
}

// TestStaleRequestCreditsNothing: a request that read the Limiter's clock
// and was held before the store while time moved on and other requests
// drained the key (across a window's end, for the window algorithms) is
// decided without making room: the key admits no more than when that
// request is decided at the current time instead, for every algorithm.
func TestStaleRequestCreditsNothing(t *testing.T) {
	for _, alg := range core.Algorithms() {
		for _, advance := range []time.Duration{150 * time.Millisecond, 700 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", alg.Name(), advance), func(t *testing.T) {
				run := func(held bool) int {
					clk := core.NewFakeClock(mwT0.Add(900 * time.Millisecond)) // 100ms before a window's end
					hs := &heldStore{Store: core.MustMemoryStore(nil), reached: make(chan struct{}), release: make(chan struct{})}
					rule := core.Rule{Name: "stale", Algorithm: alg, Limit: 5, Window: time.Second}
					if alg == core.LeakyBucket {
						rule.Burst = 5
					}
					l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}},
						ratelimit.WithClock(clk), ratelimit.WithStore(hs)))
					admitted := 0
					drain := func() {
						for range 20 {
							if !l.Decide(getFrom("192.0.2.1")).Proceed {
								return
							}
							admitted++
						}
					}
					drain()
					done := make(chan bool)
					if held {
						hs.hold.Store(true)
						go func() { done <- l.Decide(getFrom("192.0.2.1")).Proceed }()
						<-hs.reached
					}
					clk.Advance(advance)
					drain()
					if held {
						close(hs.release)
					} else {
						go func() { done <- l.Decide(getFrom("192.0.2.1")).Proceed }()
					}
					if <-done {
						admitted++
					}
					for range 8 {
						drain()
						clk.Advance(100 * time.Millisecond)
					}
					return admitted
				}
				if stale, now := run(true), run(false); stale > now {
					t.Errorf("%d admitted with one request decided at the time it read before the others, %d with it decided at the current time", stale, now)
				}
			})
		}
	}
}
