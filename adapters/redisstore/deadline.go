package redisstore

import (
	"context"
	"errors"
	"fmt"
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

// errAbandoned is the error of a call abandoned when its context ended, by
// callWithin.
var errAbandoned = errors.New("call abandoned at its deadline")

// callWithin runs call bounded by ctx, also for a client that does not
// bound its I/O by the context's deadline (ctxBound false: go-redis without
// ContextTimeoutEnabled): call then runs in a goroutine of its own, on ctx
// without its cancellation, and is abandoned when ctx ends, with an error
// wrapping errAbandoned and ctx's; once an abandoned call has ended, then
// (if not nil) runs. track, if not nil, is called before the goroutine
// starts and returns what to call when it ends (a close waiting for such
// calls counts them so). An abandoned call may run after callWithin has
// returned: it must not use memory the caller reuses.
func callWithin[T any](ctx context.Context, ctxBound bool, track func() (done func()), call func(context.Context) (T, error), then func()) (T, error) {
	if ctxBound || ctx.Done() == nil {
		return call(ctx)
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	var state atomic.Int32 // 0 running, 1 answered, 2 abandoned
	done := func() {}
	if track != nil {
		done = track()
	}
	go func() {
		defer done()
		v, err := call(context.WithoutCancel(ctx))
		if state.CompareAndSwap(0, 1) {
			ch <- result{v, err}
			return
		}
		if then != nil {
			then()
		}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(0, 2) {
			var zero T
			return zero, fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
		}
		r := <-ch // it ended meanwhile
		return r.v, r.err
	}
}
