package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// timeoutCtx bounds a decision by the store's Timeout when the caller's
// context can never end (its Done is nil, as for context.Background): it
// costs one small allocation where context.WithTimeout costs a timer, two
// closures and a channel per decision. Deadline is exact, and go-redis
// with ContextTimeoutEnabled bounds its socket I/O by it; Done is a
// channel shared by the decisions whose deadlines fall in the same
// millisecond, closed by one timer at most two milliseconds after the
// deadline (never before it), for what waits on Done (go-redis's wait for
// a pooled connection).
type timeoutCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func (c *timeoutCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *timeoutCtx) Done() <-chan struct{} { return c.done }

func (c *timeoutCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// deadlineBucket is a Done channel closed at a whole millisecond.
type deadlineBucket struct {
	at   int64 // Unix nanoseconds, a whole millisecond
	done chan struct{}
}

// deadlines hands out shared Done channels; the zero value is ready.
type deadlines struct {
	cur atomic.Pointer[deadlineBucket]
	mu  sync.Mutex
}

const bucketSlack = 2 * int64(time.Millisecond)

// withTimeout returns parent, which must have a nil Done, bounded by
// timeout.
func (d *deadlines) withTimeout(parent context.Context, timeout time.Duration) context.Context {
	now := time.Now()
	dl := now.Add(timeout)
	at := dl.UnixNano()
	return &timeoutCtx{Context: parent, deadline: dl, done: d.doneAt(now, at)}
}

// doneAt returns a channel that is closed at or after Unix nanosecond at,
// and at most bucketSlack after it.
func (d *deadlines) doneAt(now time.Time, at int64) chan struct{} {
	if b := d.cur.Load(); b != nil && b.at >= at && b.at < at+bucketSlack {
		return b.done
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.cur.Load(); b != nil && b.at >= at && b.at < at+bucketSlack {
		return b.done
	}
	const ms = int64(time.Millisecond)
	b := &deadlineBucket{at: (at + ms - 1) / ms * ms, done: make(chan struct{})}
	time.AfterFunc(time.Duration(b.at-now.UnixNano()), func() { close(b.done) })
	d.cur.Store(b)
	return b.done
}
