package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/limitry/ratelimit/core"
)

// RefusalCacheConfig configures a RefusalCache. A nil *RefusalCacheConfig
// means the defaults.
type RefusalCacheConfig struct {
	// MaxKeys bounds the number of refused keys remembered; the least
	// recently used beyond it are forgotten (their next request goes to the
	// backend). The default value is DefaultLeaseKeys, 10,000.
	MaxKeys int
}

// RefusalCacheStats counts what a RefusalCache did since it was created.
// Hits / (Hits + Misses) is its hit rate.
type RefusalCacheStats struct {
	// Hits is the number of Take calls refused locally, with no call to the
	// backend.
	Hits uint64
	// Misses is the number of Take calls passed to the backend.
	Misses uint64
	// Evictions is the number of refusals forgotten because the cache was
	// full (some may have ended already).
	Evictions uint64
	// Keys is the number of refusals the cache holds now (at most MaxKeys;
	// ended ones are dropped when next looked up or evicted).
	Keys int
}

// RefusalCache is a core.Store decorator that remembers the refusals of
// its backend (a Redis Store, or a LeaseStore over one): a key the backend
// refused with RetryAfter R is refused locally, without calling the
// backend, until R has passed, so a client hammering a refused key costs
// the backend nothing. It is safe for concurrent use, and its memory is
// bounded by an LRU of MaxKeys refusals.
//
// A refusal of cost c is reused only for requests of the same policy (the
// same *core.Policy) and key with the same cost c, or, under a FixedWindow
// policy, a cost of at least c: a fixed window refuses a larger request
// until the window ends too, while the other built-in algorithms make it
// wait longer than c's RetryAfter (by a time the cache cannot know), and
// may admit a smaller one sooner. Other costs go to the backend.
//
// A local refusal is the backend's refused decision with RetryAfter the
// time left until R ends (never earlier than the backend's answer), and
// Remaining and ResetAfter as the backend reported them (ResetAfter counted
// down). In a batch (layered limits), one request with a live refusal
// refuses the whole batch locally, as the backend would: nothing is
// charged. The batch's other requests, whose state the cache does not
// know, are reported Allowed with Remaining 0 and ResetAfter the time a
// fully spent quota of their policy takes to be whole again, so they
// promise nothing the backend might not hold.
//
// The refusal is timed on the time passed to Take (the callers' clock); a
// request timed before the refusal goes to the backend. Another process may free the key
// sooner in a way the backend's RetryAfter did not foresee (a Cluster
// refund, a policy change): the cache then refuses until R, which is the
// time the backend itself gave the client. A refusal the backend's
// Fallback made while Redis was unavailable (core.Decision.Fallback) is
// not remembered: it is of the Fallback's local quota, which says nothing
// of Redis's once Redis is back.
type RefusalCache struct {
	backend core.Store

	mu     sync.Mutex
	keys   *simplelru.LRU[leaseKey, *refusal]
	resets uint64 // Reset calls begun and ended so far; guarded by mu

	hits, misses, evictions atomic.Uint64
}

var _ core.Store = (*RefusalCache)(nil)

// refusal is a remembered refused decision.
type refusal struct {
	policy    *core.Policy
	cost      int64
	at, until int64 // refusal time and end (Unix ns)
	limit     int64
	remaining int64
	resetAt   int64
}

// NewRefusalCache returns a RefusalCache in front of backend, configured by
// cfg (nil for the defaults). It returns an error wrapping
// ErrInvalidLeaseConfig for a nil backend or a negative MaxKeys.
func NewRefusalCache(backend core.Store, cfg *RefusalCacheConfig) (*RefusalCache, error) {
	if backend == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidLeaseConfig)
	}
	n := DefaultLeaseKeys
	if cfg != nil {
		if cfg.MaxKeys < 0 {
			return nil, fmt.Errorf("%w: negative MaxKeys", ErrInvalidLeaseConfig)
		}
		if cfg.MaxKeys > 0 {
			n = cfg.MaxKeys
		}
	}
	c := &RefusalCache{backend: backend}
	keys, err := simplelru.NewLRU[leaseKey, *refusal](n, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidLeaseConfig, err)
	}
	c.keys = keys
	return c, nil
}

// resetterOf returns backend as a core.Resetter, for the Reset of the
// decorator named who, or the error that Reset returns: for a nil policy,
// or a backend that cannot reset (wrapping core.ErrUnsupported).
func resetterOf(who string, backend core.Store, p *core.Policy) (core.Resetter, error) {
	if p == nil {
		return nil, errors.New("redisstore: reset without a policy")
	}
	rs, ok := backend.(core.Resetter)
	if !ok {
		return nil, fmt.Errorf("redisstore: %s.Reset: %w: the backend (%T) cannot reset", who, core.ErrUnsupported, backend)
	}
	return rs, nil
}

