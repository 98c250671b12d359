// Command layered serves GET / and POST /login behind one Limiter whose
// layers are decided together: 10 requests per minute per client IP, 3 per
// minute per user, and for POST /login only, 2 per minute per client IP. A
// toy authentication middleware maps "Authorization: Bearer <name>" to the
// user <name>; anonymous requests meet no per-user layer. A request refused
// by one layer charges none: a login refused by the login limit uses up none
// of the per-IP quota.
//
//	go run ./examples/layered -addr 127.0.0.1:8080
//	for i in 1 2 3 4; do curl -si -H 'Authorization: Bearer alice' http://127.0.0.1:8080/ | grep -i -e ^HTTP -e ^ratelimit -e ^retry; done
//	curl -si http://127.0.0.1:8080/ | grep -i -e ^HTTP -e ^ratelimit
//	for i in 1 2 3; do curl -si -X POST http://127.0.0.1:8080/login | grep -i -e ^HTTP -e ^ratelimit; done
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

	mux := http.NewServeMux()
	ip := ratelimit.MustClientIP()
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ip, Rule: core.PerMinute(10).Named("per-ip")},
		{Key: ratelimit.User(), Rule: core.PerMinute(3).Named("per-user")},
		// Only for POST /login: the Limiter wraps the whole mux, and
		// WithServeMux lets it ask the mux for the route before routing.
		{Key: ratelimit.Composite(ratelimit.Route(), ip), Rule: core.PerMinute(2).Named("login"), Routes: []string{"POST /login"}},
	}, ratelimit.WithServeMux(mux), ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithProblemDetails()))

	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if user, ok := ratelimit.UserFromContext(r.Context()); ok {
			fmt.Fprintf(w, "hello, %s\n", user)
			return
		}
		fmt.Fprintln(w, "hello, stranger")
	})
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "logged in (not really)")
	})

	// The authentication middleware runs before the limiter, so the
	// per-user layer sees the user.
	srv := &http.Server{
		Addr:              *addr,
		Handler:           toyAuth(limiter.Handler(mux)),
		ReadHeaderTimeout: 5 * time.Second,
	}
	log.Printf("layered: 10/min per IP, 3/min per user, POST /login 2/min per IP; try: curl -si -H 'Authorization: Bearer alice' %s", url(*addr))
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
