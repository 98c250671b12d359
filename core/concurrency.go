package core

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// Concurrency limits bound the requests in flight per key, where a Rule
// bounds the requests per unit of time. A request takes one slot of its key
// when it starts and gives it back when it ends; a key holding Limit slots
// refuses the next request until one is given back. The slots of one
// request (one per concurrency limit that applies to it) are taken all or
// nothing, like a Store batch.

// SlotRequest asks for one in-flight slot of Key under the concurrency limit
// Name, which lets at most Limit requests per key hold a slot at once.
type SlotRequest struct {
	// Name names the limit; slot stores namespace keys by it.
	Name string
	// Key identifies whose slots are counted, such as a client IP.
	Key string
	// Limit is the most slots Key may hold at once, at least 1.
	Limit int64
}

// SlotDecision is the outcome of one SlotRequest.
type SlotDecision struct {
	// Allowed reports whether the key had a free slot. In a batch the
	// slots are taken only when every decision is Allowed.
	Allowed bool
	// Limit is the request's Limit.
	Limit int64
	// InFlight is the number of slots the key holds after the decision:
	// with this request's when the batch was admitted, without it
	// otherwise. It is within [0, Limit] for a store whose keys all use
	// one Limit.
	InFlight int64
}

// SlotStore holds the in-flight slots of concurrency limits. It is safe for
// concurrent use.
//
// Acquire decides every request of reqs and writes the decision for reqs[i]
// to out[i] (len(out) must be at least len(reqs)). It is all-or-nothing:
// when every key has a free slot, it takes one slot of each and returns a
// release function that gives them back; otherwise it takes none and
// returns a nil release function and a nil error (the decisions say who
// refused). The release function gives the slots back the first time it is
// called and does nothing after that, so a slot is never given back twice;
// it is safe to call from any goroutine.
//
// Acquire returns ErrInvalidSlotRequest for a Limit below 1 or an empty
// Name, ErrDuplicateRequest for two requests of one Name and Key,
// ErrBatchTooLarge beyond MaxBatch requests and ErrStoreFull when the store
// has no room for another key; any other error is a backend failure, after
// which no slot is held.
type SlotStore interface {
	// Acquire takes one slot for every request of reqs, or none, writing
	// the decision for reqs[i] to out[i]. It returns a non-nil release
	// when the slots are taken; a nil release and a nil error when a key
	// had no free slot; and a nil release and an error otherwise, with no
	// slot held.
	Acquire(ctx context.Context, reqs []SlotRequest, out []SlotDecision) (release func(), err error)
}

// ErrInvalidSlotRequest is returned by a SlotStore for a SlotRequest with a
// Limit below 1 or an empty Name.
var ErrInvalidSlotRequest = errors.New("ratelimit: slot request needs a Name and a Limit of at least 1")

// CheckSlots validates a slot batch the way every SlotStore must before
// touching state: lengths, names, limits and duplicates.
func CheckSlots(reqs []SlotRequest, out []SlotDecision) error {
	if len(out) < len(reqs) {
		return ErrShortOutput
	}
	if len(reqs) > MaxBatch {
		return ErrBatchTooLarge
	}
	for i := range reqs {
		if reqs[i].Limit < 1 || reqs[i].Name == "" {
			return ErrInvalidSlotRequest
		}
		for j := 0; j < i; j++ {
			if reqs[j].Name == reqs[i].Name && reqs[j].Key == reqs[i].Key {
				return ErrDuplicateRequest
			}
		}
	}
	return nil
}

// DefaultSlotKeys is the number of keys holding slots a SlotTable admits
// when no other bound is given.
const DefaultSlotKeys = 1 << 20

