package core

import (
	"context"
	"errors"
	"time"
)

// Request asks a Store to charge Cost units to Key under Policy.
type Request struct {
	// Policy is the rule to decide under. Stores namespace keys by
	// Policy.Name, so the same Key under two Names is two quotas, and under
	// two policies of one Name it is one record. The record is tagged with
	// the Identity of the policy that last wrote it and is never read under
	// another Identity: see Store.
	Policy *Policy
	// Key identifies whose quota is charged, such as a client IP or a user
	// id. Stores treat it as opaque bytes; hash keys that hold secrets
	// before they reach a shared store.
	Key string
	// Cost is the number of units to charge, in [1, Policy.Capacity()].
	Cost int64
	// ChargedAt matters to Refunder.Refund alone: when the charge being
	// given back began to give its units back, on the clock that decided
	// it, which is when it was made (the now of the Take that made it, or
	// the charge's Decision.At when the store decided on a clock of its
	// own) except for a bucket that was not full: Policy.ChargeStart
	// returns it from the charge's Decision. The
	// refund then gives back only what that charge still holds at the
	// refund's now: nothing of what has recovered since, and none of the
	// units of charges made after it (see Refunder). The zero time means
	// not known: the refund gives back the most recent units in use.
	ChargedAt time.Time
	// Fallback matters to Refunder.Refund alone: the charge being given
	// back was made by the store's fallback (the charge's Decision has
	// Fallback set), so the refund goes to the fallback, which made it,
	// never to the backend, which did not. Stores without a fallback
	// refuse such a refund.
	Fallback bool
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
// the decision of every request above its capacity refused and RetryAfter
// 0, and nothing charged) for a cost above the policy's capacity, ErrDuplicateRequest when two requests
// share a policy name and key, and ErrBatchTooLarge beyond MaxBatch
// requests; the MemoryStore also returns ErrStoreFull (every decision
// refused, nothing charged); a store that cannot decide a request's policy
// returns an error wrapping ErrUnsupportedPolicy (see PolicyChecker), a
// configuration error, before charging anything. Any other error is a
// backend failure, after
// which the caller cannot know whether the batch was charged; it is
// wrapped with the store's name.
//
// Every Store implements the same semantics, which core/storetest checks:
//
//   - Policy identity. A record written under a policy A and met by a
//     request under a policy B of the same Name with another Identity is
//     never read as B's: at now, the units A has in use (A.Capacity() minus
//     A's Remaining) carry over as a fresh state of B charged
//     min(used, B.Capacity()) at now (under a window or log B, at the
//     time A's record says it was written, a window's start or a log's
//     newest entry, when now lies at most ClockTolerance behind it),
//     tagged B, and the request is then
//     decided under B. The converted state is stored only with B's charge:
//     a refused request leaves A's record as it was, and its RetryAfter is
//     when A's own units in use leave room for it under B; a conversion
//     that drops units (A had more in use than B's capacity, a shaping
//     bucket's queue included) is always refused. A's record stays for A's
//     requests, which would otherwise find units credited when they return
//     (tiers of one Name, requests holding the rules a reload replaced). So
//     a change of rule never credits quota, and recovery of the carried
//     units restarts at the change. Units carried over then recover at the
//     pace of the policy that charged last: when requests under A and B
//     both keep being admitted, a policy that recovers faster lets the
//     other's units go sooner (give such tiers Names of their own). Two policies with one Identity share the
//     record as one. Within a batch, the same Name and key twice is
//     ErrDuplicateRequest, whatever the identities.
//   - A decision at a time behind the key's state by at most
//     ClockTolerance (a caller that read its clock before another whose
//     decision went first) decides as at the state's time and moves
//     nothing back: it never makes room for more requests than its
//     absence would.
//   - A clock that steps back (and runs on from there) never credits
//     quota and never refuses a key for longer than its policy's
//     full-recovery time plus ClockTolerance from the first decision after
//     the step: the refill time Burst x Window / Limit (plus MaxDelay) for
//     the buckets, one Window for FixedWindow and SlidingWindowLog, two
//     Windows for SlidingWindowCounter. Times that keep alternating by
//     more than ClockTolerance (callers whose clocks are further apart
//     sharing a store that decides at their times) are a step back each
//     time, and may admit well beyond the quota.
//   - A never-seen key is whole at every instant, before 1970 and the zero
//     time.Time included. The memory store clamps now to [MinTime, MaxTime].
//
// A Store may ignore now and use a clock of its own (the Redis store reads
// the server's clock by default); now is Unix-epoch based.
type Store interface {
	// Take decides reqs at now, writing the decision for reqs[i] to
	// out[i], and charges the batch only when every decision is Allowed.
	// A refused batch is no error; the errors are those listed above.
	Take(ctx context.Context, now time.Time, reqs []Request, out []Decision) error
}

// PolicyChecker is implemented by Stores that cannot decide every valid
// Policy, such as a Redis store, which decides the built-in algorithms
// alone. CheckPolicy returns nil when the store can decide p, and
// otherwise the error (wrapping ErrUnsupportedPolicy) its Take would return
// for p. Limiters ask at construction, for their policy and those their
// Resolver lists (PolicyLister), and the root package's Limiter again when
// its rules change, so that a policy the store cannot decide is refused
// there rather than failing every request; a store wrapping another passes
// the question on. CheckPolicies asks for a list.
type PolicyChecker interface {
	// CheckPolicy reports whether the store can decide p: nil, or an
	// error wrapping ErrUnsupportedPolicy that names p.
	CheckPolicy(p *Policy) error
}

// ErrUnsupportedPolicy is wrapped by the error of a Store that cannot
// decide a valid Policy (see PolicyChecker): a configuration error, never
// a backend failure, which the HTTP middleware answers with 500 and never
// serves fail-open.
var ErrUnsupportedPolicy = errors.New("ratelimit: the store cannot decide this policy")

// CheckPolicies returns the first error store's CheckPolicy reports for
// one of policies (nil ones are skipped), or nil when store is not a
// PolicyChecker or can decide them all.
func CheckPolicies(store Store, policies ...*Policy) error {
	pc, ok := store.(PolicyChecker)
	if !ok {
		return nil
	}
	for _, p := range policies {
		if p == nil {
			continue
		}
		if err := pc.CheckPolicy(p); err != nil {
			return err
		}
	}
	return nil
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
	// ErrStoreFull is returned by a MemoryStore that has no room for a new
	// key, with every decision of the batch refused and nothing charged. It
	// is not a backend failure: the store knows nothing was charged, and
	// the request must be refused, not served unlimited by a fail-open
	// policy. Two cases:
	//
	//   - KeepActive, when a new key meets a full shard whose least recently
	//     used key still holds state. The refusing decisions' RetryAfter is
	//     the time until that key has fully recovered and room frees up:
	//     never early if nothing else arrives, and over all the full shards
	//     of a batch, the latest.
	//   - Any configuration, when a batch holds more keys in one shard than
	//     the shard holds (only with fewer than MaxBatch keys per shard).
	//     It can never be stored: RetryAfter is 0, as for
	//     ErrCostExceedsCapacity.
	ErrStoreFull = errors.New("ratelimit: memory store is full of keys that still hold state")
	// ErrTimeOutOfRange is returned (possibly wrapped by a store's own
	// error) by a store that cannot represent the instant now, with nothing
	// charged: a store may accept only part of the times a time.Time holds
	// (the MemoryStore accepts every one, clamping it to [MinTime,
	// MaxTime]). At every instant a store accepts, a key never seen is
	// whole.
	ErrTimeOutOfRange = errors.New("ratelimit: a store cannot represent this instant")
)

// CheckBatch validates a batch the way every Store must before touching
// state: lengths, costs, duplicates. Store implementations call it first.
// For a cost above capacity it returns ErrCostExceedsCapacity and the index
// of the first offending request (a store decides every such request at
// cost 0, refused with no RetryAfter); otherwise the index is -1.
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
		if r.Policy.alg == nil {
			return -1, errors.New("ratelimit: request with a Policy not built by NewPolicy")
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
