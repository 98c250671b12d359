package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// sleepClock is a fake clock that the Transport waits on: Sleep advances
// it, so the test takes no real time.
type sleepClock struct{ *core.FakeClock }

func (c sleepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Advance(d)
	return ctx.Err()
}

// TestOutboundAgainstQuickstart runs the example against a server built as
// examples/quickstart builds it (5 requests per 10 s per client IP, every
// header set), both on one fake clock: all 8 calls end 200, the sixth after
// waiting for the server's quota to come back.
func TestOutboundAgainstQuickstart(t *testing.T) {
	clock := sleepClock{core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	server := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Algorithm: core.TokenBucket, Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithClock(clock)))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	srv := httptest.NewServer(server.Handler(mux))
	defer srv.Close()

	limiter := core.Must(core.New(core.PerSecond(10).Named("outbound"), core.WithClock(clock)))
	var out bytes.Buffer
	if err := run(context.Background(), &out, limiter, srv.Client().Transport, srv.URL+"/", 8); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	type row struct{ call, status, waited, remaining string }
	var rows []row
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] != "CALL" && f[1] != "calls:" {
			rows = append(rows, row{f[0], f[1], f[2], f[3]})
		}
	}
	want := []row{
		{"1", "200", "0s", "4"},
		{"2", "200", "0s", "3"},
		{"3", "200", "0s", "2"},
		{"4", "200", "0s", "1"},
		{"5", "200", "0s", "0"},
		{"6", "200", "10s", "4"},
		{"7", "200", "0s", "3"},
		{"8", "200", "0s", "2"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), out.String())
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, rows[i], want[i])
		}
	}
	if !strings.Contains(out.String(), "8 calls: 8 x 200, 0 x 429, waited 10s in all") {
		t.Errorf("summary missing:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}
