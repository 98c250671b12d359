package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// slowlogMicros runs f on a server of its own and returns the longest
// command time SLOWLOG recorded for it, in microseconds.
func slowlogMicros(t *testing.T, client *redis.Client, f func()) int64 {
	t.Helper()
	ctx := context.Background()
	if err := client.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	client.SlowLogReset(ctx)
	f()
	logs, err := client.SlowLogGet(ctx, 128).Result()
	if err != nil {
		t.Fatal(err)
	}
	var worst int64
	for _, l := range logs {
		if len(l.Args) > 0 && (l.Args[0] == "evalsha" || l.Args[0] == "eval") {
			if us := l.Duration.Microseconds(); us > worst {
				worst = us
			}
		}
	}
	return worst
}

// fillLog writes a sliding log of n entries, one unit each, 1ms apart from
// start, under policy p at key, as the script writes it.
func fillLog(t *testing.T, client *redis.Client, key string, p *core.Policy, start time.Time, n int) {
	t.Helper()
	ctx := context.Background()
	tag := identityTag('l', uint64(p.Limit()), uint64(p.Window()/time.Microsecond), uint64(p.Capacity()))
	client.Del(ctx, key)
	if err := client.RPush(ctx, key, "0;"+tag).Err(); err != nil {
		t.Fatal(err)
	}
	us := start.UnixMicro()
	const batch = 10000
	for i := 0; i < n; i += batch {
		args := make([]any, 0, batch)
		for j := i; j < i+batch && j < n; j++ {
			args = append(args, fmt.Sprintf("%d:1:%d", us+int64(j)*1000, j+1))
		}
		if err := client.RPush(ctx, key, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlidingLogBoundedWork builds a 200,000-entry sliding log and
// measures, with SLOWLOG, the server time of the decisions that used to
// walk it: the whole log just expired, half of it expired, and a refusal
// whose Retry-After lies deep in the log. Each must take under 1 ms of
// server time (the test allows 2 ms at the best of up to five runs, a
// margin for a loaded machine); the log walked one chunk at a time took
// 174 ms.
func TestSlidingLogBoundedWork(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 200,000-entry log")
	}
	addr := redistest.Start(t).Addr()
	client := newClient(t, addr)
	s := newStore(t, client, &Config{ClientTime: true})
	const n = 200_000
	p := mustPolicy(t, core.Rule{Name: "log", Algorithm: core.SlidingWindowLog, Limit: n, Window: time.Hour})
	if err := s.Warm(context.Background()); err != nil { // compile the script outside the measure
		t.Fatal(err)
	}
	key := s.prefix + "log:k"
	start := storetest.T0
	last := start.Add(time.Duration(n-1) * time.Millisecond)
	const limit = 2000 // microseconds: 1 ms measured, with a margin for a loaded machine
	for _, c := range []struct {
		name  string
		at    time.Time
		allow bool
	}{
		{"all expired", last.Add(time.Hour), true},
		{"half expired", start.Add(time.Hour + time.Duration(n/2)*time.Millisecond), true},
		{"full: refused", last, false},
	} {
		// SLOWLOG counts wall time, which a busy machine inflates when it
		// preempts the server mid-command: the least of up to five runs
		// measures the work. Walking the log would exceed the limit on
		// every run, by two orders of magnitude.
		best := int64(-1)
		for run := 0; run < 5 && (best < 0 || best > limit); run++ {
			fillLog(t, client, key, p, start, n)
			var d core.Decision
			us := slowlogMicros(t, client, func() { d = take(t, s, c.at, p, "k", 1) })
			t.Logf("%s: %d us of server time (SLOWLOG)", c.name, us)
			if d.Allowed != c.allow {
				t.Fatalf("%s: %+v, want allowed=%v", c.name, d, c.allow)
			}
			if best < 0 || us < best {
				best = us
			}
		}
		if best > limit {
			t.Errorf("%s: %d us of server time at best of five runs, want under %d", c.name, best, limit)
		}
	}
	// The log is exact after the trim: half expired then one more.
	fillLog(t, client, key, p, start, n)
	at := start.Add(time.Hour + time.Duration(n/2)*time.Millisecond)
	// Entries 0 to n/2 expired: n/2-1 count, plus this one.
	if d := take(t, s, at, p, "k", 1); !d.Allowed || d.Remaining != n/2 {
		t.Fatalf("half expired: %+v, want %d remaining", d, n/2)
	}
	// At most 1,024 expired entries are dropped per charge.
	if l := client.LLen(context.Background(), key).Val(); l != 1+n-1024+1 {
		t.Fatalf("log length %d after trimming, want %d", l, 1+n-1024+1)
	}
	for i := 0; i < 100; i++ {
		if d := take(t, s, at, p, "k", 1); !d.Allowed || d.Remaining != n/2-1-int64(i) {
			t.Fatalf("charge %d after the trim: %+v, want %d remaining", i, d, n/2-1-i)
		}
	}
	if l := client.LLen(context.Background(), key).Val(); l != 1+n/2-1+1 {
		t.Fatalf("log length %d after trimming the rest, want %d", l, 1+n/2-1+1)
	}
}
