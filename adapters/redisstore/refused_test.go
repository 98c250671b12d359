package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Commands the server refuses inside the script: each refusal is an error
// of the decision, never read as a missing key or let through.

var refusedAlgorithms = []core.Algorithm{core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowLog, core.SlidingWindowCounter}

// TestReadDeniedByACL: a user whose ACL lets it run scripts and write but
// not read (NOPERM on GET or LINDEX) gets an error for every decision: a
// refused read taken for a missing key would give every request a fresh
// quota.
func TestReadDeniedByACL(t *testing.T) {
	srv := redistest.Start(t)
	admin := newClient(t, srv.Addr())
	ctx := context.Background()
	for i, deny := range []string{"-get", "-@read"} {
		t.Run(deny, func(t *testing.T) {
			user := "limiter" + strconv.Itoa(i)
			if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", deny).Err(); err != nil {
				t.Fatal(err)
			}
			s := newStore(t, newClient(t, srv.Addr(), func(o *redis.Options) { o.Username, o.Password = user, "pw" }),
				&Config{Breaker: &BreakerConfig{Failures: 1 << 30}})
			for _, alg := range refusedAlgorithms {
				p := mustPolicy(t, core.Rule{Name: "acl-" + alg.Name(), Algorithm: alg, Limit: 2, Window: time.Hour})
				for j := range 4 {
					reqs := []core.Request{{Policy: p, Key: "k", Cost: 1}}
					var out [1]core.Decision
					err := s.Take(ctx, time.Now(), reqs, out[:])
					if err == nil {
						t.Fatalf("%s: take %d decided (%+v) though the user cannot read its record", alg.Name(), j, out[0])
					}
					if err := s.Peek(ctx, time.Now(), reqs, out[:]); err == nil {
						t.Fatalf("%s: peek %d decided (%+v) though the user cannot read its record", alg.Name(), j, out[0])
					}
				}
			}
		})
	}
}

