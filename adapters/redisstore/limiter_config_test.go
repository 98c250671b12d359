package redisstore_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/adapters/redisstore"
	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

type customAlgorithm struct{ core.Algorithm }

func (customAlgorithm) Name() string { return "custom" }

// TestLimiterRefusesRulesRedisCannotDecide checks that a rule the Redis
// store cannot decide (a custom algorithm, a Window that is not whole
// microseconds) is refused when the Limiter is built or its rules change,
// with or without a Fallback, instead of failing every request (served
// fail-open, unlimited).
func TestLimiterRefusesRulesRedisCannotDecide(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Server(t), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	n := 0 // a key of its own for each case
	for _, fallback := range []bool{false, true} {
		cfg := &redisstore.Config{Prefix: "limcfg:" + t.Name() + ":"}
		if fallback {
			cfg.Fallback = core.MustMemoryStore(nil)
		}
		s, err := redisstore.New(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lease, err := redisstore.NewLeaseStore(s, &redisstore.LeaseConfig{Size: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, store := range []core.Store{s, lease} {
			n++
			for _, r := range []core.Rule{
				{Name: "api", Algorithm: customAlgorithm{core.TokenBucket}, Limit: 2, Window: time.Minute},
				{Name: "api", Limit: 2, Window: time.Second / 3},
			} {
				_, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Global("all"), Rule: r}}, ratelimit.WithStore(store))
				if !errors.Is(err, core.ErrUnsupportedPolicy) || !strings.HasPrefix(err.Error(), `ratelimit: layer "api": redisstore: `) {
					t.Errorf("fallback %v, %T: New with %+v: %v", fallback, store, r, err)
				}
				l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.Global(fmt.Sprint("k", n, r.Window)), Rule: core.PerMinute(2).Named("api")}}, ratelimit.WithStore(store), ratelimit.WithLogger(nil))
				if err != nil {
					t.Fatal(err)
				}
				if err := l.SetRules(map[string]core.Rule{"api": r}); !errors.Is(err, core.ErrUnsupportedPolicy) {
					t.Errorf("fallback %v, %T: SetRules to %+v: %v", fallback, store, r, err)
				}
				h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
				codes := ""
				for range 3 {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
					codes += http.StatusText(w.Code) + ";"
				}
				if codes != "OK;OK;Too Many Requests;" {
					t.Errorf("fallback %v, %T: after the refused SetRules: %s", fallback, store, codes)
				}
			}
		}
	}
}
