package chilimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/chilimit"
	"github.com/limitry/ratelimit/core"
)

// TestInFlightHeldUntilHandlerReturns checks that a concurrency slot taken
// through the adapter is held while the handler runs, even after the client
// has gone away, and given back when it returns.
func TestInFlightHeldUntilHandlerReturns(t *testing.T) {
	for _, withResult := range []bool{false, true} {
		slots := core.NewSlotTable(0)
		l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
			Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 1,
		}}, ratelimit.WithSlotStore(slots)))
		var opts []chilimit.Option
		if withResult {
			opts = append(opts, chilimit.WithResult())
		}
		gate, started := make(chan struct{}), make(chan struct{})
		r := chi.NewRouter()
		r.Use(chilimit.Middleware(l, opts...))
		r.Get("/slow", func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-gate // ignores its context, as many handlers do
		})
		ctx, cancel := context.WithCancel(context.Background())
		req := httptest.NewRequest("GET", "/slow", nil).WithContext(ctx)
		req.RemoteAddr = "192.0.2.1:1"
		finished := make(chan struct{})
		go func() { r.ServeHTTP(httptest.NewRecorder(), req); close(finished) }()
		<-started
		cancel() // the client goes away; the handler still runs
		second := httptest.NewRequest("GET", "/slow", nil)
		second.RemoteAddr = "192.0.2.1:2"
		w := httptest.NewRecorder()
		r.ServeHTTP(w, second)
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("result %v: a second request while the first handler runs: %d, want 429", withResult, w.Code)
		}
		close(gate)
		<-finished
		if n := slots.InFlight("in-flight", "192.0.2.1"); n != 0 {
			t.Fatalf("result %v: %d slots held after the handler returned, want 0", withResult, n)
		}
	}
}
