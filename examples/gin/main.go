// Command gin serves a gin router behind rate limits, with Prometheus
// metrics:
//
//   - GET /hello: 5 requests per 10 seconds per client IP (token bucket),
//     with every rate-limit header set.
//   - POST /login: 2 requests per minute per route and client IP, a quota of
//     its own, independent of /hello.
//   - GET /me: for a signed-in user only (Authorization: Bearer alice-token
//     or bob-token, a demo token table), 10 requests per minute per client
//     IP, then 3 per minute per user, the user taken from the gin context
//     where the authentication handler stored it; the body shows the user's
//     remaining quota. Without a known token it is answered 401.
//   - GET /metrics: Prometheus metrics, the limiter's among them
//     (ratelimit_decisions_total and others).
//
// Try it:
//
//	cd examples/gin && go run . -addr 127.0.0.1:8080
//	for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:8080/hello | grep -i -e ^HTTP -e ^x-ratelimit -e ^retry; done
//	for i in 1 2 3; do curl -si -X POST http://127.0.0.1:8080/login | grep -i -e ^HTTP -e ^retry; done
//	for i in 1 2 3 4; do curl -s -H 'Authorization: Bearer alice-token' http://127.0.0.1:8080/me; done
//	curl -s http://127.0.0.1:8080/metrics | grep ^ratelimit_decisions_total
//
// The client is the connecting peer (r.RemoteAddr), never c.ClientIP(): no
// proxy is trusted, so X-Forwarded-For is ignored. Behind a load balancer,
// pass its network to ratelimit.TrustedProxyCIDRs.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/ginlimit"
	"github.com/limitry/ratelimit/adapters/promlimit"
	"github.com/limitry/ratelimit/core"
)

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	flag.Parse()

	// Metrics, served by promhttp.Handler, and the memory store the
	// Limiter keeps its state in (its keys are namespaced by rule name).
	metrics := promlimit.Must(promlimit.New(prometheus.DefaultRegisterer))
	store := core.MustMemoryStore(&core.MemoryConfig{Observer: metrics})
	metrics.SetMemoryStore(store)
	common := []ratelimit.Option{
		ratelimit.WithHeaders(ratelimit.AllHeaders),
		ratelimit.WithStore(store),
		ratelimit.WithObserver(metrics),
	}
	clientIP := ratelimit.MustClientIP() // r.RemoteAddr: no proxy trusted

	// One Limiter for the whole router, its layers decided and charged in one
	// atomic batch: each layer applies only to its route, so /hello, /login
	// and /me have quotas of their own and /metrics none. /me is limited per
	// IP, then per user: a request refused by either charges neither.
	limits := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{
			Key:    clientIP,
			Rule:   core.Rule{Name: "hello", Algorithm: core.TokenBucket, Limit: 5, Window: 10 * time.Second},
			Routes: []string{"GET /hello"},
		},
		{
			Key:    ratelimit.Composite(ratelimit.Route(), clientIP),
			Rule:   core.Rule{Name: "login", Algorithm: core.TokenBucket, Limit: 2, Window: time.Minute},
			Routes: []string{"POST /login"},
		},
		{
			Key:    clientIP,
			Rule:   core.Rule{Name: "me-ip", Limit: 10, Window: time.Minute},
			Routes: []string{"GET /me"},
		},
		{
			Key:     ginlimit.Get("user"), // what authenticate stored with c.Set
			Rule:    core.Rule{Name: "me-user", Limit: 3, Window: time.Minute},
			Routes:  []string{"GET /me"},
			IfNoKey: ratelimit.NoKeyRefuse, // no user: 401, nothing charged
		},
	}, common...))

	r := gin.New()
	r.Use(gin.Logger(), gin.Recovery())
	// Authenticate first, so that the limiter sees the user; WithResult
	// lets /me read its decision from the request context.
	r.Use(authenticate, ginlimit.MiddlewareFor(r, limits, ginlimit.WithResult())) // gin has routed the request already
	// The limiter never reads c.ClientIP(); trusting no proxy makes it safe
	// for any handler that does.
	if err := r.SetTrustedProxies(nil); err != nil {
		log.Fatal(err)
	}
	r.GET("/hello", func(c *gin.Context) {
		c.String(http.StatusOK, "hello\n")
	})
	r.POST("/login", func(c *gin.Context) {
		c.String(http.StatusOK, "logged in (not really)\n")
	})
	r.GET("/me", func(c *gin.Context) {
		res, _ := ratelimit.ResultFromContext(c.Request.Context())
		for _, lr := range res.Layers {
			if lr.Decision.Policy.Name() == "me-user" {
				c.String(http.StatusOK, "%s: %d of %d requests left this minute\n",
					c.GetString("user"), lr.Decision.Remaining, lr.Decision.Limit)
				return
			}
		}
		c.String(http.StatusOK, "%s\n", c.GetString("user"))
	})
	r.GET("/metrics", gin.WrapH(promhttp.Handler()))

	srv := &http.Server{Addr: *addr, Handler: r, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("gin example: GET %shello (5/10s per IP), POST %slogin (2/min), GET %sme (3/min per user), GET %smetrics", url(*addr), url(*addr), url(*addr), url(*addr))
	log.Fatal(srv.ListenAndServe())
}

// demoUsers stands for an application's user store: bearer token to user.
var demoUsers = map[string]string{"alice-token": "alice", "bob-token": "bob"}

// authenticate stands for the application's own authentication handler: it
// stores the user of a known bearer token with c.Set, where ginlimit.Get
// finds it, and leaves anonymous requests alone.
func authenticate(c *gin.Context) {
	if token, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer "); ok {
		if user, ok := demoUsers[token]; ok {
			c.Set("user", user)
		}
	}
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
