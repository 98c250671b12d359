// Command outbound calls a rate-limited server n times through a
// ratelimit.Transport and prints each call's status and how long it waited.
//
//	go run ./examples/quickstart -addr 127.0.0.1:8080 &
//	go run ./examples/outbound -url http://127.0.0.1:8080/ -n 8
//
// The quickstart server admits 5 requests per 10 seconds per client IP. The
// Transport keeps this client to a quota of its own (10 requests per second
// per host) and reads the server's rate-limit headers: when the fifth
// response says the server's quota is spent (RateLimit: r=0, or
// X-RateLimit-Remaining: 0 with X-RateLimit-Reset), the sixth call waits
// until the quota is back instead of being refused. All 8 calls end 200.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

func main() {
	url := flag.String("url", "http://localhost:8080/", "URL to call")
	n := flag.Int("n", 8, "number of calls")
	flag.Parse()
	if *n < 1 {
		log.Fatalf("outbound: -n must be at least 1, not %d", *n)
	}
	limiter := core.Must(core.New(core.PerSecond(10).Named("outbound")))
	if err := run(context.Background(), os.Stdout, limiter, nil, *url, *n); err != nil {
		log.Fatal(err)
	}
}

// run makes n GET calls to url through a Transport charging limiter and
// sending through base (http.DefaultTransport when nil), and writes one
// line per call and a summary to w. A call the Transport refuses or that
// fails is an error.
func run(ctx context.Context, w io.Writer, limiter *core.Limiter, base http.RoundTripper, url string, n int) error {
	if base == nil {
		base = http.DefaultTransport
	}
	clock := limiter.Clock()
	sent := &stamp{base: base, clock: clock}
	tr, err := ratelimit.NewTransport(limiter, &ratelimit.TransportConfig{Base: sent})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tSTATUS\tWAITED\tSERVER REMAINING\tRATELIMIT")
	counts := map[int]int{}
	var total time.Duration
	for i := 1; i <= n; i++ {
		start := clock.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		res, err := client.Do(req)
		if err != nil {
			tw.Flush()
			return fmt.Errorf("call %d: %w", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		waited := sent.at.Sub(start).Round(10 * time.Millisecond)
		total += waited
		counts[res.StatusCode]++
		fmt.Fprintf(tw, "%d\t%d\t%v\t%s\t%s\n", i, res.StatusCode, waited,
			orDash(res.Header.Get(ratelimit.HeaderRateLimitRemaining)), orDash(res.Header.Get(ratelimit.HeaderRateLimit)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d calls: %d x 200, %d x 429, waited %v in all\n",
		n, counts[http.StatusOK], counts[http.StatusTooManyRequests], total)
	return nil
}

// stamp is the Transport's base: it notes when the Transport let the
// request go, so that the wait printed is the Transport's alone, not the
// network's. Calls are sequential, so at needs no lock.
type stamp struct {
	base  http.RoundTripper
	clock core.Clock
	at    time.Time
}

func (s *stamp) RoundTrip(r *http.Request) (*http.Response, error) {
	s.at = s.clock.Now()
	return s.base.RoundTrip(r)
}

// CloseIdleConnections closes the idle connections of the base transport.
func (s *stamp) CloseIdleConnections() {
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
