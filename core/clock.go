package core

import (
	"sync"
	"time"
)

// Clock is the source of time for a Limiter. It is read once per decision,
// and once more for the latency when the Limiter has an Observer.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// SystemClock returns a Clock that reads the wall clock once, when it is
// made, and the monotonic clock afterwards: its times are anchored to the
// Unix epoch (so FixedWindow windows align to it) but never jump when the
// wall clock is stepped, and each reading costs a monotonic clock read
// rather than a full time.Now.
func SystemClock() Clock {
	now := time.Now()
	return &systemClock{base: now, baseNs: now.UnixNano()}
}

type systemClock struct {
	base   time.Time
	baseNs int64
}

func (c *systemClock) Now() time.Time { return c.base.Add(time.Since(c.base)) }

// unixNano is Now().UnixNano() without building a time.Time.
func (c *systemClock) unixNano() int64 { return c.baseNs + int64(time.Since(c.base)) }

// FakeClock is a Clock that moves only when told to, for tests. It is safe
// for concurrent use. Its zero value reads as the zero time.Time, at which
// a Limiter decides like at any other instant (a new key is whole); use
// NewFakeClock to start at a chosen instant.
type FakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewFakeClock returns a FakeClock reading t.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{t: t} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, forwards or backwards.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Advance moves the clock forwards by d (backwards for a negative d) and
// returns the new time.
func (c *FakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}
