package ratelimit_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// One Limiter around a whole ServeMux holds a per-IP limit for every route
// and a login limit for POST /login only, decided in one atomic batch: a
// login refused by its route limit uses up none of the per-IP quota.
func ExampleWithServeMux() {
	mux := http.NewServeMux()
	mux.Handle("GET /hello", exHello)
	mux.Handle("POST /login", exHello)

	ip := ratelimit.MustClientIP()
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ip, Rule: core.PerMinute(5).Named("per-ip")},
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.PerMinute(2).Named("login"), Routes: []string{"POST /login"}},
	}, ratelimit.WithServeMux(mux), ratelimit.WithClock(exampleClock())))
	h := l.Handler(mux)

	send := func(method, path string) int {
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = "192.0.2.1:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	fmt.Println(send("POST", "/login"), send("POST", "/login"), send("POST", "/login"))
	fmt.Println(send("GET", "/hello"), send("GET", "/hello"), send("GET", "/hello"), send("GET", "/hello"))
	// Output:
	// 200 200 429
	// 200 200 200 429
}

// IPv6 clients are keyed by their /64 by default. A subscriber holding a /48
// has 65,536 of those: a second layer keyed by the /48 caps the whole
// allocation, so rotating /64s does not multiply the quota.
func ExampleIPv6Prefix_layers() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(2).Named("per-64")},
		{Key: ratelimit.MustClientIP(ratelimit.IPv6Prefix(48), ratelimit.IPv4Prefix(32)), Rule: core.PerMinute(4).Named("per-48")},
	}, ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	// Three /64s inside 2001:db8:1::/48, two requests each.
	var codes []int
	for _, addr := range []string{"[2001:db8:1:1::1]:1", "[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1"} {
		codes = append(codes, exGet(h, addr, "").StatusCode, exGet(h, addr, "").StatusCode)
	}
	fmt.Println(codes)
	// Another /48 has its own quota.
	fmt.Println(exGet(h, "[2001:db8:2:1::1]:1", "").StatusCode)
	// Output:
	// [200 200 200 200 429 429]
	// 200
}

// An API-key limit that is the only limit must not be escaped by leaving the
// key out. Either refuse requests without it (IfNoKey)...
func ExampleNoKey() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:     ratelimit.Header("X-API-Key", ratelimit.HashKey()),
		Rule:    core.PerMinute(100).Named("api-key"),
		IfNoKey: ratelimit.NoKeyRefuse,
	}}, ratelimit.WithClock(exampleClock())))
	fmt.Println(exGet(l.Handler(exHello), "192.0.2.1:1", "").StatusCode)
	// Output:
	// 401
}

// ...or fall back to the client IP for requests without it.
func ExampleFirstOf() {
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.FirstOf(ratelimit.Header("X-API-Key", ratelimit.HashKey()), ratelimit.MustClientIP()),
		Rule: core.PerMinute(1).Named("api"),
	}}, ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	fmt.Println(exGet(h, "192.0.2.1:1", "").StatusCode, exGet(h, "192.0.2.1:1", "").StatusCode)
	// Output:
	// 200 429
}

// The one-time warnings go to slog.Default() unless WithLogger says
// otherwise; WithLogger(nil) silences them.
func ExampleWithLogger() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // stable output
			}
			return a
		},
	}))
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(), // no proxy trusted
		Rule: core.PerMinute(100).Named("per-ip"),
	}}, ratelimit.WithLogger(logger), ratelimit.WithClock(exampleClock())))
	h := l.Handler(exHello)
	for range 2 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "127.0.0.1:5000" // a reverse proxy on the same host
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	// Output:
	// level=WARN msg="ratelimit: forwarded headers arrive from a loopback or private peer but no proxy is trusted: every client behind that proxy shares its bucket; pass the proxy's network to ratelimit.TrustedProxies" header=X-Forwarded-For peer=loopback
}

// Behind nginx on a unix socket, RemoteAddr carries no address: trust the
// socket peer's forwarded header.
func ExampleTrustUnixSocketPeer() {
	key := ratelimit.MustClientIP(ratelimit.TrustUnixSocketPeer())
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	fmt.Println(key(r))
	// Output:
	// 203.0.113.9 <nil>
}
