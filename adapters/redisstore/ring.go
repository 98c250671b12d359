package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// ErrShardDown is returned (or, with a Fallback, reported to the Observer)
// for a batch with a key whose Ring shard is down. go-redis's Ring moves
// such a key to another shard, which holds no state for it: deciding it
// there would grant it a fresh quota, so the store does not.
var ErrShardDown = errors.New("redisstore: the key's Ring shard is down")

// ErrRingChanged is reported to the Observer, once, when the shards of a
// Ring the store uses change (Ring.SetAddrs adds a shard, or drops one):
// the Ring then moves keys between shards without their state, and the
// store, which knows the shards the Ring was built with, can no longer
// tell a shard that is down from one removed, so it stops failing keys
// with ErrShardDown and decides them where the Ring sends them.
var ErrRingChanged = errors.New("redisstore: the Ring's shards changed (SetAddrs): keys moved between shards without their state, and a shard that goes down is no longer detected")

// ringGuard finds the keys a Ring has moved off their own shard because
// that shard is down (its heartbeat failed): the shard a key hashes to
// among every shard the Ring was built with, when that shard is not up.
type ringGuard struct {
	ring    *redis.Ring
	names   []string                 // every shard's name
	nameOf  map[string]string        // shard address -> name
	clients map[string]*redis.Client // shard name -> its client, for the shards up when the guard was made
	home    redis.ConsistentHash     // over every shard, as the Ring hashes when all are up
	down    atomic.Pointer[downs]    // the shards found down, for the shards up then
	added   atomic.Bool              // SetAddrs created a shard
	off     atomic.Bool              // the shards changed: the guard lets every key through
	mu      sync.Mutex               // serialises the report of a change
}

// downs is the set of shards found down while the shards up were up.
type downs struct {
	up    []*redis.Client
	names map[string]bool
}

func newRingGuard(r *redis.Ring) *ringGuard {
	o := r.Options()
	g := &ringGuard{ring: r, nameOf: make(map[string]string, len(o.Addrs)), clients: make(map[string]*redis.Client, len(o.Addrs))}
	for name, addr := range o.Addrs {
		g.names = append(g.names, name)
		g.nameOf[addr] = name
	}
	for _, c := range r.GetShardClients() {
		if name, ok := g.nameOf[c.Options().Addr]; ok {
			g.clients[name] = c
		}
	}
	g.home = o.NewConsistentHash(g.names)
	r.OnNewNode(func(*redis.Client) { g.added.Store(true) })
	return g
}

// check returns an error wrapping ErrShardDown when one of keys hashes to
// a shard that is down. While every shard is up it costs the Ring's count
// of live shards. It returns ErrRingChanged once, when it finds that the
// Ring's shards changed, and nil from then on.
func (g *ringGuard) check(keys []string) error {
	if g.off.Load() {
		return nil
	}
	if g.added.Load() {
		return g.changed()
	}
	if g.ring.Len() >= len(g.names) {
		return nil
	}
	up := g.ring.GetShardClients()
	d := g.down.Load()
	if d == nil || !sameClients(d.up, up) {
		var changed bool
		if d, changed = g.find(up); changed {
			return g.changed()
		}
		g.down.Store(d)
	}
	for _, k := range keys {
		if name := g.home.Get(hashtagKey(k)); d.names[name] {
			return fmt.Errorf("%w: shard %q: its keys would be decided on another shard, without their state", ErrShardDown, name)
		}
	}
	return nil
}

// changed turns the guard off and returns ErrRingChanged the first time.
func (g *ringGuard) changed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off.Swap(true) {
		return nil
	}
	return ErrRingChanged
}

// find returns the shards that are down while the shards of the clients
// up are up, and whether the Ring's shards changed: a shard up that the
// Ring was not built with, or one down whose client is closed (SetAddrs
// closes the clients of the shards it drops; asking a client with a
// context already cancelled tells that without a call to its server).
func (g *ringGuard) find(up []*redis.Client) (*downs, bool) {
	d := &downs{up: up, names: make(map[string]bool)}
	isUp := make(map[string]bool, len(up))
	for _, c := range up {
		name, ok := g.nameOf[c.Options().Addr]
		if !ok {
			return nil, true
		}
		isUp[name] = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, n := range g.names {
		if isUp[n] {
			continue
		}
		if c := g.clients[n]; c != nil && errors.Is(c.Ping(ctx).Err(), redis.ErrClosed) {
			return nil, true
		}
		d.names[n] = true
	}
	return d, false
}

// sameClients reports whether a and b hold the same clients.
func sameClients(a, b []*redis.Client) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.Contains(b, c) {
			return false
		}
	}
	return true
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
