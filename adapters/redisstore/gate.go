package redisstore

import (
	"sync"
	"sync/atomic"
)

// gate counts the calls running in a Store (Takes, and the calls to Redis
// a Take gave up on at its deadline) and closes: once closed, no call
// enters, and done is closed when the last running call leaves. A call
// enters and leaves with one atomic addition each, so, unlike a
// sync.WaitGroup, entering can never race with a Close already waiting.
type gate struct {
	state atomic.Int64 // running calls, plus closedBit once closed
	once  sync.Once
	done  chan struct{} // closed when closed and no call is running
}

const closedBit = 1 << 62

func newGate() *gate { return &gate{done: make(chan struct{})} }

// enter registers a call; it reports false, registering nothing, once the
// gate is closed.
func (g *gate) enter() bool {
	if g.state.Add(1)&closedBit != 0 {
		g.leave()
		return false
	}
	return true
}

// hold registers a call made by a running call (which keeps the gate from
// draining meanwhile), whether or not the gate is closed.
func (g *gate) hold() { g.state.Add(1) }

// leave unregisters a call registered by enter or hold.
func (g *gate) leave() {
	if g.state.Add(-1) == closedBit {
		g.once.Do(func() { close(g.done) })
	}
}

// close closes the gate and returns a channel closed when no call is
// running any more.
func (g *gate) close() <-chan struct{} {
	if g.state.Or(closedBit) == 0 {
		g.once.Do(func() { close(g.done) })
	}
	return g.done
}

// running returns the number of calls running.
func (g *gate) running() int64 { return g.state.Load() &^ closedBit }
