// Command layered serves GET / behind two layers decided together: 10
// requests per minute per client IP and 3 per minute per user. A toy
// authentication middleware maps "Authorization: Bearer <name>" to the user
// <name>; anonymous requests meet only the per-IP layer. A request refused by
// one layer charges neither.
//
//	go run ./examples/layered -addr 127.0.0.1:8080
//	for i in 1 2 3 4; do curl -si -H 'Authorization: Bearer alice' http://127.0.0.1:8080/ | grep -i -e ^HTTP -e ^ratelimit -e ^retry; done
//	curl -si http://127.0.0.1:8080/ | grep -i -e ^HTTP -e ^ratelimit
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	flag.Parse()

	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(3).Named("per-user")},
	}, ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithProblemDetails()))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if user, ok := ratelimit.UserFromContext(r.Context()); ok {
			fmt.Fprintf(w, "hello, %s\n", user)
			return
		}
		fmt.Fprintln(w, "hello, stranger")
	})

	// The authentication middleware runs before the limiter, so the
	// per-user layer sees the user.
	srv := &http.Server{
		Addr:              *addr,
		Handler:           toyAuth(limiter.Handler(mux)),
		ReadHeaderTimeout: 5 * time.Second,
	}
	log.Printf("layered: 10/min per IP, 3/min per user; try: curl -si -H 'Authorization: Bearer alice' %s", url(*addr))
	log.Fatal(srv.ListenAndServe())
}

// toyAuth trusts any "Authorization: Bearer <name>" and makes <name> the
// request's user. It only stands in for real authentication: never accept
// unverified identities in a real service.
func toyAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			if name = strings.TrimSpace(name); name != "" {
				r = r.WithContext(ratelimit.WithUser(r.Context(), name))
			}
		}
		next.ServeHTTP(w, r)
	})
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
