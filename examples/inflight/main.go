// Command inflight serves GET /slow, which takes about -sleep (1s by
// default), behind a concurrency limit of 2 requests in flight per client
// IP, next to a rate limit of 60 requests per minute.
//
//	go run ./examples/inflight -addr 127.0.0.1:8080
//	for i in 1 2 3; do curl -s -o /dev/null -w "%{http_code} %{time_total}s\n" http://127.0.0.1:8080/slow & done; wait
//	curl -si http://127.0.0.1:8080/slow
//
// Of the three concurrent requests, one is answered 429 at once (with
// Retry-After: 1 and RateLimit-Policy: "in-flight";q=2;qu="concurrent-requests")
// and two 200 after about a second; a request after they finish gets 200.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	sleep := flag.Duration("sleep", time.Second, "how long GET /slow takes")
	flag.Parse()

	h, err := newHandler(*sleep)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("inflight: GET /slow takes %v, 2 in flight per client IP; try: for i in 1 2 3; do curl -s -o /dev/null -w \"%%{http_code} %%{time_total}s\\n\" %s & done; wait", *sleep, url(*addr))
	log.Fatal(srv.ListenAndServe())
}

// newHandler returns the limited mux: GET /slow takes sleep (or until the
// client goes away).
func newHandler(sleep time.Duration) (http.Handler, error) {
	limiter, err := ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 60, Window: time.Minute}},
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
	}, ratelimit.WithHeaders(ratelimit.AllHeaders))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(sleep)
		defer t.Stop()
		select {
		case <-t.C:
			fmt.Fprintln(w, "done")
		case <-r.Context().Done(): // the client went away: its slot frees now
		}
	})
	return limiter.Handler(mux), nil
}

// url returns the /slow URL for addr, with localhost for an unspecified host.
func url(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/slow"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/slow"
}
