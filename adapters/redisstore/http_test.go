package redisstore_test

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestMain gives the examples a Redis server (a private one, or
// REDIS_ADDR's), so that they check their Output, and skips them when
// there is none (failing under CI instead, as the tests do). It fails the
// package's tests if a goroutine outlives them: the store's abandoned-call
// goroutines, the clients and the test servers must all be gone once
// every test has cleaned up.
// redisExamplesPattern names the examples whose Output needs the Redis
// server at redisAddr, skipped when there is none
// (TestRedisExamplesPatternComplete checks that it names them all).
const redisExamplesPattern = "^(Example|Example_layered|ExampleNewInFlight|ExampleConfig_pipeline)$"

func TestMain(m *testing.M) {
	flag.Parse()
	addr, stop, skip, err := redistest.ForMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if skip != "" {
		fmt.Fprintln(os.Stderr, "redisstore: skipping the examples that need Redis:", skip)
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			f.Value.Set(redisExamplesPattern)
		}
	} else {
		redisAddr = addr
	}
	code := 0
	func() {
		defer stop2(stop)
		code = m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func stop2(stop func()) {
	if stop != nil {
		stop()
	}
}

// TestExactAdmissionOverHTTPSharedRedis runs three middleware instances,
// each with its own client and Store, behind three HTTP servers sharing one
// Redis, on a frozen clock (client time). 64 concurrent clients spread over
// the servers get exactly the capacity in 200s, for every algorithm.
func TestExactAdmissionOverHTTPSharedRedis(t *testing.T) {
	addr := redistest.Server(t)
	const instances, clients, each, capacity = 3, 64, 4, 100
	t0 := time.Unix(1_800_000_000, 0)
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			rule := core.Rule{Name: "exact-" + alg.Name(), Algorithm: alg, Limit: capacity, Window: time.Hour}
			if alg == core.LeakyBucket {
				rule.Burst = capacity
			}
			prefix := fmt.Sprintf("rlhttp:%d:", time.Now().UnixNano())
			var urls []string
			for i := 0; i < instances; i++ {
				client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32, MaxRetries: -1})
				t.Cleanup(func() { client.Close() })
				store, err := redisstore.New(client, &redisstore.Config{Prefix: prefix, ClientTime: true, Timeout: 10 * time.Second, Breaker: &redisstore.BreakerConfig{Disabled: true}})
				if err != nil {
					t.Fatal(err)
				}
				l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Global("all"), Rule: rule}},
					ratelimit.WithStore(store), ratelimit.WithClock(core.NewFakeClock(t0)), ratelimit.WithFailClosed()))
				srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
				t.Cleanup(srv.Close)
				urls = append(urls, srv.URL)
			}
			var codes [600]atomic.Int64
			var wg sync.WaitGroup
			tr := &http.Transport{MaxIdleConnsPerHost: clients}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						resp, err := hc.Get(urls[(c+i)%instances])
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						codes[resp.StatusCode].Add(1)
					}
				}()
			}
			wg.Wait()
			if ok, refused := codes[200].Load(), codes[429].Load(); ok != capacity || ok+refused != clients*each {
				t.Fatalf("%d instances, %d clients x %d requests: %d OK, %d refused, %d other; want exactly %d OK",
					instances, clients, each, ok, refused, clients*each-ok-refused, capacity)
			}
		})
	}
}
