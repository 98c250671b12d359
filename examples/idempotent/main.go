// Command idempotent serves POST /charge behind a per-client-IP limit of 2
// requests per minute, with retries that carry the same Idempotency-Key
// charged once:
//
//	go run ./examples/idempotent -addr 127.0.0.1:8080
//	for k in k1 k1 k2 k3; do
//	  curl -s -o /dev/null -w "$k %{http_code} remaining=%header{x-ratelimit-remaining}\n" \
//	    -X POST -H "Idempotency-Key: $k" http://127.0.0.1:8080/charge
//	done
//
// prints
//
//	k1 200 remaining=1
//	k1 200 remaining=1
//	k2 200 remaining=0
//	k3 429 remaining=0
//
// The retry of k1 gets the first decision's headers again and is charged
// nothing; k3 is refused because k1 and k2 used the quota.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// newHandler returns the example's handler: POST /charge, 2 per minute per
// client IP, idempotent retries. clock is nil for the system clock.
func newHandler(clock core.Clock) (http.Handler, error) {
	opts := []ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders)}
	if clock != nil {
		opts = append(opts, ratelimit.WithClock(clock))
	}
	limiter, err := ratelimit.New([]ratelimit.Layer{{
		Key:  ratelimit.MustClientIP(),
		Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute},
	}}, opts...)
	if err != nil {
		return nil, err
	}
	idem, err := ratelimit.NewIdempotency(limiter, nil)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charge", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "charged (key %q)\n", r.Header.Get("Idempotency-Key"))
	})
	return idem.Handler(mux), nil
}

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	flag.Parse()
	h, err := newHandler(nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("idempotent: POST /charge, 2 per minute per client IP; retries with the same Idempotency-Key are charged once")
	log.Fatal(srv.ListenAndServe())
}
