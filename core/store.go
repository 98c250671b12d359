package core

import (
	"context"
	"errors"
	"time"
)

// Request asks a Store to charge Cost units to Key under Policy.
type Request struct {
	// Policy is the rule to decide under. Stores namespace keys by
	// Policy.Name, so the same Key under two policies is two quotas.
	Policy *Policy
	// Key identifies whose quota is charged, such as a client IP or a user
	// id. Stores treat it as opaque bytes; hash keys that hold secrets
	// before they reach a shared store.
	Key string
	// Cost is the number of units to charge, in [1, Policy.Capacity()].
	Cost int64
}

// Store keeps per-key state and decides batches atomically. It is safe for
// concurrent use.
//
// Take decides every request of reqs at time now and writes the decision for
// reqs[i] to out[i] (len(out) must be at least len(reqs)). The batch is
// all-or-nothing: when every decision is Allowed, every request is charged;
// when any is refused, none is, and the Allowed decisions report Remaining
// without their cost. A refusal is not an error: Take returns nil and the
// decisions say who refused.
//
// Take returns ErrInvalidCost for a cost < 1, ErrCostExceedsCapacity (with
// that request's decision refused and RetryAfter 0, and nothing charged) for
// a cost above the policy's capacity, ErrDuplicateRequest when two requests
// share a policy name and key, and ErrBatchTooLarge beyond MaxBatch
// requests. Any other error is a backend failure, after which the caller
// cannot know whether the batch was charged; it is wrapped with the store's
// name.
//
// A Store may ignore now and use a clock of its own (the Redis store reads
// the server's clock by default); now is Unix-epoch based.
type Store interface {
	Take(ctx context.Context, now time.Time, reqs []Request, out []Decision) error
}

// MaxBatch is the largest number of requests in one Store.Take batch.
const MaxBatch = 16

var (
	// ErrDuplicateRequest is returned for a batch that holds the same policy
	// name and key twice.
	ErrDuplicateRequest = errors.New("ratelimit: batch holds the same policy and key twice")
	// ErrBatchTooLarge is returned for a batch of more than MaxBatch requests.
	ErrBatchTooLarge = errors.New("ratelimit: batch holds more than MaxBatch requests")
	// ErrShortOutput is returned when out is shorter than reqs.
	ErrShortOutput = errors.New("ratelimit: decision slice shorter than the batch")
	// ErrStoreFull is returned by a MemoryStore configured with KeepActive
	// when a new key meets a full shard whose oldest key still holds state.
	ErrStoreFull = errors.New("ratelimit: memory store is full of keys that still hold state")
)

// CheckBatch validates a batch the way every Store must before touching
// state: lengths, costs, duplicates. Store implementations call it first.
// For a cost above capacity it returns ErrCostExceedsCapacity and the index
// of the offending request; otherwise the index is -1.
func CheckBatch(reqs []Request, out []Decision) (int, error) {
	if len(out) < len(reqs) {
		return -1, ErrShortOutput
	}
	if len(reqs) > MaxBatch {
		return -1, ErrBatchTooLarge
	}
	over := -1
	for i := range reqs {
		r := &reqs[i]
		if r.Policy == nil {
			return -1, errors.New("ratelimit: request without a policy")
		}
		if r.Cost < 1 {
			return -1, ErrInvalidCost
		}
		if r.Cost > r.Policy.capacity && over < 0 {
			over = i
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == r.Key && reqs[j].Policy.rule.Name == r.Policy.rule.Name {
				return -1, ErrDuplicateRequest
			}
		}
	}
	if over >= 0 {
		return over, ErrCostExceedsCapacity
	}
	return -1, nil
}
