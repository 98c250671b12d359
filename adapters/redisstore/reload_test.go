package redisstore

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestSetRulesOverRedis reloads a Limiter whose state is in Redis: the next
// response shows the new limit with the earlier requests still counted,
// for every algorithm, and two instances sharing the Redis agree.
func TestSetRulesOverRedis(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	for _, alg := range core.Algorithms() {
		t.Run(alg.Name(), func(t *testing.T) {
			clock := core.NewFakeClock(time.Unix(1_800_000_000, 0))
			prefix := uniquePrefix(t)
			burst := func(n int64) int64 {
				if alg == core.TokenBucket || alg == core.LeakyBucket {
					return n
				}
				return 0
			}
			var ls []*ratelimit.Limiter
			var hs []http.Handler
			for range 2 {
				l := ratelimit.Must(ratelimit.New([]ratelimit.Layer{{
					Key:  ratelimit.MustClientIP(),
					Rule: core.Rule{Name: "per-ip", Algorithm: alg, Limit: 5, Window: 10 * time.Minute, Burst: burst(5)},
				}}, ratelimit.WithClock(clock), ratelimit.WithStore(newStore(t, client, &Config{Prefix: prefix, ClientTime: true}))))
				ls = append(ls, l)
				hs = append(hs, l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			}
			do := func(i int) *httptest.ResponseRecorder {
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = "192.0.2.1:1"
				w := httptest.NewRecorder()
				hs[i].ServeHTTP(w, r)
				return w
			}
			for i := range 3 {
				if c := do(i % 2).Code; c != 200 {
					t.Fatalf("request %d: %d", i, c)
				}
			}
			for _, l := range ls {
				if err := l.SetRules(map[string]core.Rule{"per-ip": {Algorithm: alg, Limit: 10, Window: 10 * time.Minute, Burst: burst(10)}}); err != nil {
					t.Fatal(err)
				}
			}
			for i, want := range []string{"6", "5"} {
				w := do(i)
				if w.Header().Get("X-RateLimit-Limit") != "10" || w.Header().Get("X-RateLimit-Remaining") != want {
					t.Fatalf("instance %d after the reload: limit %s remaining %s, want limit 10 remaining %s", i, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"), want)
				}
			}
		})
	}
}
