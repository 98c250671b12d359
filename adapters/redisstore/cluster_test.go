package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestCRC16(t *testing.T) {
	// CRC-16/XMODEM check value, and slots given in the Redis Cluster
	// specification and documentation.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{
		"foo":                  12182,
		"bar":                  5061,
		"somekey":              11058,
		"{user1000}.following": slot("user1000"),
		"{user1000}.followers": slot("user1000"),
		"foo{}{bar}":           slot("foo{}{bar}"),
		"foo{{bar}}zap":        slot("{bar"),
		"foo{bar}{zap}":        slot("bar"),
	} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
	if hashTagOf("foo{}{bar}") != "foo{}{bar}" {
		t.Errorf("an empty tag must hash the whole key")
	}
}

// TestCluster runs the Cluster tests against one private 3-master cluster
// (about 2 s to start).
func TestCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	client := newClusterClient(t, addrs)
	ctx := context.Background()
	if err := client.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("KeySlot", func(t *testing.T) {
		// Our slots agree with the server's CLUSTER KEYSLOT.
		rng := rand.New(rand.NewPCG(3, 3))
		for i := 0; i < 200; i++ {
			key := randomKey(rng)
			want, err := client.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := slot(key); int64(got) != want {
				t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		// Without tags, layered batches span slots (check, charge, refund).
		storetest.Run(t, func(t *testing.T) core.Store {
			return newStore(t, client, &Config{ClientTime: true})
		})
	})

	t.Run("ConformanceTagged", func(t *testing.T) {
		// One tag for every key: every batch is one atomic call.
		storetest.Run(t, func(t *testing.T) core.Store {
			return newStore(t, client, &Config{ClientTime: true, HashTag: func(string, string) string { return "all" }})
		})
	})

	t.Run("Differential", func(t *testing.T) {
		runDifferential(t, client, []uint64{1, 3})
	})

	t.Run("DifferentialTagByKey", func(t *testing.T) {
		// Tagging by key: layers of one key share a slot, other layers do not.
		c := client
		t.Run("run", func(t *testing.T) {
			runDifferentialCfg(t, c, []uint64{2}, &Config{ClientTime: true, HashTag: TagByKey})
		})
	})

	t.Run("SpreadBatchGroups", func(t *testing.T) {
		s := newStore(t, client, &Config{ClientTime: true, HashTag: TagByKey})
		ip := mustPolicy(t, core.Rule{Name: "ip", Limit: 5, Window: time.Hour})
		burst := mustPolicy(t, core.Rule{Name: "burst", Limit: 2, Window: time.Second})
		user := mustPolicy(t, core.Rule{Name: "user", Limit: 3, Window: time.Hour})
		reqs := []core.Request{{Policy: ip, Key: "10.0.0.1"}, {Policy: burst, Key: "10.0.0.1"}, {Policy: user, Key: "bob"}}
		var keys [3]string
		infos := []*policyInfo{infoOf(ip), infoOf(burst), infoOf(user)}
		s.keysOf(reqs, infos, keys[:])
		if slot(keys[0]) != slot(keys[1]) {
			t.Fatalf("TagByKey: %q and %q on different slots", keys[0], keys[1])
		}
		gs := s.groups(keys[:])
		if len(gs) != 2 || len(gs[0]) != 2 || len(gs[1]) != 1 {
			t.Fatalf("groups = %v, want [[0 1] [2]]", gs)
		}
	})

	t.Run("SpreadBatchRefund", func(t *testing.T) {
		// State changes between the check and the charge of a batch spanning
		// slots: the user layer's charge is refused, and the ip layer, charged
		// already, is refunded exactly.
		for _, a := range core.Algorithms() {
			t.Run(a.Name(), func(t *testing.T) {
				s := newStore(t, client, &Config{ClientTime: true})
				ip := mustPolicy(t, withBurst(core.Rule{Name: "ip", Algorithm: a, Limit: 5, Window: time.Hour}))
				user := mustPolicy(t, withBurst(core.Rule{Name: "user", Algorithm: a, Limit: 2, Window: time.Hour}))
				at := storetest.T0.Add(90 * time.Minute)
				reqs := []core.Request{{Policy: ip, Key: "10.0.0.1", Cost: 1}, {Policy: user, Key: "bob", Cost: 1}}
				var keys [2]string
				s.keysOf(reqs, []*policyInfo{infoOf(ip), infoOf(user)}, keys[:])
				if slot(keys[0]) == slot(keys[1]) {
					t.Skip("keys share a slot")
				}
				take(t, s, at, ip, "10.0.0.1", 1) // ip: 4 left
				take(t, s, at, user, "bob", 1)    // user: 1 left
				before := snapshot(t, client, keys[0])
				// Another instance takes bob's last unit between the phases.
				s.betweenPhases = func() {
					s.betweenPhases = nil
					if d := take(t, s, at, user, "bob", 1); !d.Allowed {
						t.Errorf("interleaved request refused: %+v", d)
					}
				}
				var out [2]core.Decision
				if err := s.Take(ctx, at, reqs, out[:]); err != nil {
					t.Fatal(err)
				}
				if out[0].Allowed != true || out[1].Allowed || out[0].Remaining != 4 {
					t.Fatalf("batch refused by user: ip %+v, user %+v; want ip allowed with 4 left (uncharged), user refused", out[0], out[1])
				}
				if after := snapshot(t, client, keys[0]); after != before {
					t.Fatalf("ip state not restored by the refund:\nbefore %q\nafter  %q", before, after)
				}
				if d := take(t, s, at, ip, "10.0.0.1", 4); !d.Allowed || d.Remaining != 0 {
					t.Fatalf("ip after the refund: %+v, want 4 admitted", d)
				}
			})
		}
	})

	t.Run("SpreadBatchConcurrent", func(t *testing.T) {
		// Many goroutines, batches over three slots: exactly the ip's quota
		// is admitted, and each layer is charged exactly for the admitted.
		s := newStore(t, client, &Config{ClientTime: true})
		ip := mustPolicy(t, core.Rule{Name: "cip", Limit: 40, Window: time.Hour})
		user := mustPolicy(t, core.Rule{Name: "cuser", Limit: 25, Window: time.Hour})
		route := mustPolicy(t, core.Rule{Name: "croute", Algorithm: core.FixedWindow, Limit: 1000, Window: time.Hour})
		admitted := hammer(t, 48, 10, func(w, i int) bool {
			var out [3]core.Decision
			err := s.Take(ctx, storetest.T0, []core.Request{
				{Policy: ip, Key: "1.2.3.4", Cost: 1},
				{Policy: user, Key: fmt.Sprint("u", w%2), Cost: 1},
				{Policy: route, Key: "GET /", Cost: 1},
			}, out[:])
			return err == nil && out[0].Allowed && out[1].Allowed && out[2].Allowed
		})
		if admitted != 40 {
			t.Fatalf("admitted %d, want 40", admitted)
		}
		d := take(t, s, storetest.T0, route, "GET /", 1)
		if d.Remaining != 1000-41 {
			t.Fatalf("route layer charged for %d requests, want 40 admitted", 1000-d.Remaining-1)
		}
	})
}

func runDifferentialCfg(t *testing.T, client redis.UniversalClient, seeds []uint64, cfg *Config) {
	old := differentialConfig
	differentialConfig = cfg
	defer func() { differentialConfig = old }()
	runDifferential(t, client, seeds)
}

// snapshot returns a key's value (string or list) and nothing else: the
// expiry may differ after a refund.
func snapshot(t *testing.T, c redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	switch typ := c.Type(ctx, key).Val(); typ {
	case "string":
		return c.Get(ctx, key).Val()
	case "list":
		return strings.Join(c.LRange(ctx, key, 0, -1).Val(), ",")
	case "none":
		return ""
	default:
		t.Fatalf("key %q has type %s", key, typ)
		return ""
	}
}

func randomKey(rng *rand.Rand) string {
	const chars = "ab{}:%xyz0123"
	b := make([]byte, 1+rng.IntN(12))
	for i := range b {
		b[i] = chars[rng.IntN(len(chars))]
	}
	return string(b)
}

func withBurst(r core.Rule) core.Rule {
	if r.Algorithm == core.LeakyBucket {
		r.Burst = r.Limit
	}
	return r
}

// silentServer accepts connections and never answers. stop closes them
// (and the listener), so that reads waiting on them end; it is also
// called when the test ends, and may be called more than once. accepted
// returns the number of connections accepted so far.
func silentServer(t *testing.T) (addr string, stop func(), accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ln.Close()
			<-done
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		})
	}
	t.Cleanup(stop)
	accepted = func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
	return ln.Addr().String(), stop, accepted
}