// Reset implements core.Resetter: it forgets the key's refusal under p's
// Name and resets the key in the backend, so that the key is decided by
// the backend from its next request (a refusal the backend made before
// the reset, and answered while it ran, is not remembered). It returns an
// error wrapping core.ErrUnsupported when the backend cannot reset.
func (c *RefusalCache) Reset(ctx context.Context, p *core.Policy, key string) error {
	rs, err := resetterOf("RefusalCache", c.backend, p)
	if err != nil {
		return err
	}
	k := leaseKey{p.Name(), key}
	forget := func() {
		c.mu.Lock()
		c.keys.Remove(k)
		c.resets++
		c.mu.Unlock()
	}
	forget()
	defer forget()
	return rs.Reset(ctx, p, key)
}

// CheckPolicy implements core.PolicyChecker: it asks the backend, when
// the backend can tell, whether it can decide p.
func (c *RefusalCache) CheckPolicy(p *core.Policy) error {
	return core.CheckPolicies(c.backend, p)
}

// Stats returns the cache's counters.
func (c *RefusalCache) Stats() RefusalCacheStats {
	c.mu.Lock()
	n := c.keys.Len()
	c.mu.Unlock()
	return RefusalCacheStats{
		Hits:      c.hits.Load(),
		Misses:    c.misses.Load(),
		Evictions: c.evictions.Load(),
		Keys:      n,
	}
}

// Take implements core.Store: it refuses locally a batch holding a request
// the backend refused and whose RetryAfter has not passed, and passes every
// other batch to the backend, remembering its refusals.
func (c *RefusalCache) Take(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	if _, err := core.CheckBatch(reqs, out); err != nil || len(reqs) == 0 {
		c.misses.Add(1)
		return c.backend.Take(ctx, now, reqs, out)
	}
	t := now.UnixNano()
	var hit [core.MaxBatch]*refusal
	found := false
	c.mu.Lock()
	gen := c.resets
	for i := range reqs {
		r := &reqs[i]
		k := leaseKey{r.Policy.Name(), r.Key}
		f, ok := c.keys.Get(k)
		if !ok {
			continue
		}
		if t >= f.until {
			c.keys.Remove(k)
			continue
		}
		if t < f.at { // a clock read before the refusal: ask the backend
			continue
		}
		if f.policy == r.Policy && (r.Cost == f.cost || (r.Cost > f.cost && r.Policy.Algorithm() == core.FixedWindow)) {
			hit[i], found = f, true
		}
	}
	c.mu.Unlock()
	if found {
		for i := range reqs {
			p := reqs[i].Policy
			if f := hit[i]; f != nil {
				out[i] = core.Decision{
					Limit:      f.limit,
					Remaining:  f.remaining,
					ResetAfter: time.Duration(max(f.resetAt-t, 0)),
					RetryAfter: time.Duration(f.until - t),
					Policy:     p,
				}
				continue
			}
			out[i] = core.Decision{Allowed: true, Limit: p.Capacity(), ResetAfter: recovery(p), Policy: p}
		}
		c.hits.Add(1)
		return nil
	}
	c.misses.Add(1)
	if err := c.backend.Take(ctx, now, reqs, out); err != nil {
		return err
	}
	for i := range reqs {
		d := &out[i]
		if d.Allowed || d.RetryAfter <= 0 || d.Fallback {
			// A Fallback's refusal (Redis unavailable) is of its local
			// quota, not Redis's: kept, it would refuse the key after
			// Redis is back, for as long as the local quota said.
			continue
		}
		r := &reqs[i]
		f := &refusal{
			policy:    r.Policy,
			cost:      r.Cost,
			at:        t,
			until:     t + int64(d.RetryAfter),
			limit:     d.Limit,
			remaining: d.Remaining,
			resetAt:   t + int64(d.ResetAfter),
		}
		c.mu.Lock()
		if c.resets != gen {
			// A Reset began or ended since the backend was asked: the
			// refusal may be of the state it removed.
			c.mu.Unlock()
			return nil
		}
		if c.keys.Add(leaseKey{r.Policy.Name(), r.Key}, f) {
			c.evictions.Add(1)
		}
		c.mu.Unlock()
	}
	return nil
}

// recovery returns the time a fully spent quota of p takes to be whole
// again at worst: the time until a fresh state, drained of its capacity at
// the start of a window, decides like a fresh one.
func recovery(p *core.Policy) time.Duration {
	var s core.State
	var d core.Decision
	a := p.Algorithm()
	a.Decide(p, &s, p.Capacity(), 0, true, &d)
	return time.Duration(max(a.Expiry(p, &s), 0))
}
