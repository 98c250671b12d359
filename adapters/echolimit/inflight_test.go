package echolimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/echolimit"
	"github.com/limitry/ratelimit/core"
)

// TestInFlightHeldUntilHandlerReturns checks that a concurrency slot taken
// through the adapter is held while the handler runs, even after the client
// has gone away, and given back when it returns.
func TestInFlightHeldUntilHandlerReturns(t *testing.T) {
	for _, cfg := range []echolimit.Config{{}, {Result: true}, {HTTPError: true}} {
		slots := core.NewSlotTable(0)
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1,
		}}, ratelimit.WithSlotStore(slots)))
		gate, started := make(chan struct{}), make(chan struct{})
		e := echo.New()
		e.Use(echolimit.MiddlewareWithConfig(l, cfg))
		e.GET("/slow", func(c echo.Context) error {
			close(started)
			<-gate // ignores its context, as many handlers do
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		req := httptest.NewRequest("GET", "/slow", nil).WithContext(ctx)
		req.RemoteAddr = "192.0.2.1:1"
		finished := make(chan struct{})
		go func() { e.ServeHTTP(httptest.NewRecorder(), req); close(finished) }()
		<-started
		cancel() // the client goes away; the handler still runs
		second := httptest.NewRequest("GET", "/slow", nil)
		second.RemoteAddr = "192.0.2.1:2"
		w := httptest.NewRecorder()
		e.ServeHTTP(w, second)
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("config %+v: a second request while the first handler runs: %d, want 429", cfg, w.Code)
		}
		close(gate)
		<-finished
		if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
			t.Fatalf("config %+v: %d slots held after the handler returned, want 0", cfg, n)
		}
	}
}
