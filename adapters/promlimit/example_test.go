package promlimit_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/promlimit"
	"github.com/limitry/ratelimit/core"
)

// exampleClock makes the examples' output independent of the time they run.
func exampleClock() *core.FakeClock {
	return core.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// get sends n GET / requests from remoteAddr through h.
func get(h http.Handler, remoteAddr string, n int) {
	for range n {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remoteAddr
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
}

// scrape serves /metrics from g and prints the lines starting with one of
// prefixes.
func scrape(g prometheus.Gatherer, prefixes ...string) {
	w := httptest.NewRecorder()
	promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(w.Body)
	for sc.Scan() {
		for _, p := range prefixes {
			if strings.HasPrefix(sc.Text(), p) {
				fmt.Println(sc.Text())
			}
		}
	}
}

var noop = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// Metrics for a limiter with two layers. The third request from 192.0.2.1
// is refused by the per-ip layer; the login layer allowed it but was not
// charged, so it counts as not_charged.
func ExampleNew() {
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer, served by promhttp.Handler()
	metrics, err := promlimit.New(reg)
	if err != nil {
		panic(err)
	}
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 2, Window: time.Minute}},
		{Key: ratelimit.Global("all"), Rule: core.Rule{Name: "global", Limit: 100, Window: time.Minute}},
	}, ratelimit.WithObserver(metrics), ratelimit.WithClock(exampleClock())))
	get(limiter.Handler(noop), "192.0.2.1:1234", 3)

	scrape(reg, "ratelimit_decisions_total")
	// Output:
	// ratelimit_decisions_total{outcome="allowed",rule="global"} 2
	// ratelimit_decisions_total{outcome="allowed",rule="per-ip"} 2
	// ratelimit_decisions_total{outcome="denied",rule="global"} 0
	// ratelimit_decisions_total{outcome="denied",rule="per-ip"} 1
	// ratelimit_decisions_total{outcome="dry_run_denied",rule="global"} 0
	// ratelimit_decisions_total{outcome="dry_run_denied",rule="per-ip"} 0
	// ratelimit_decisions_total{outcome="not_charged",rule="global"} 1
	// ratelimit_decisions_total{outcome="not_charged",rule="per-ip"} 0
}

// Must suits metrics set up at program start; registering the same metrics
// twice on one registry is an error, which Must turns into a panic.
func ExampleMust() {
	reg := prometheus.NewRegistry()
	promlimit.Must(promlimit.New(reg))

	_, err := promlimit.New(reg)
	fmt.Println(err != nil)
	// Output:
	// true
}

// A memory store shared by the limiters of a program, with its size
// exported and its evictions counted by rule.
func ExampleMetrics_SetMemoryStore() {
	reg := prometheus.NewRegistry()
	metrics := promlimit.Must(promlimit.New(reg))
	store := core.MustMemoryStore(&core.MemoryConfig{Capacity: 64, Shards: 1, Observer: metrics})
	metrics.SetMemoryStore(store)

	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Hour}},
	}, ratelimit.WithStore(store), ratelimit.WithObserver(metrics), ratelimit.WithClock(exampleClock())))
	h := limiter.Handler(noop)
	for i := range 70 { // 70 clients, 64 keys of room
		get(h, fmt.Sprintf("198.51.100.%d:1234", i), 1)
	}

	scrape(reg, "ratelimit_memory_store", "ratelimit_evictions_total")
	// Output:
	// ratelimit_evictions_total{rule="per-ip"} 6
	// ratelimit_memory_store_capacity 64
	// ratelimit_memory_store_keys 64
}

// Coarser latency buckets, for a limiter whose store is Redis.
func ExampleWithBuckets() {
	reg := prometheus.NewRegistry()
	metrics := promlimit.Must(promlimit.New(reg, promlimit.WithBuckets(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)))
	limiter := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 5, Window: time.Minute}},
	}, ratelimit.WithObserver(metrics), ratelimit.WithClock(exampleClock())))
	get(limiter.Handler(noop), "192.0.2.1:1234", 1)

	scrape(reg, "ratelimit_decision_duration_seconds_bucket")
	// Output:
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.0005"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.001"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.0025"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.005"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.01"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="0.05"} 1
	// ratelimit_decision_duration_seconds_bucket{rule="per-ip",le="+Inf"} 1
}
