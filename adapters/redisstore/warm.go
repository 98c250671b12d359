package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm prepares the store for a burst of decisions right after it is
// built (a deploy, a restart): on every Redis server the client reaches
// (every master of a Cluster, every shard of a Ring) it loads the script
// (SCRIPT LOAD, so no decision pays for a NOSCRIPT reply and a resend of
// the script's source) and opens the client's pool of connections (as
// many concurrent PINGs as the node's client may hold connections: its
// PoolSize, or MaxActiveConns when lower), so no decision pays for a
// dial. Decisions made before or without Warm are correct; they may
// time out while the pool fills, and count against the circuit breaker.
//
// Warm is bounded by ctx, not by the store's Timeout, also for a client
// without ContextTimeoutEnabled (whose calls it then abandons when ctx
// ends, as decisions' are: they end on the client's ReadTimeout, and
// Close waits for them); call it once after New, before serving, with a
// deadline of a few seconds. It returns the first error met, wrapped; the
// store is usable whatever it returns.
func (s *Store) Warm(ctx context.Context) error {
	_, err := callWithin(ctx, s.ctxBound, func() func() { s.gate.hold(); return s.gate.leave }, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.warm(ctx)
	}, nil)
	if errors.Is(err, errAbandoned) {
		return fmt.Errorf("redisstore: warming up: %w", err)
	}
	return err
}

// warm is Warm, on a client that bounds its calls by ctx.
func (s *Store) warm(ctx context.Context) error {
	switch c := s.client.(type) {
	case *redis.Client:
		return warmNode(ctx, c)
	case *redis.ClusterClient:
		c.ReloadState(ctx)
		return c.ForEachMaster(ctx, warmNode)
	case *redis.Ring:
		return c.ForEachShard(ctx, warmNode)
	default:
		if err := s.client.ScriptLoad(ctx, scriptSource).Err(); err != nil {
			return fmt.Errorf("redisstore: warming up: %w", err)
		}
		return nil
	}
}

// warmNode loads the script on one server and opens as many connections
// to it as c may hold (poolConns). Each connection is held until all are
// open (and answered a PING), so the pool ends up holding that many idle
// connections, not the few that concurrent PINGs would reuse.
func warmNode(ctx context.Context, c *redis.Client) error {
	if err := c.ScriptLoad(ctx, scriptSource).Err(); err != nil {
		return fmt.Errorf("redisstore: warming up %s: %w", c.Options().Addr, err)
	}
	conns := poolConns(c.Options())
	if conns <= 0 {
		conns = 10
	}
	var wg sync.WaitGroup
	errs := make([]error, conns)
	held := make([]*redis.Conn, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[i] = c.Conn()
			errs[i] = held[i].Ping(ctx).Err()
		}()
	}
	wg.Wait()
	for _, cn := range held {
		cn.Close() // back to the pool, idle
	}
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("redisstore: warming up %s: %w", c.Options().Addr, err)
		}
	}
	return nil
}

// poolConns returns how many connections a client of options o may hold at
// once: its PoolSize, or its MaxActiveConns when that is set and lower
// (go-redis then fails a call beyond it at once, "connection pool
// exhausted", where a call beyond PoolSize waits for a connection).
func poolConns(o *redis.Options) int {
	n := o.PoolSize
	if m := o.MaxActiveConns; m > 0 && m < n {
		n = m
	}
	return n
}
