package ratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// sleepClock is a fake clock that a Transport can wait on: its Sleep
// advances the clock instead of sleeping, so the example runs at once.
type sleepClock struct{ *core.FakeClock }

func (c sleepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Advance(d)
	return ctx.Err()
}

// A client of a rate-limited API. The Transport keeps the client to its own
// quota (10 requests per second per host) and, when the server says its
// quota is spent (RateLimit: r=0), holds the next request back until the
// server's quota is back, so the client never receives a 429.
func ExampleNewTransport() {
	clock := sleepClock{exampleClock()}

	// The API: 3 requests per minute per client IP, with the IETF fields.
	api := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.PerMinute(3).Named("per-ip"),
	}}, ratelimit.WithClock(clock), ratelimit.WithHeaders(ratelimit.IETFHeaders)))
	srv := httptest.NewServer(api.Handler(exHello))
	defer srv.Close()

	// The client.
	limiter := core.Must(core.New(core.PerSecond(10).Named("outbound"), core.WithClock(clock)))
	tr, err := ratelimit.NewTransport(limiter, &ratelimit.TransportConfig{
		Base: srv.Client().Transport, // default: http.DefaultTransport
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}

	for range 5 {
		start := clock.Now()
		res, err := client.Get(srv.URL)
		if err != nil {
			panic(err)
		}
		res.Body.Close()
		fmt.Printf("%d after waiting %v, RateLimit: %s\n", res.StatusCode, clock.Now().Sub(start), res.Header.Get("RateLimit"))
	}
	// Output:
	// 200 after waiting 0s, RateLimit: "per-ip";r=2;t=20
	// 200 after waiting 0s, RateLimit: "per-ip";r=1;t=40
	// 200 after waiting 0s, RateLimit: "per-ip";r=0;t=60
	// 200 after waiting 1m0s, RateLimit: "per-ip";r=2;t=20
	// 200 after waiting 0s, RateLimit: "per-ip";r=1;t=40
}
