package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
)

// TestWindowKeepsExpiry checks that on the server's clock a fixed window's
// record charged again within its window keeps the expiry that the
// window's first charge set (one SET with KEEPTTL instead of one with PX),
// and that in ClientTime mode every charge sets the expiry from the
// caller's time. An expiry moved by hand between the two charges tells
// them apart.
func TestWindowKeepsExpiry(t *testing.T) {
	client := newClient(t, redistest.Server(t))
	ctx := context.Background()
	info, err := client.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info, "redis_version:6.") || strings.Contains(info, "redis_version:5.") {
		t.Skip("Redis 6 and earlier: records are written with PX on every charge")
	}
	p := mustPolicy(t, core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 100, Window: 24 * time.Hour})
	const moved = 48 * time.Hour
	for _, clientTime := range []bool{false, true} {
		s := newStore(t, client, &Config{ClientTime: clientTime})
		now := time.Unix(1_800_000_000, 0) // ClientTime's: an hour into a window
		take := func(key string) {
			t.Helper()
			var out [1]core.Decision
			if err := s.Take(ctx, now, []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
				t.Fatalf("ClientTime %v: %+v %v", clientTime, out[0], err)
			}
		}
		day := func() int64 {
			tm, err := client.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			return tm.Unix() / 86400
		}
		for attempt := 0; ; attempt++ {
			key := "k" + string(rune('a'+attempt))
			rk := redisKey(s.prefix, p.Name(), "", &core.Request{Key: key})
			before := day()
			take(key)
			if ttl := client.PTTL(ctx, rk).Val(); ttl <= 0 || ttl > 24*time.Hour+ClientTimeSlack {
				t.Fatalf("ClientTime %v: the first charge set a PTTL of %v", clientTime, ttl)
			}
			if err := client.PExpire(ctx, rk, moved).Err(); err != nil {
				t.Fatal(err)
			}
			take(key)
			ttl := client.PTTL(ctx, rk).Val()
			if !clientTime && day() != before {
				continue // the server's window ended between the charges
			}
			if kept := ttl > moved-time.Hour; kept == clientTime {
				t.Errorf("ClientTime %v: after a second charge in the window, PTTL %v (the expiry was moved to %v)", clientTime, ttl, moved)
			}
			if v := client.Get(ctx, rk).Val(); !strings.HasPrefix(v, "f:") || !strings.Contains(v, ":2;") {
				t.Errorf("ClientTime %v: record %q after two charges", clientTime, v)
			}
			break
		}
	}
}
