// Command demo shows layered rate limiting end to end in under a second:
//
//	go run ./examples/demo
//
// It starts an HTTP server in-process on a loopback port, limited per client
// IP (5 requests per 10s) and per user (3 per 10s) in one middleware, then
// plays a scripted burst from three clients against it: alice and bob, two
// users behind one office IP, and an anonymous guest on another IP. It prints
// a timeline of every response and exits.
//
// The server trusts the loopback address as a reverse proxy, so the script's
// clients present their simulated addresses in X-Forwarded-For, as a load
// balancer would. Time is a fake clock the script advances, so the output is
// the same on every run and nobody waits.
//
// The -addr flag sets the listening address (default 127.0.0.1:0, a free
// loopback port).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

var addr = flag.String("addr", "127.0.0.1:0", "address the demo server listens on")

func main() {
	flag.Parse()
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// client is one simulated client of the script.
type client struct {
	name string // shown in the timeline
	ip   string // sent in X-Forwarded-For
	user string // sent as a bearer token; "" for anonymous
}

var (
	alice = client{"alice", "203.0.113.10", "alice"}
	bob   = client{"bob", "203.0.113.10", "bob"}
	guest = client{"guest", "198.51.100.20", ""}
)

// step is one request of the script, at an offset from the start.
type step struct {
	at time.Duration
	c  client
}

var script = []step{
	{0, alice}, {0, alice}, {0, alice}, {0, alice}, // the 4th: per-user
	{0, bob}, {0, bob}, {0, bob}, // the office IP is now empty: per-ip
	{0, guest}, {0, guest}, {0, guest}, // another IP, its own quota
	{1 * time.Second, bob},   // per-ip refills one request every 2s: not yet
	{2 * time.Second, bob},   // now
	{2 * time.Second, alice}, // both layers refuse
	{4 * time.Second, alice}, // both have room again
	{10 * time.Second, guest},
}

// showHeadersOf is the step whose response headers are printed in full.
const showHeadersOf = 12

// run starts the server, plays the script against it and writes the
// timeline to w.
func run(w io.Writer) error {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := core.NewFakeClock(start)

	// The demo's clients connect from loopback, which stands in for a
	// trusted load balancer: X-Forwarded-For is believed only from it.
	clientIP, err := ratelimit.ClientIP(ratelimit.TrustedProxyCIDRs("127.0.0.0/8", "::1"))
	if err != nil {
		return err
	}
	limiter, err := ratelimit.New([]ratelimit.Layer{
		{Key: clientIP, Rule: core.Rule{Name: "per-ip", Limit: 5, Window: 10 * time.Second}},
		{Key: ratelimit.User(), Rule: core.Rule{Name: "per-user", Limit: 3, Window: 10 * time.Second}},
	},
		ratelimit.WithClock(clock),
		ratelimit.WithHeaders(ratelimit.AllHeaders),
		ratelimit.WithResetDelta(),
		ratelimit.WithProblemDetails(),
	)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: bearerAuth(limiter.Handler(mux)), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()

	fmt.Fprintln(w, "Layered limits in one middleware, decided and charged atomically:")
	fmt.Fprintln(w, "  per-ip:   5 requests per 10s per client IP (token bucket)")
	fmt.Fprintln(w, "  per-user: 3 requests per 10s per signed-in user")
	fmt.Fprintln(w, "alice and bob share the office IP 203.0.113.10; guest is anonymous on 198.51.100.20.")
	fmt.Fprintln(w)

	base := "http://" + ln.Addr().String() + "/"
	httpc := &http.Client{Timeout: 5 * time.Second}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tCLIENT\tIP\tSTATUS\tREMAINING\tRETRY-AFTER\tREFUSED BY")
	var shown http.Header
	for i, s := range script {
		clock.Set(start.Add(s.at))
		res, refusedBy, err := send(httpc, base, s.c)
		if err != nil {
			return err
		}
		retry := res.Header.Get(ratelimit.HeaderRetryAfter)
		if retry != "" {
			retry += "s"
		}
		fmt.Fprintf(tw, "+%.1fs\t%s\t%s\t%d\t%s\t%s\t%s\n", s.at.Seconds(), s.c.name, s.c.ip, res.StatusCode,
			res.Header.Get(ratelimit.HeaderRateLimitRemaining), dash(retry), dash(strings.Join(refusedBy, ", ")))
		if i == showHeadersOf {
			shown = res.Header
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	s := script[showHeadersOf]
	fmt.Fprintf(w, "\nRate-limit headers of %s's request at +%.1fs:\n", s.c.name, s.at.Seconds())
	for _, name := range []string{
		ratelimit.HeaderRateLimitLimit, ratelimit.HeaderRateLimitRemaining, ratelimit.HeaderRateLimitReset,
		ratelimit.HeaderRateLimitPolicy, ratelimit.HeaderRateLimit, ratelimit.HeaderRetryAfter,
	} {
		fmt.Fprintf(w, "  %s: %s\n", name, shown.Get(name))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "alice's 4th request was refused by per-user and charged nothing, so bob still had")
	fmt.Fprintln(w, "two of the office's requests; X-Forwarded-For was believed only because the peer")
	fmt.Fprintln(w, "(loopback) is a trusted proxy.")
	return nil
}

// send makes one request as c and returns the response (body read and
// closed) and, for a 429, the refusing layers from the problem details.
func send(httpc *http.Client, url string, c client) (*http.Response, []string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("X-Forwarded-For", c.ip)
	if c.user != "" {
		req.Header.Set("Authorization", "Bearer "+c.user)
	}
	res, err := httpc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, nil, err
	}
	var refusedBy []string
	switch res.StatusCode {
	case http.StatusOK:
	case http.StatusTooManyRequests:
		var p struct {
			ViolatedPolicies []string `json:"violated-policies"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			return nil, nil, fmt.Errorf("decoding problem details %q: %w", body, err)
		}
		refusedBy = p.ViolatedPolicies
	default:
		return nil, nil, errors.New("unexpected response: " + res.Status + ": " + string(body))
	}
	return res, refusedBy, nil
}

// bearerAuth is a toy authentication middleware: "Authorization: Bearer
// <name>" makes <name> the request's user. Never accept unverified
// identities in a real service.
func bearerAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && name != "" {
			r = r.WithContext(ratelimit.WithUser(r.Context(), name))
		}
		next.ServeHTTP(w, r)
	})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
