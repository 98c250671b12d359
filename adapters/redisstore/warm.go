package redisstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm prepares the store for a burst of decisions right after it is
// built (a deploy, a restart): on every Redis server the client reaches
// (every master of a Cluster, every shard of a Ring) it loads the script
// (SCRIPT LOAD, so no decision pays for a NOSCRIPT reply and a resend of
// the script's source) and opens the client's pool of connections (as
// many concurrent PINGs as the client's PoolSize), so no decision pays
// for a dial. Decisions made before or without Warm are correct; they may
// time out while the pool fills, and count against the circuit breaker.
//
// Warm is bounded by ctx, not by the store's Timeout; call it once after
// New, before serving, with a deadline of a few seconds. It returns the
// first error met, wrapped; the store is usable whatever it returns.
func (s *Store) Warm(ctx context.Context) error {
	switch c := s.client.(type) {
	case *redis.Client:
		return warmNode(ctx, c, c.Options().PoolSize)
	case *redis.ClusterClient:
		c.ReloadState(ctx)
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return warmNode(ctx, n, c.Options().PoolSize)
		})
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return warmNode(ctx, n, c.Options().PoolSize)
		})
	default:
		if err := s.client.ScriptLoad(ctx, scriptSource).Err(); err != nil {
			return fmt.Errorf("redisstore: warming up: %w", err)
		}
		return nil
	}
}

// warmNode loads the script on one server and opens up to conns
// connections to it. Each connection is held until all are open (and
// answered a PING), so the pool ends up holding conns idle connections, not
// the few that concurrent PINGs would reuse.
func warmNode(ctx context.Context, c *redis.Client, conns int) error {
	if err := c.ScriptLoad(ctx, scriptSource).Err(); err != nil {
		return fmt.Errorf("redisstore: warming up %s: %w", c.Options().Addr, err)
	}
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