// TestClusterSlotMapWithinTimeout: a Cluster client that has not loaded
// its slot map, facing nodes that never answer, costs a decision the
// store's Timeout, not the client's read timeout, and nothing once the slot
// map's breaker is open; the Fallback answers; with and without
// ContextTimeoutEnabled.
func TestClusterSlotMapWithinTimeout(t *testing.T) {
	for _, cte := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			addr, stop, accepted := silentServer(t)
			client := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:                 []string{addr},
				ContextTimeoutEnabled: cte,
				ReadTimeout:           20 * time.Second,
				MaxRetries:            -1,
			})
			t.Cleanup(func() {
				stop() // first: the reads of abandoned lookups end
				client.Close()
			})
			var rec errorRecorder
			s := newStore(t, client, &Config{
				Timeout:  50 * time.Millisecond,
				Breaker:  &BreakerConfig{Failures: 1, OpenFor: time.Minute},
				Fallback: core.MustMemoryStore(nil),
				Observer: &rec,
			})
			p := mustPolicy(t, core.Rule{Name: "c", Limit: 10, Window: time.Minute})
			for i := range 3 {
				start := time.Now()
				d := take(t, s, time.Now(), p, "k", 1)
				if el := time.Since(start); el > 10*time.Second || !d.Allowed {
					t.Fatalf("decision %d: %+v after %v, want the Fallback's admission within the 50ms Timeout (the read timeout is 20s)", i, d, el)
				}
			}
			if st := s.State(); st != BreakerOpen || s.NodeStates()[""] != BreakerOpen {
				t.Fatalf("breaker %v (nodes %v), want the slot map's open", st, s.NodeStates())
			}
			// While it is open, no lookup is made: no connection, no wait.
			conns := accepted()
			for range 5 {
				var out [1]core.Decision
				if err := s.Take(context.Background(), time.Now(), []core.Request{{Policy: p, Key: "k", Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
					t.Fatalf("with the breaker open: %+v %v, want the Fallback's admission", out[0], err)
				}
			}
			if n := accepted() - conns; n != 0 {
				t.Fatalf("with the breaker open, %d more connections to the silent Cluster", n)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.errs) == 0 {
				t.Fatal("the failures were not reported")
			}
		})
	}
}

