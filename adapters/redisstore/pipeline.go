package redisstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxPipeline bounds the script calls one pipeline carries.
const maxPipeline = 128

// pipeliner sends the script calls of concurrent decisions together
// (Config.Pipeline), on a single-node or failover client (a pipeline
// across nodes would wait for the slowest). A call that finds fewer than
// lanes calls or pipelines in flight is sent at once, alone, as without a
// pipeliner. A call that finds them all busy waits in the queue, and the
// first lane to come free sends everything waiting as one pipeline: one
// write and one read for the lot, on the client and on the server. Each
// call stays a script call of its own, atomic on its own, and is sent once
// (noRetryInts: go-redis retries no pipeline holding one).
//
// With linger set (the default, adaptive pipeliner), waiting must be
// short: a call beyond lanes joins the queue only while lanes have come
// free at least every linger on average and the last one at most linger
// ago; otherwise it is sent at once, alone, on a lane of its own. And the
// queue waits at most about linger for a lane: then it goes out as one
// pipeline on a lane of its own. So under load, when the server is slow
// to answer because it is busy, lanes come free often and calls share
// pipelines; with a distant server and few callers, lanes come free
// rarely and each call goes alone, as without a pipeliner. The lanes in
// use never exceed the calls running, which the store's gate bounds by the
// client's pool.
type pipeliner struct {
	client  redis.UniversalClient
	gate    *gate
	timeout time.Duration // the longest a pipeline's I/O may take; <= 0: no bound of ours
	lanes   int
	linger  time.Duration        // > 0: the adaptive pipeliner's longest usual wait
	now     func() time.Duration // the monotonic clock of linger's decisions

	mu    sync.Mutex
	busy  int // lanes in use
	queue []*pipeCall

	// The adaptive pipeliner's state (linger > 0), guarded by mu.
	lastFree time.Duration // when a lane last came free; 0: never
	gap      time.Duration // moving average of the intervals between lanes coming free
	qsince   time.Duration // when the queue last became non-empty
	timer    *time.Timer   // sends a queue that waited linger; nil until first needed
	armed    bool          // timer is set
}

// Adaptive pipelining (Config.Pipeline 0): the lanes in flight before a
// call may wait, and the longest a call usually waits for a pipeline.
const (
	autoLanes  = 4
	autoLinger = 100 * time.Microsecond
)

// newPipeliner returns a pipeliner of lanes lanes for the store's client
// and gate, adaptive with linger > 0.
func newPipeliner(client redis.UniversalClient, g *gate, timeout time.Duration, lanes int, linger time.Duration) *pipeliner {
	return &pipeliner{client: client, gate: g, timeout: timeout, lanes: lanes, linger: linger, now: monotonic}
}

// monoBase anchors monotonic.
var monoBase = time.Now()

// monotonic returns the time elapsed on the monotonic clock since the
// process set monoBase: never 0 once a call has been made.
func monotonic() time.Duration { return time.Since(monoBase) + 1 }

// pipeCall is one script call waiting for, or carried by, a pipeline.
type pipeCall struct {
	ctx    context.Context // the caller's
	script *boxedScript
	args   []any // a copy: the caller's buffer is free once it returns
	cmd    *redis.IntSliceCmd
	res    []int64
	err    error
	state  callState     // guarded by pipeliner.mu
	run    *pipeRun      // the pipeline carrying it with others, once callSent; nil alone
	done   chan struct{} // signalled once the call is callDone
}

// pipeRun is the round trip of a pipeline of several calls, as the
// breaker sees it: its failure is one failure of Redis, however many calls
// it carries. Each failed call's error is a pipeFault naming it, and the
// breaker counts the first of them it would count (not a caller gone, nor
// a reply about one call's content) and leaves out the others
// (countedBefore).
type pipeRun struct {
	counted atomic.Bool
	faulted bool // a pipeFault names it: the next pipeline needs another (guarded by pipeliner.mu)
}

// pipeFault is the failure of a call carried by a pipeline of several: it
// reads and matches (errors.Is, errors.As) as the failure itself.
type pipeFault struct {
	err error
	run *pipeRun
}

func (f *pipeFault) Error() string { return f.err.Error() }
func (f *pipeFault) Unwrap() error { return f.err }

