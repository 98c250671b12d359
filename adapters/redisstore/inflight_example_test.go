package redisstore_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// Concurrency limits shared by a fleet: every process using the same Redis
// and Prefix counts the same slots. A held slot is renewed while its
// request runs and expires 30 s after a process dies.
func ExampleNewInFlight() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	slots, err := redisstore.NewInFlight(client, &redisstore.InFlightConfig{Prefix: "example-inflight:"})
	if err != nil {
		panic(err)
	}
	defer slots.Close()
	l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{
		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
	}, ratelimit.WithSlotStore(slots)))

	r := httptest.NewRequest(http.MethodGet, "/slow", nil)
	for i := 1; i <= 3; i++ {
		rec := httptest.NewRecorder()
		ok, done := l.AdmitFunc(rec, r) // as if the first two were still running
		defer done()
		fmt.Printf("request %d: admitted %v, status %d\n", i, ok, rec.Code)
	}
	// Output:
	// request 1: admitted true, status 200
	// request 2: admitted true, status 200
	// request 3: admitted false, status 429
}
