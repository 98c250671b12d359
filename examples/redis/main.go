// Command redis serves GET / behind a per-client-IP rate limit of 5 requests
// per 10 seconds (token bucket) kept in Redis, with every rate-limit header
// set. Every instance pointed at the same Redis shares the quota:
//
//	(cd examples/redis && go run . -addr 127.0.0.1:8080 -redis 127.0.0.1:6379) &
//	(cd examples/redis && go run . -addr 127.0.0.1:8081 -redis 127.0.0.1:6379) &
//	for p in 8080 8081 8080 8081 8080 8081 8080; do curl -s -o /dev/null -w "$p %{http_code}\n" http://127.0.0.1:$p/; done
//
// prints 200 five times, then 429: the two servers count against one
// quota. The decision time is Redis's clock, so the servers' clocks do not
// matter. If Redis is unreachable, decisions fail fast (a 50ms timeout,
// then a circuit breaker) and the middleware fails open: requests are
// served unlimited until Redis is back, and the log says so.
//
// With -lease N (N > 0), each instance leases N units of a client's quota
// from Redis at a time (redisstore.LeaseStore, every key treated as hot)
// and spends them without a round trip for up to a second: the instances
// together still never admit more than the quota, but units one instance
// leased and did not spend within the second are lost to the quota. The
// default, 0, leases nothing: one round trip per request.
//
// The client is the connecting peer (r.RemoteAddr): no proxy is trusted, so
// X-Forwarded-For is ignored. Behind a load balancer, see ratelimit.ClientIP
// and TrustedProxyCIDRs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "address of the Redis server")
	lease := flag.Int64("lease", 0, "units of a client's quota leased from Redis at a time (0: none, one round trip per request)")
	flag.Parse()
	if *lease < 0 {
		log.Fatalf("-lease %d: must be 0 (no leases) or a number of units", *lease)
	}

	client := redis.NewClient(&redis.Options{
		Addr:                  *redisAddr,
		ContextTimeoutEnabled: true, // let the store's 50ms timeout bound each call
		DialerRetries:         1,    // a Redis that refuses connections fails fast
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := client.Ping(ctx).Err(); err != nil {
		log.Printf("redis %s: %v (serving anyway: requests are not limited until it answers)", *redisAddr, err)
	}
	cancel()

	handler, err := newHandler(client, func(from, to redisstore.BreakerState) {
		log.Printf("redis breaker: %v -> %v", from, to)
	}, *lease)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{
		Addr:              *addr,
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
	}
	log.Printf("redis example: 5 requests per 10s per client IP, shared through %s; try: curl -si %s", *redisAddr, url(*addr))
	log.Fatal(srv.ListenAndServe())
}

// newHandler returns the example's handler: GET / limited per client IP, the
// quota kept in Redis through client, leased lease units at a time if
// lease > 0.
func newHandler(client redis.UniversalClient, onBreaker func(from, to redisstore.BreakerState), lease int64) (http.Handler, error) {
	redisStore, err := redisstore.New(client, &redisstore.Config{
		Prefix:        "ratelimit-example:",
		OnStateChange: onBreaker,
	})
	if err != nil {
		return nil, err
	}
	// Load the script and open the connection pool before serving, so the
	// first burst pays for neither (a failure here is logged, not fatal:
	// decisions are correct without it).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := redisStore.Warm(ctx); err != nil {
		log.Printf("redis warm-up: %v", err)
	}
	cancel()
	var store core.Store = redisStore
	if lease > 0 {
		if store, err = redisstore.NewLeaseStore(redisStore, &redisstore.LeaseConfig{Size: lease, HotThreshold: 1}); err != nil {
			return nil, err
		}
	}
	limiter, err := ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Algorithm: core.TokenBucket, Limit: 5, Window: 10 * time.Second},
	}},
		ratelimit.WithStore(store),
		ratelimit.WithHeaders(ratelimit.AllHeaders),
		ratelimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			// While the breaker is open the failure is known (logged by
			// onBreaker); log the others. The request is then served
			// (fail-open, the default).
			if !errors.Is(err, redisstore.ErrUnavailable) {
				log.Printf("rate limit not applied to %s %s: %v", r.Method, r.URL.Path, err)
			}
		}),
	)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	return limiter.Handler(mux), nil
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