// countedBefore reports whether err is the failure of a pipelined call
// whose round trip the breaker has already counted, and otherwise marks
// that round trip counted, err being the failure that counts it. The
// breaker asks only about the errors it would count.
func countedBefore(err error) bool {
	if err == nil {
		return false // before f, which escapes: a success allocates nothing
	}
	var f *pipeFault
	return errors.As(err, &f) && f.run.counted.Swap(true)
}

type callState uint8

const (
	callQueued    callState = iota // in the queue
	callSent                       // taken by a pipeline
	callDone                       // answered; done is signalled
	callAbandoned                  // sent, but its caller left: dropped when answered
)

var pipeCalls = sync.Pool{New: func() any { return &pipeCall{done: make(chan struct{}, 1)} }}

func (c *pipeCall) recycle() {
	clear(c.args)
	c.args, c.ctx, c.script, c.cmd, c.res, c.err, c.run = c.args[:0], nil, nil, nil, nil, nil, nil
	pipeCalls.Put(c)
}

// do runs the script sc with args as eval does, alone when a lane is free
// and in the next pipeline otherwise. It returns ctx's error if ctx ends
// first: a call still queued is then never sent, and one already sent is
// left to run, its answer dropped.
func (p *pipeliner) do(ctx context.Context, sc *boxedScript, args []any) ([]int64, error) {
	p.mu.Lock()
	if p.busy < p.lanes || (p.linger > 0 && !p.soon(p.now())) {
		p.busy++
		p.mu.Unlock()
		defer p.free() // even if a hook panics
		return eval(ctx, p.client, sc, args)
	}
	c := pipeCalls.Get().(*pipeCall)
	c.ctx, c.script, c.args, c.state = ctx, sc, append(c.args, args...), callQueued
	if len(p.queue) == 0 && p.linger > 0 {
		p.qsince = p.now()
		p.arm(p.linger)
	}
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		p.mu.Lock()
		switch c.state {
		case callQueued:
			if i := slices.Index(p.queue, c); i >= 0 {
				p.queue = slices.Delete(p.queue, i, i+1)
			}
			p.mu.Unlock()
			c.recycle()
			return nil, ctx.Err()
		case callSent:
			c.state = callAbandoned // the pipeline recycles it
			err := ctx.Err()
			if c.run != nil {
				err = &pipeFault{err, c.run} // the round trip outlasted a deadline
				c.run.faulted = true
			}
			p.mu.Unlock()
			return nil, err
		}
		p.mu.Unlock() // callDone: the answer is here
		<-c.done
	}
	res, err := c.res, c.err
	c.recycle()
	return res, err
}

// free gives back a lane after a call sent alone: to a pipeline of the
// calls that queued meanwhile, or to the pool of free lanes. It is called
// within a running Take, which keeps the gate from draining.
func (p *pipeliner) free() {
	p.mu.Lock()
	p.freed()
	if len(p.queue) == 0 {
		p.busy--
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.gate.hold()
	go p.drain()
}

// drain sends the queue in pipelines, on the lane it was given, until the
// queue is empty. A call whose caller's context has ended is answered with
// its error instead of being sent.
func (p *pipeliner) drain() {
	defer p.gate.leave()
	var batch [maxPipeline]*pipeCall
	var run *pipeRun // the pipelines' in turn, until a failure names one
	for sent := false; ; sent = true {
		p.mu.Lock()
		if sent {
			p.freed() // the lane's last pipeline is over
		}
		if len(p.queue) == 0 {
			p.busy--
			p.mu.Unlock()
			return
		}
		taken, n := 0, 0
		for _, c := range p.queue {
			if n == maxPipeline {
				break
			}
			taken++
			if err := ended(c.ctx); err != nil {
				c.err, c.state = err, callDone
				c.done <- struct{}{}
				continue
			}
			c.state = callSent
			batch[n] = c
			n++
		}
		if n > 1 {
			// A new one after a failure: the breaker may ask about that
			// failure after the next pipeline has gone out.
			if run == nil || run.faulted {
				run = new(pipeRun)
			}
			for _, c := range batch[:n] {
				c.run = run
			}
		}
		rest := copy(p.queue, p.queue[taken:])
		clear(p.queue[rest:])
		p.queue = p.queue[:rest]
		p.mu.Unlock()
		if n == 0 {
			continue
		}
		p.send(batch[:n])
		p.mu.Lock()
		for _, c := range batch[:n] {
			if c.state == callAbandoned {
				c.recycle()
				continue
			}
			if c.err != nil && c.run != nil {
				c.err = &pipeFault{c.err, c.run}
				c.run.faulted = true
			}
			c.state = callDone
			c.done <- struct{}{}
		}
		p.mu.Unlock()
		clear(batch[:n])
	}
}

// freed records, for the adaptive pipeliner, that a lane came free. The
// average's intervals are counted at most 16 lingers long, so that after
// an idle spell the pipeliner knows within a few dozen calls that lanes
// come free often again. It is called with mu held.
func (p *pipeliner) freed() {
	if p.linger <= 0 {
		return
	}
	t := p.now()
	d := 16 * p.linger
	if p.lastFree != 0 && t-p.lastFree < d {
		d = t - p.lastFree
	}
	if p.lastFree == 0 {
		p.gap = d
	} else {
		p.gap += (d - p.gap) / 8
	}
	p.lastFree = t
}

// soon reports whether, at t, a lane is likely to come free within
// linger: one came free at most linger ago, and on average they do every
// linger or more often. It is called with mu held.
func (p *pipeliner) soon(t time.Duration) bool {
	return p.lastFree != 0 && t-p.lastFree <= p.linger && p.gap <= p.linger
}

// arm sets the timer to go off after d, unless it is set. It is called
// with mu held.
func (p *pipeliner) arm(d time.Duration) {
	if p.armed {
		return
	}
	p.armed = true
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.late)
		return
	}
	p.timer.Reset(d)
}

