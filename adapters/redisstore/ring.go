package redisstore

import (
	"context"
	"errors"
	"fmt"
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

// ErrRingChanged is reported to the Observer, once, when the store finds
// that the shards of a Ring it uses changed (Ring.SetAddrs added a shard or
// dropped one; see the package documentation): the Ring then moves keys
// between shards without their state, and the store, which knows the
// shards the Ring was built with, can no longer tell a shard that is down
// from one removed, so it stops failing keys with ErrShardDown and decides
// them where the Ring sends them.
var ErrRingChanged = errors.New("redisstore: the Ring's shards changed (SetAddrs): keys moved between shards without their state, and a shard that goes down is no longer detected")

// ringGuard finds the keys a Ring has moved off their own shard: the shard
// a key hashes to among every shard the Ring was built with, as the Ring
// routes it while that shard is up.
type ringGuard struct {
	ring    *redis.Ring
	names   []string             // every shard's name
	nameOf  map[string]string    // shard address -> name
	addrOf  map[string]string    // shard name -> address
	home    redis.ConsistentHash // over every shard, as the Ring hashes when all are up
	clients sync.Map             // shard name -> its *redis.Client, for the shards seen up
	seen    atomic.Int64         // shards in clients
	added   atomic.Bool          // SetAddrs created a shard
	off     atomic.Bool          // the shards changed: the guard lets every key through
}

func newRingGuard(r *redis.Ring) *ringGuard {
	o := r.Options()
	g := &ringGuard{ring: r, nameOf: make(map[string]string, len(o.Addrs)), addrOf: make(map[string]string, len(o.Addrs))}
	for name, addr := range o.Addrs {
		g.names = append(g.names, name)
		g.nameOf[addr] = name
		g.addrOf[name] = addr
	}
	g.see()
	g.home = o.NewConsistentHash(g.names)
	r.OnNewNode(func(*redis.Client) { g.added.Store(true) })
	return g
}

// check returns an error wrapping ErrShardDown when the Ring sends one of
// keys elsewhere than to its own shard because that shard is down. It
// returns ErrRingChanged once, when it finds that the Ring's shards
// changed, and nil from then on. It costs a key the Ring's routing of it
// and the guard's own.
func (g *ringGuard) check(keys []string) error {
	if g.off.Load() {
		return nil
	}
	if g.added.Load() {
		return g.changed()
	}
	if g.seen.Load() < int64(len(g.names)) {
		g.see()
	}
	for _, k := range keys {
		name := g.home.Get(hashtagKey(k))
		c, err := g.ring.GetShardClientForKey(k)
		if err != nil {
			return nil // no shard up: the call fails with the Ring's own error
		}
		addr := c.Options().Addr
		if addr == g.addrOf[name] {
			continue
		}
		if _, ok := g.nameOf[addr]; !ok {
			return g.changed() // a shard the Ring was not built with
		}
		if v, ok := g.clients.Load(name); ok && errors.Is(v.(*redis.Client).Ping(cancelled).Err(), redis.ErrClosed) {
			// SetAddrs closes the clients of the shards it drops, which
			// then are not down but gone: asked with a context already
			// cancelled, a client tells that without a call to its server.
			return g.changed()
		}
		if g.ring.Len() >= len(g.names) {
			// Every shard up now, though the key was sent elsewhere: the
			// shard came back up meanwhile (or SetAddrs swapped shards'
			// addresses, which a flapping shard cannot be told from).
			continue
		}
		return fmt.Errorf("%w: shard %q: its keys would be decided on another shard, without their state", ErrShardDown, name)
	}
	return nil
}

// see records the clients of the shards up, until it has seen every
// shard's: SetAddrs closes the client of a shard it drops.
func (g *ringGuard) see() {
	for _, c := range g.ring.GetShardClients() {
		if name, ok := g.nameOf[c.Options().Addr]; ok {
			if _, loaded := g.clients.LoadOrStore(name, c); !loaded {
				g.seen.Add(1)
			}
		}
	}
}

// changed turns the guard off and returns ErrRingChanged the first time.
func (g *ringGuard) changed() error {
	if g.off.Swap(true) {
		return nil
	}
	return ErrRingChanged
}

// cancelled is a context already cancelled.
var cancelled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

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
