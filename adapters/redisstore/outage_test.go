package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestClusterOutageStaysLocal stops one master of a three-master Cluster
// and checks that every decision for a key on the two healthy masters
// still succeeds, while the stopped master's keys fail and open that
// master's breaker alone.
func TestClusterOutageStaysLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starting a cluster takes 2 s")
	}
	nodes := redistest.StartCluster(t)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
		// Let the healthy masters serve their slots once the stopped one
		// is marked failed (Redis's default stops the whole Cluster).
		redistest.Do(t, n.Addr(), "CONFIG", "SET", "cluster-require-full-coverage", "no")
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRedirects: 1})
	t.Cleanup(func() { client.Close() })
	s := newStore(t, client, &Config{Timeout: 200 * time.Millisecond, Breaker: &BreakerConfig{Failures: 3, OpenFor: time.Minute}})
	ctx := context.Background()
	p := mustPolicy(t, core.Rule{Name: "p", Limit: 1 << 20, Window: time.Hour})
	dead := nodes[0].Addr()
	var healthyKeys, deadKeys []string
	for i := 0; len(healthyKeys) < 20 || len(deadKeys) < 10; i++ {
		key := fmt.Sprint("k", i)
		c, err := client.MasterForKey(ctx, redisKey(s.prefix, "p", "", &core.Request{Key: key}))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr == dead {
			deadKeys = append(deadKeys, key)
		} else {
			healthyKeys = append(healthyKeys, key)
		}
	}
	// A second layer whose record of one key is on a healthy master: a
	// batch of it and a key on the stopped master spans both, and its
	// failure is the stopped master's alone.
	u := mustPolicy(t, core.Rule{Name: "u", Limit: 1 << 20, Window: time.Hour})
	var userKey string
	for i := 0; userKey == ""; i++ {
		key := fmt.Sprint("user", i)
		c, err := client.MasterForKey(ctx, redisKey(s.prefix, "u", "", &core.Request{Key: key}))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr != dead {
			userKey = key
		}
	}
	var out [2]core.Decision
	decide := func(key string) error {
		return s.Take(ctx, time.Now(), []core.Request{{Policy: p, Key: key, Cost: 1}}, out[:1])
	}
	for _, k := range append(append([]string(nil), healthyKeys...), deadKeys...) {
		if err := decide(k); err != nil {
			t.Fatal(err)
		}
	}
	nodes[0].Stop()
	// Batches spanning the stopped master and a healthy one, enough to
	// open a breaker: the stopped master's.
	for i := 0; i < 4; i++ {
		spread := []core.Request{{Policy: p, Key: deadKeys[i], Cost: 1}, {Policy: u, Key: userKey, Cost: 1}}
		if err := s.Take(ctx, time.Now(), spread, out[:]); err == nil {
			t.Fatal("a batch with a key on the stopped master succeeded")
		}
	}
	var healthyFailed, deadFailed, deadDecisions, decisions int
	for round := 0; round < 10; round++ {
		// Consecutive failures on the stopped master, enough to open a
		// breaker, then the healthy keys.
		for i := 0; i < 4; i++ {
			deadDecisions++
			if err := decide(deadKeys[(round+i)%len(deadKeys)]); err != nil {
				deadFailed++
			}
		}
		// the user layer's key alone, on its healthy master
		decisions++
		if err := s.Take(ctx, time.Now(), []core.Request{{Policy: u, Key: userKey, Cost: 1}}, out[:1]); err != nil {
			healthyFailed++
			t.Errorf("the user layer's key alone, on a healthy master: %v", err)
		}
		for _, k := range healthyKeys {
			decisions++
			if err := decide(k); err != nil {
				healthyFailed++
				if healthyFailed == 1 {
					t.Errorf("healthy key %q: %v", k, err)
				}
			}
		}
	}
	if healthyFailed != 0 {
		t.Fatalf("%d of %d decisions for keys on healthy masters failed", healthyFailed, decisions)
	}
	if deadFailed != deadDecisions {
		t.Fatalf("%d of %d decisions for keys on the stopped master failed, want all", deadFailed, deadDecisions)
	}
	if err := decide(deadKeys[0]); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("stopped master's key: err = %v, want ErrUnavailable (its breaker open)", err)
	}
	states := s.NodeStates()
	for addr, st := range states {
		want := BreakerClosed
		if addr == dead {
			want = BreakerOpen
		}
		if st != want {
			t.Errorf("breaker of %s: %v, want %v (all: %v)", addr, st, want, states)
		}
	}
	if s.State() != BreakerOpen {
		t.Fatalf("State() = %v, want open (the worst)", s.State())
	}
}
