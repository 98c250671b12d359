package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrShardDown is returned (or, with a Fallback, reported to the Observer)
// for a batch with a key whose Ring shard is down. go-redis's Ring moves
// such a key to another shard, which holds no state for it: deciding it
// there would grant it a fresh quota, so the store does not.
var ErrShardDown = errors.New("redisstore: the key's Ring shard is down")

// ringGuard finds the keys a Ring has moved off their own shard because
// that shard is down (its heartbeat failed): the shard a key hashes to
// among every shard of the Ring, when that shard is not up.
type ringGuard struct {
	ring   *redis.Ring
	names  []string              // every shard's name
	nameOf map[string]string     // shard address -> name
	home   redis.ConsistentHash  // over every shard, as the Ring hashes when all are up
	down   atomic.Pointer[downs] // the shards found down, when some are
	mu     sync.Mutex            // serialises refreshes of down
}

// downs is the set of shards found down when the Ring had live shards up.
type downs struct {
	live  int
	at    time.Time
	names map[string]bool
}

// ringRefresh is how long a set of down shards is trusted while the
// number of live shards stays the same.
const ringRefresh = time.Second

func newRingGuard(r *redis.Ring) *ringGuard {
	o := r.Options()
	g := &ringGuard{ring: r, nameOf: make(map[string]string, len(o.Addrs))}
	for name, addr := range o.Addrs {
		g.names = append(g.names, name)
		g.nameOf[addr] = name
	}
	g.home = o.NewConsistentHash(g.names)
	return g
}

// check returns an error wrapping ErrShardDown when one of keys hashes to
// a shard that is down. While every shard is up it costs the Ring's count
// of live shards.
func (g *ringGuard) check(keys []string) error {
	live := g.ring.Len()
	if live >= len(g.names) {
		return nil
	}
	d := g.down.Load()
	if d == nil || d.live != live || time.Since(d.at) > ringRefresh {
		d = g.refresh(live)
	}
	for _, k := range keys {
		if name := g.home.Get(hashtagKey(k)); d.names[name] {
			return fmt.Errorf("%w: shard %q: its keys would be decided on another shard, without their state", ErrShardDown, name)
		}
	}
	return nil
}

// refresh finds the shards that are down.
func (g *ringGuard) refresh(live int) *downs {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.down.Load(); d != nil && d.live == live && time.Since(d.at) <= ringRefresh {
		return d
	}
	var mu sync.Mutex
	up := make(map[string]bool, len(g.names))
	// ForEachShard visits the shards that are up; the function never fails.
	_ = g.ring.ForEachShard(context.Background(), func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		up[g.nameOf[c.Options().Addr]] = true
		mu.Unlock()
		return nil
	})
	d := &downs{live: live, at: time.Now(), names: make(map[string]bool)}
	for _, n := range g.names {
		if !up[n] {
			d.names[n] = true
		}
	}
	g.down.Store(d)
	return d
}

// hashtagKey is the part of key a Ring (or a Cluster) hashes: the text
// between the first "{" and the next "}", when not empty, else the whole
// key.
func hashtagKey(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}