// late sends, on a lane of its own, a queue that has waited linger for a
// lane to come free, and sets the timer again for a queue that has not
// waited so long yet. A queue holds callers within running Takes, so the
// gate cannot have drained.
func (p *pipeliner) late() {
	p.mu.Lock()
	p.armed = false
	if len(p.queue) == 0 {
		p.mu.Unlock()
		return
	}
	if w := p.now() - p.qsince; w < p.linger {
		p.arm(p.linger - w)
		p.mu.Unlock()
		return
	}
	p.busy++
	p.gate.hold()
	p.mu.Unlock()
	go p.drain()
}

// send runs calls in one pipeline with EVALSHA, and those the server did
// not have the script for (NOSCRIPT: nothing ran) in a second one with
// EVAL, which also caches it, unless their callers have left. The
// pipelines' I/O is bounded by the latest deadline of the calls (each
// caller's, which includes the store's Timeout), and by timeout from now.
func (p *pipeliner) send(calls []*pipeCall) {
	p.exec(calls, false)
	var again [maxPipeline]*pipeCall
	n := 0
	for _, c := range calls {
		if c.err == nil || !isNoScript(c.err) {
			continue
		}
		if err := ended(c.ctx); err != nil { // its caller has left, or is leaving
			c.err = err
			continue
		}
		again[n] = c
		n++
	}
	if n > 0 {
		p.exec(again[:n], true)
	}
}

// ended returns ctx's error, or context.DeadlineExceeded once its deadline
// has passed even if ctx does not say so yet (the store's timeout contexts
// close Done a moment late).
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// deadline returns when the I/O of a pipeline of calls must end: the
// latest of their deadlines, and at most timeout from now. It reports
// false for no bound (no timeout, and a call without a deadline).
func (p *pipeliner) deadline(calls []*pipeCall) (time.Time, bool) {
	var limit, latest time.Time
	if p.timeout > 0 {
		limit = time.Now().Add(p.timeout)
	}
	for _, c := range calls {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return limit, !limit.IsZero()
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if !limit.IsZero() && latest.After(limit) {
		latest = limit
	}
	return latest, true
}

// exec runs calls in one pipeline, its I/O bounded as deadline says, and
// sets their answers: with EVAL and the script's source if source is set,
// with EVALSHA otherwise.
func (p *pipeliner) exec(calls []*pipeCall, source bool) {
	ctx := context.Background()
	if dl, ok := p.deadline(calls); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	pipe := p.client.Pipeline()
	for _, c := range calls {
		if source {
			c.args[0], c.args[1] = evalArg, c.script.source
		} else {
			c.args[0], c.args[1] = evalshaArg, c.script.hash
		}
		c.cmd = redis.NewIntSliceCmd(ctx, c.args...)
		_ = pipe.Process(ctx, noRetryInts{c.cmd})
	}
	_, execErr := pipe.Exec(ctx)
	for _, c := range calls {
		c.res, c.err = c.cmd.Val(), c.cmd.Err()
		if c.err == nil && len(c.res) == 0 && execErr != nil {
			// a call the failed pipeline left unanswered
			c.res, c.err = nil, execErr
		}
	}
}
