package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitry/ratelimit"
)

// ReplayStore is a ratelimit.ReplayStore on Redis, so that every process of
// a fleet replays the same idempotency keys (see ratelimit.Idempotency).
// Each key is one Redis string, "p:<token>" while claimed and
// "d:<replays>:<record>" once committed, written by short Lua scripts (one round trip per call) and
// expiring with PEXPIRE: a claim after its hold, a record after its TTL.
// Keys are single-key operations, so any Cluster slot will do. A replay
// keeps its record's expiry (SET ... KEEPTTL), so the store needs Redis 6.0
// or later.
//
// Every call is bounded by ReplayConfig.Timeout: a slow or unreachable
// Redis makes the idempotency filter limit the request as usual (see
// ratelimit.IdempotencyConfig.OnError) rather than stall it.
type ReplayStore struct {
	client   redis.UniversalClient
	ctxBound bool // the client bounds its I/O by the context's deadline
	prefix   string
	timeout  time.Duration
}

var _ ratelimit.ReplayStore = (*ReplayStore)(nil)

// ReplayConfig configures a ReplayStore. A nil *ReplayConfig means the
// defaults.
type ReplayConfig struct {
	// Prefix starts every key, followed by "%idem:", which no key of a
	// Store's rule begins with (a rule's name is escaped, and "%" only
	// starts an escape): the two may share a prefix. The default value is
	// DefaultPrefix.
	Prefix string
	// Timeout bounds each call. The default value is DefaultTimeout.
	Timeout time.Duration
}

// NewReplayStore returns a ReplayStore over client configured by cfg (nil
// for the defaults). It returns an error for a nil client or a negative
// Timeout.
func NewReplayStore(client redis.UniversalClient, cfg *ReplayConfig) (*ReplayStore, error) {
	if client == nil {
		return nil, errors.New("ratelimit: redisstore: NewReplayStore needs a client")
	}
	var c ReplayConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("ratelimit: redisstore: ReplayConfig.Timeout must not be negative, got %v", c.Timeout)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	_, ctxBound, _ := clientPlacement(client)
	return &ReplayStore{client: client, ctxBound: ctxBound, prefix: c.Prefix + "%idem:", timeout: c.Timeout}, nil
}

// The scripts run without go-redis's retries (see runScript): a claim
// retried after its reply was lost would find itself. The claim script
// also takes its own token as its own claim.
var (
	claimScript = newLua(`
local v = redis.call('GET', KEYS[1])
if v then
  if v == 'p:' .. ARGV[1] then return {0} end
  if string.sub(v, 1, 2) == 'p:' then return {2} end
  local sep = string.find(v, ':', 3, true)
  local n = tonumber(string.sub(v, 3, sep - 1))
  if n < tonumber(ARGV[3]) then
    local rec = string.sub(v, sep + 1)
    redis.call('SET', KEYS[1], 'd:' .. (n + 1) .. ':' .. rec, 'KEEPTTL')
    return {1, rec}
  end
end
redis.call('SET', KEYS[1], 'p:' .. ARGV[1], 'PX', ARGV[2])
return {0}`)
	commitScript = newLua(`
if redis.call('GET', KEYS[1]) == 'p:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'd:0:' .. ARGV[2], 'PX', ARGV[3])
end
return 0`)
	releaseScript = newLua(`
if redis.call('GET', KEYS[1]) == 'p:' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0`)
)

// millis returns d in whole milliseconds, rounded up, at least 1. The
// longest Duration, a hold or TTL meaning forever, gives about 292 years,
// not a sum that wraps into the past.
func millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return max(int64(ms), 1)
}

// Claim implements ratelimit.ReplayStore.
func (s *ReplayStore) Claim(ctx context.Context, key string, hold time.Duration, maxReplays int) ([]byte, string, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	reply, err := s.run(ctx, claimScript, key, tok, millis(hold), maxReplays)
	if err != nil {
		return nil, "", fmt.Errorf("ratelimit: redisstore: idempotency claim: %w", err)
	}
	v, _ := reply.([]any)
	if len(v) == 0 {
		return nil, "", errors.New("ratelimit: redisstore: idempotency claim: empty reply")
	}
	switch code, _ := v[0].(int64); code {
	case 0:
		return nil, tok, nil
	case 1:
		if len(v) == 2 {
			if rec, ok := v[1].(string); ok {
				return []byte(rec), "", nil
			}
		}
	case 2:
		return nil, "", ratelimit.ErrReplayPending
	}
	return nil, "", fmt.Errorf("ratelimit: redisstore: idempotency claim: unexpected reply %v", v)
}

// Commit implements ratelimit.ReplayStore.
func (s *ReplayStore) Commit(ctx context.Context, key, token string, rec []byte, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.run(ctx, commitScript, key, token, rec, millis(ttl)); err != nil {
		return fmt.Errorf("ratelimit: redisstore: idempotency commit: %w", err)
	}
	return nil
}

// Release implements ratelimit.ReplayStore.
func (s *ReplayStore) Release(ctx context.Context, key, token string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.run(ctx, releaseScript, key, token); err != nil {
		return fmt.Errorf("ratelimit: redisstore: idempotency release: %w", err)
	}
	return nil
}

// run runs sc on key's Redis key with args, within ctx (also for a client
// without ContextTimeoutEnabled: the call is then abandoned at the
// deadline; see runScriptWithin).
func (s *ReplayStore) run(ctx context.Context, sc *luaScript, key string, args ...any) (any, error) {
	return runScriptWithin(ctx, s.client, s.ctxBound, nil, sc, []string{s.prefix + key}, args, nil)
}
