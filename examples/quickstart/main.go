// Command quickstart serves GET / behind a per-client-IP rate limit of 5
// requests per 10 seconds (token bucket), with every rate-limit header set.
//
//	go run ./examples/quickstart -addr 127.0.0.1:8080
//	for i in 1 2 3 4 5 6 7; do curl -si http://127.0.0.1:8080/ | head -n 9; done
//
// The client is the connecting peer (r.RemoteAddr): no proxy is trusted, so
// X-Forwarded-For is ignored. Behind a load balancer, see ratelimit.ClientIP
// and TrustedProxyCIDRs.
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
	flag.Parse()

	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Algorithm: core.TokenBucket, Limit: 5, Window: 10 * time.Second},
	}}, ratelimit.WithHeaders(ratelimit.AllHeaders)))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})

	srv := &http.Server{
		Addr:              *addr,
		Handler:           limiter.Handler(mux),
		ReadHeaderTimeout: 5 * time.Second,
	}
	log.Printf("quickstart: 5 requests per 10s per client IP; try: for i in 1 2 3 4 5 6 7; do curl -si %s | head -n 9; done", url(*addr))
	log.Fatal(srv.ListenAndServe())
}

// url returns a URL for addr, with localhost for an unspecified host.
func url(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}