// TestOutOfMemoryRefusesWrites: a Redis full under maxmemory-policy
// noeviction refuses every charge, for every algorithm,
// a new key's first charge and a record replaced by another policy's
// included, and leaves every key as it was: Redis refuses a script's
// writes only at its first, so that write must be one that may grow
// memory.
func TestOutOfMemoryRefusesWrites(t *testing.T) {
	srv := redistest.Start(t)
	admin := newClient(t, srv.Addr())
	ctx := context.Background()
	s := newStore(t, newClient(t, srv.Addr()), &Config{Breaker: &BreakerConfig{Failures: 1 << 30}})
	policy := func(alg core.Algorithm, limit int64) *core.Policy {
		return mustPolicy(t, core.Rule{Name: "oom-" + alg.Name(), Algorithm: alg, Limit: limit, Window: time.Hour})
	}
	// A record of each algorithm's policy under another identity, written
	// before the server fills: the next charge converts and replaces it.
	for _, alg := range refusedAlgorithms {
		var out [1]core.Decision
		if err := s.Take(ctx, time.Now(), []core.Request{{Policy: policy(alg, 5), Key: "old", Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
			t.Fatalf("%s: %v %+v", alg.Name(), err, out[0])
		}
	}
	held := map[string]string{}
	keys, err := admin.Keys(ctx, s.prefix+"*").Result()
	if err != nil || len(keys) != len(refusedAlgorithms) {
		t.Fatalf("records before the server fills: %v (%v)", keys, err)
	}
	for _, key := range keys {
		held[key] = admin.Dump(ctx, key).Val()
	}
	fillServer(t, admin)
	for _, alg := range refusedAlgorithms {
		for _, tc := range []struct {
			name string
			reqs []core.Request
		}{
			{"new key", []core.Request{{Policy: policy(alg, 2), Key: "new", Cost: 1}}},
			{"replaced record", []core.Request{{Policy: policy(alg, 2), Key: "old", Cost: 1}}},
			{"batch", []core.Request{{Policy: policy(alg, 2), Key: "new2", Cost: 1}, {Policy: policy(core.FixedWindow, 2), Key: "new3", Cost: 1}}},
		} {
			out := make([]core.Decision, len(tc.reqs))
			err := s.Take(ctx, time.Now(), tc.reqs, out)
			if err != nil && !strings.Contains(err.Error(), "OOM") {
				t.Errorf("%s, %s: %v; want the server's OOM error", alg.Name(), tc.name, err)
			}
			if err == nil && out[0].Allowed {
				// A refusal writes nothing (a conversion is stored only
				// with a charge), so the server lets it through.
				t.Errorf("%s, %s: admitted on a full server: %+v", alg.Name(), tc.name, out)
			}
		}
	}
	keys, err = admin.Keys(ctx, s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(held) {
		t.Errorf("keys after the refused charges: %v; want only the %d records written before", keys, len(held))
	}
	for key, was := range held {
		if v, err := admin.Dump(ctx, key).Result(); err != nil || v != was {
			t.Errorf("%s changed under OOM (%v)", key, err)
		}
	}
}

// fillServer fills the server of admin, then gives it a maxmemory below
// what it uses, under noeviction: over the limit whatever the next write's
// size.
func fillServer(t *testing.T, admin *redis.Client) {
	t.Helper()
	ctx := context.Background()
	filler := strings.Repeat("x", 16<<10)
	for i := range 64 {
		if err := admin.Set(ctx, "filler:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	used, err := strconv.Atoi(redistest.ParseInfo(admin.Info(ctx, "memory").Val())["used_memory"])
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", strconv.Itoa(used-512<<10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a write to the full server: %v, want OOM", err)
	}
}

// TestOutOfMemoryBatchBehindLog: on a full noeviction server, a batch
// whose first request is a sliding log that drops expired entries, or
// merges its charge into the newest entry, writes first what Redis
// refuses: the batch fails, and the new key of its next request is not
// written. So do in-flight slots for new keys.
func TestOutOfMemoryBatchBehindLog(t *testing.T) {
	srv := redistest.Start(t)
	admin := newClient(t, srv.Addr())
	ctx := context.Background()
	s := newStore(t, newClient(t, srv.Addr()), &Config{ClientTime: true, Breaker: &BreakerConfig{Failures: 1 << 30}})
	log := mustPolicy(t, core.Rule{Name: "global", Algorithm: core.SlidingWindowLog, Limit: 100, Window: time.Second})
	ip := mustPolicy(t, core.Rule{Name: "ip", Limit: 10, Window: time.Minute})
	t0 := time.Unix(1_800_000_000, 0)
	var one [1]core.Decision
	if err := s.Take(ctx, t0, []core.Request{{Policy: log, Key: "all", Cost: 1}}, one[:]); err != nil || !one[0].Allowed {
		t.Fatal(err, one[0])
	}
	slots, err := NewInFlight(newClient(t, srv.Addr()), &InFlightConfig{Prefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slots.Close() })
	fillServer(t, admin)
	keys := admin.DBSize(ctx).Val()
	for _, at := range []time.Time{t0, t0.Add(2 * time.Second)} { // merged into the newest entry; after it expired
		out := make([]core.Decision, 2)
		err := s.Take(ctx, at, []core.Request{{Policy: log, Key: "all", Cost: 1}, {Policy: ip, Key: "203.0.113.7", Cost: 1}}, out)
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("at %v: %v, %+v; want the server's OOM error", at.Sub(t0), err, out)
		}
	}
	for i := range 5 {
		var out [1]core.SlotDecision
		if release, err := slots.Acquire(ctx, []core.SlotRequest{{Name: "conc", Key: "client" + strconv.Itoa(i), Limit: 2}}, out[:]); err == nil {
			release()
			t.Errorf("a slot for a new key acquired on a full server: %+v", out[0])
		}
	}
	if n := admin.DBSize(ctx).Val(); n != keys {
		t.Errorf("keys on the full server: %d, then %d", keys, n)
	}
}