// SlotTable is the in-memory SlotStore: a count of held slots per key.
// A key is forgotten as soon as its last slot is given back, so the table
// holds only keys with requests in flight, and at most MaxKeys of them: a
// request for a new key beyond that is refused with ErrStoreFull (as for a
// full MemoryStore, the request must be refused, not served unlimited).
// Memory is therefore bounded by the requests in flight, whatever the
// number of distinct keys seen: once the keys held fall to a quarter of
// their peak (of at least slotShrinkMin keys), the table is rebuilt at
// their size, so a burst of keys in flight does not keep its memory.
//
// The table is guarded by one mutex, held for a few map operations per
// request and never across a call out. It is safe for concurrent use; the
// zero value is not usable: build one with NewSlotTable.
type SlotTable struct {
	mu      sync.Mutex
	held    map[slotKey]int64 // requires mu held; no entry at zero
	peak    int               // the most keys held since held was built
	maxKeys int
}

// slotShrinkMin is the least peak of keys held after which a SlotTable
// rebuilds its map when they fall to a quarter of it.
const slotShrinkMin = 4096

type slotKey struct{ name, key string }

// NewSlotTable returns an empty SlotTable holding at most maxKeys keys at
// once; maxKeys <= 0 means DefaultSlotKeys.
func NewSlotTable(maxKeys int) *SlotTable {
	if maxKeys <= 0 {
		maxKeys = DefaultSlotKeys
	}
	return &SlotTable{held: make(map[slotKey]int64), maxKeys: maxKeys}
}

var _ SlotStore = (*SlotTable)(nil)

// Acquire implements SlotStore.
func (t *SlotTable) Acquire(_ context.Context, reqs []SlotRequest, out []SlotDecision) (func(), error) {
	if err := CheckSlots(reqs, out); err != nil {
		return nil, err
	}
	t.mu.Lock()
	ok := true
	fresh := 0
	for i := range reqs {
		n := t.held[slotKey{reqs[i].Name, reqs[i].Key}]
		if n == 0 {
			fresh++
		}
		out[i] = SlotDecision{Allowed: n < reqs[i].Limit, Limit: reqs[i].Limit, InFlight: n}
		ok = ok && out[i].Allowed
	}
	if ok && len(t.held)+fresh > t.maxKeys {
		t.mu.Unlock()
		for i := range out[:len(reqs)] {
			out[i].Allowed = false
		}
		return nil, ErrStoreFull
	}
	if !ok {
		t.mu.Unlock()
		return nil, nil
	}
	h := &slotHold{t: t}
	h.keys = h.small[:0]
	for i := range reqs {
		k := slotKey{reqs[i].Name, reqs[i].Key}
		h.keys = append(h.keys, k)
		t.held[k]++
		out[i].InFlight++
	}
	t.peak = max(t.peak, len(t.held))
	t.mu.Unlock()
	return h.release, nil
}

// slotHold is the slots of one acquisition.
type slotHold struct {
	t     *SlotTable
	done  atomic.Bool
	keys  []slotKey
	small [2]slotKey // keys' storage for the usual one or two limits
}

// release gives the slots back the first time it is called.
func (h *slotHold) release() {
	if h.done.Swap(true) {
		return
	}
	h.t.release(h.keys)
}

// release gives back one slot of each key.
func (t *SlotTable) release(keys []slotKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if n := t.held[k] - 1; n > 0 {
			t.held[k] = n
		} else {
			delete(t.held, k)
		}
	}
	if t.peak >= slotShrinkMin && len(t.held) <= t.peak/4 {
		// A Go map keeps the memory of its largest size: copy the keys
		// left into one of their size (amortised: at least 3/4 of the
		// peak's keys were given back since it was built).
		held := make(map[slotKey]int64, len(t.held))
		for k, n := range t.held {
			held[k] = n
		}
		t.held, t.peak = held, len(held)
	}
}

// InFlight returns the number of slots key holds under the limit name.
func (t *SlotTable) InFlight(name, key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held[slotKey{name, key}]
}

// Capacity returns the most keys the table holds at once (its maxKeys).
func (t *SlotTable) Capacity() int { return t.maxKeys }

// Len returns the number of keys holding at least one slot.
func (t *SlotTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}