// TestNodeBreakersDropped checks that a master's breaker that no decision
// has used for a whole sweep period of NodeStates (a master gone from the
// Cluster, or whose address changed, with its breaker open) is dropped, so
// that State does not report it open for good, and OnStateChange hears it
// close, while the breakers of the masters decisions use stay.
func TestNodeBreakersDropped(t *testing.T) {
	client := newClusterClient(t, redistest.Cluster(t))
	var tr transitions
	s := newStore(t, client, &Config{Breaker: &BreakerConfig{Failures: 1, OpenFor: time.Hour}, OnStateChange: tr.record})
	s.lastSweep.Store(time.Now().UnixNano()) // a sweep period begins
	p := mustPolicy(t, core.Rule{Name: "n", Limit: 10, Window: time.Minute})
	take(t, s, time.Now(), p, "k", 1)
	gone := "192.0.2.1:6379" // a master that left: its breaker open
	s.nodeBreaker(gone).Execute(func() (struct{}, error) { return struct{}{}, errors.New("down") })
	if st := s.State(); st != BreakerOpen {
		t.Fatalf("State() = %v with the gone master's breaker open, want open", st)
	}
	sweep := func() map[string]BreakerState {
		s.lastSweep.Store(time.Now().Add(-2 * breakerIdle).UnixNano()) // a sweep period has passed
		return s.NodeStates()
	}
	c, err := client.MasterForKey(context.Background(), redisKey(s.prefix, "n", "", &core.Request{Key: "k"}))
	if err != nil {
		t.Fatal(err)
	}
	live := c.Options().Addr
	if st := sweep(); st[gone] != BreakerOpen || st[live] != BreakerClosed {
		t.Fatalf("after one sweep: %v, want the gone master's breaker still open beside %s's", st, live)
	}
	take(t, s, time.Now(), p, "k", 1) // the live master is used again
	st := sweep()
	if _, ok := st[gone]; ok || st[live] != BreakerClosed {
		t.Fatalf("after a sweep period with no decision through it: %v, want the gone master's breaker dropped, %s's closed", st, live)
	}
	if got := s.State(); got != BreakerClosed {
		t.Fatalf("State() = %v, want closed", got)
	}
	if got := tr.list(); !slices.Equal(got, []string{"closed>open", "open>closed"}) {
		t.Fatalf("OnStateChange heard %v, want the gone master's breaker open, then closed when dropped", got)
	}
	// Calls within one period sweep nothing.
	s.nodeBreaker(gone)
	for range 3 {
		if _, ok := s.NodeStates()[gone]; !ok {
			t.Fatal("a breaker used within the period was dropped")
		}
	}
}
