package core_test

import (
	"math/big"
	"sort"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
)

// The models below restate each algorithm as plainly as possible, with
// exact rational arithmetic and no cleverness: a bucket of tokens that
// refills, a list of timestamps, a map of window counts. The fuzz targets
// replay random traces through a model and through the algorithm and demand
// identical decisions. RetryAfter and ResetAfter come from the model by
// definition: the earliest nanosecond at which the request would be
// admitted, or the quota whole again (found by binary search, since with no
// further traffic both only become more true over time).

type model interface {
	admits(now, cost int64) bool
	remaining(now int64) int64
	delay(now, cost int64) int64 // shaping delay of an admitted request
	charge(now, cost int64)
}

// bucketModel is a token bucket (level 0 = full) or a leaky bucket meter
// (level = water in the bucket): the same arithmetic seen from two sides.
type bucketModel struct {
	capacity, limit int64
	window, slack   int64 // slack: MaxDelay, in ns
	level           *big.Rat
	last            int64
}

func newBucket(p *core.Policy) *bucketModel {
	return &bucketModel{capacity: p.Capacity(), limit: p.Limit(), window: int64(p.Window()), slack: int64(p.MaxDelay()), level: new(big.Rat)}
}

func (m *bucketModel) levelAt(now int64) *big.Rat {
	drained := big.NewRat(now-m.last, 1)
	drained.Mul(drained, big.NewRat(m.limit, m.window))
	l := new(big.Rat).Sub(m.level, drained)
	if l.Sign() < 0 {
		l.SetInt64(0)
	}
	return l
}

func (m *bucketModel) admits(now, cost int64) bool {
	// level + cost <= capacity + slack x rate
	room := new(big.Rat).Mul(big.NewRat(m.slack, 1), big.NewRat(m.limit, m.window))
	room.Add(room, big.NewRat(m.capacity, 1))
	l := m.levelAt(now)
	l.Add(l, big.NewRat(cost, 1))
	return l.Cmp(room) <= 0
}

func (m *bucketModel) remaining(now int64) int64 {
	free := new(big.Rat).Sub(big.NewRat(m.capacity, 1), m.levelAt(now))
	if free.Sign() <= 0 {
		return 0
	}
	return new(big.Int).Quo(free.Num(), free.Denom()).Int64()
}

func (m *bucketModel) delay(now, cost int64) int64 {
	// Time for level (after the charge) to drain down to capacity.
	over := m.levelAt(now)
	over.Add(over, big.NewRat(cost, 1))
	over.Sub(over, big.NewRat(m.capacity, 1))
	if over.Sign() <= 0 {
		return 0
	}
	over.Mul(over, big.NewRat(m.window, m.limit))
	return ceilRat(over)
}

func (m *bucketModel) charge(now, cost int64) {
	m.level = m.levelAt(now)
	m.level.Add(m.level, big.NewRat(cost, 1))
	m.last = now
}

func ceilRat(r *big.Rat) int64 {
	q, rem := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if rem.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

type fixedModel struct {
	limit, window int64
	counts        map[int64]int64
}

func (m *fixedModel) idx(now int64) int64 { return now / m.window }
func (m *fixedModel) admits(now, cost int64) bool {
	return m.counts[m.idx(now)]+cost <= m.limit
}
func (m *fixedModel) remaining(now int64) int64 { return m.limit - m.counts[m.idx(now)] }
func (m *fixedModel) delay(int64, int64) int64  { return 0 }
func (m *fixedModel) charge(now, cost int64)    { m.counts[m.idx(now)] += cost }

// logModel keeps one timestamp per admitted unit.
type logModel struct {
	limit, window int64
	times         []int64
}

func (m *logModel) inWindow(now int64) int64 {
	var n int64
	for _, t := range m.times {
		if t > now-m.window && t <= now {
			n++
		}
	}
	return n
}
func (m *logModel) admits(now, cost int64) bool { return m.inWindow(now)+cost <= m.limit }
func (m *logModel) remaining(now int64) int64   { return m.limit - m.inWindow(now) }
func (m *logModel) delay(int64, int64) int64    { return 0 }
func (m *logModel) charge(now, cost int64) {
	for i := int64(0); i < cost; i++ {
		m.times = append(m.times, now)
	}
}

// counterModel is the sliding window counter with rational weights.
type counterModel struct {
	limit, window int64
	counts        map[int64]int64
}

func (m *counterModel) estimate(now int64) *big.Rat {
	i := now / m.window
	elapsed := now - i*m.window
	w := big.NewRat(m.counts[i-1], 1)
	w.Mul(w, big.NewRat(m.window-elapsed, m.window))
	return w.Add(w, big.NewRat(m.counts[i], 1))
}
func (m *counterModel) admits(now, cost int64) bool {
	e := m.estimate(now)
	return e.Add(e, big.NewRat(cost, 1)).Cmp(big.NewRat(m.limit, 1)) <= 0
}
func (m *counterModel) remaining(now int64) int64 {
	free := new(big.Rat).Sub(big.NewRat(m.limit, 1), m.estimate(now))
	if free.Sign() <= 0 {
		return 0
	}
	return new(big.Int).Quo(free.Num(), free.Denom()).Int64()
}
func (m *counterModel) delay(int64, int64) int64 { return 0 }
func (m *counterModel) charge(now, cost int64)   { m.counts[now/m.window] += cost }

func newModel(p *core.Policy) model {
	l, w := p.Limit(), int64(p.Window())
	switch p.Algorithm() {
	case core.TokenBucket, core.LeakyBucket:
		return newBucket(p)
	case core.FixedWindow:
		return &fixedModel{limit: l, window: w, counts: map[int64]int64{}}
	case core.SlidingWindowLog:
		return &logModel{limit: l, window: w}
	case core.SlidingWindowCounter:
		return &counterModel{limit: l, window: w, counts: map[int64]int64{}}
	}
	panic("no model for " + p.Algorithm().Name())
}

// earliest returns the least t in [from, from+horizon] with ok(t), or -1.
func earliest(from, horizon int64, ok func(int64) bool) int64 {
	lo, hi := from, from+horizon
	if !ok(hi) {
		return -1
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func modelDecide(m model, p *core.Policy, now, cost int64) core.Decision {
	d := core.Decision{Limit: p.Capacity(), Policy: p}
	horizon := 3*int64(p.Window()) + int64(p.MaxDelay()) + int64(time.Duration(p.Capacity())*p.Window()/time.Duration(p.Limit())) + 1
	if m.admits(now, cost) {
		d.Allowed = true
		d.Delay = time.Duration(m.delay(now, cost))
		m.charge(now, cost)
	} else {
		t := earliest(now, horizon, func(t int64) bool { return m.admits(t, cost) })
		d.RetryAfter = time.Duration(t - now)
	}
	d.Remaining = m.remaining(now)
	t := earliest(now, horizon, func(t int64) bool { return m.remaining(t) == p.Capacity() })
	d.ResetAfter = time.Duration(t - now)
	return d
}

// replay decodes a fuzz input into a rule and a trace and compares the
// algorithm with its model.
func replay(t *testing.T, alg core.Algorithm, data []byte) {
	if len(data) < 4 {
		return
	}
	limit := int64(data[0]%12) + 1
	window := (time.Duration(data[1]%50) + 1) * 7 * time.Millisecond
	r := core.Rule{Name: "m", Algorithm: alg, Limit: limit, Window: window}
	if alg == core.TokenBucket || alg == core.LeakyBucket {
		r.Burst = int64(data[2] % 10) // 0 means the default
	}
	if alg == core.LeakyBucket && data[2]&0x80 != 0 {
		r.MaxDelay = time.Duration(data[3]%20) * 5 * time.Millisecond
	}
	p, err := core.NewPolicy(r)
	if err != nil {
		t.Fatalf("rule %+v: %v", r, err)
	}
	m := newModel(p)
	var st core.State
	now := int64(1_700_000_000) * int64(time.Second)
	for i := 4; i+1 < len(data); i += 2 {
		// Steps of 0 to ~window/2, with odd nanoseconds to stress rounding.
		now += int64(data[i]) * int64(window) / 500
		if data[i]&1 == 1 {
			now += int64(data[i+1]) * 997
		}
		cost := int64(data[i+1])%p.Capacity() + 1
		want := modelDecide(m, p, now, cost)
		var got core.Decision
		alg.Decide(p, &st, cost, now, true, &got)
		if got != want {
			t.Fatalf("%s %v step %d (now %d, cost %d):\n got %+v\nwant %+v", alg.Name(), p, (i-4)/2, now, cost, got, want)
		}
	}
}

func fuzzSeeds(f *testing.F) {
	f.Add([]byte{3, 10, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 200, 2, 5, 1, 255, 0})
	f.Add([]byte{11, 1, 5, 0, 1, 3, 3, 7, 9, 2, 44, 1, 0, 9, 0, 9, 0, 9, 250, 250})
	f.Add([]byte{0, 49, 0x85, 7, 0, 0, 0, 0, 0, 0, 10, 1, 10, 2, 100, 3, 31, 4})
	f.Add([]byte{7, 3, 0x83, 19, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5})
	f.Add([]byte{5, 20, 9, 1, 13, 77, 200, 1, 201, 2, 202, 3, 203, 4, 1, 1, 1, 1, 99, 99})
}

func FuzzTokenBucket(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { replay(t, core.TokenBucket, data) })
}

func FuzzLeakyBucket(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { replay(t, core.LeakyBucket, data) })
}

func FuzzFixedWindow(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { replay(t, core.FixedWindow, data) })
}

func FuzzSlidingWindowLog(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { replay(t, core.SlidingWindowLog, data) })
}

func FuzzSlidingWindowCounter(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { replay(t, core.SlidingWindowCounter, data) })
}

// TestModelsLongTraces replays long pseudo-random traces, beyond what the
// seed corpus covers, on every normal test run.
func TestModelsLongTraces(t *testing.T) {
	var x uint64 = 0x9E3779B97F4A7C15
	for _, alg := range core.Algorithms() {
		for trial := 0; trial < 20; trial++ {
			data := make([]byte, 400)
			for i := range data {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				data[i] = byte(x)
			}
			replay(t, alg, data)
		}
	}
}

// TestSlidingCounterApproximation measures how far the sliding window
// counter strays from the exact sliding log on uniform random traffic: it
// may admit differently, but over a long trace the admitted totals stay
// within a few percent of each other.
func TestSlidingCounterApproximation(t *testing.T) {
	pc := core.MustPolicy(core.Rule{Name: "c", Algorithm: core.SlidingWindowCounter, Limit: 100, Window: time.Second})
	pl := core.MustPolicy(core.Rule{Name: "l", Algorithm: core.SlidingWindowLog, Limit: 100, Window: time.Second})
	var sc, sl core.State
	var nc, nl int
	now := int64(1_700_000_000) * int64(time.Second)
	var x uint64 = 42
	var gaps []int64
	for i := 0; i < 200_000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		gap := int64(x>>33) % int64(20*time.Millisecond)
		gaps = append(gaps, gap)
		now += gap
		var d core.Decision
		if pc.Algorithm().Decide(pc, &sc, 1, now, true, &d); d.Allowed {
			nc++
		}
		if pl.Algorithm().Decide(pl, &sl, 1, now, true, &d); d.Allowed {
			nl++
		}
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	ratio := float64(nc) / float64(nl)
	t.Logf("sliding counter admitted %d, sliding log %d (ratio %.4f)", nc, nl, ratio)
	if ratio < 0.95 || ratio > 1.05 {
		t.Fatalf("sliding counter admitted %d vs exact log %d: ratio %.4f outside [0.95, 1.05]", nc, nl, ratio)
	}
}

// TestSlidingCounterLargeCounts checks counts at and above 2^31, where a
// signed unpacking of the two counters would turn negative.
func TestSlidingCounterLargeCounts(t *testing.T) {
	p := core.MustPolicy(core.Rule{Name: "big", Algorithm: core.SlidingWindowCounter, Limit: 1<<32 - 1, Window: time.Hour})
	m := newModel(p)
	var st core.State
	now := int64(1_800_000_000) * int64(time.Second)
	for _, step := range []struct {
		at   time.Duration
		cost int64
	}{{0, 1 << 31}, {61 * time.Minute, 1}, {62 * time.Minute, 1}, {62 * time.Minute, 1<<32 - 3}, {3 * time.Hour, 1<<32 - 1}} {
		at := now + int64(step.at)
		want := modelDecide(m, p, at, step.cost)
		var got core.Decision
		p.Algorithm().Decide(p, &st, step.cost, at, true, &got)
		if got != want {
			t.Fatalf("+%v cost %d:\n got %+v\nwant %+v", step.at, step.cost, got, want)
		}
	}
}

// TestClockStepsBack drives every algorithm through random traces in which
// the clock jumps back (a little, far, or to before 1970): the step never
// raises Remaining, a refusal's RetryAfter stays within the policy's
// recovery time, and one recovery time after the first committed decision
// at the earlier time the key is whole again.
func TestClockStepsBack(t *testing.T) {
	var x uint64 = 0x2545F4914F6CDD1D
	rnd := func(n int64) int64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return int64(x % uint64(n))
	}
	for _, alg := range core.Algorithms() {
		for trial := 0; trial < 300; trial++ {
			r := core.Rule{Name: "back", Algorithm: alg, Limit: 1 + rnd(12), Window: time.Duration(1+rnd(50)) * 7 * time.Millisecond}
			if alg == core.TokenBucket || alg == core.LeakyBucket {
				r.Burst = rnd(10)
			}
			if alg == core.LeakyBucket && rnd(2) == 0 {
				r.MaxDelay = time.Duration(rnd(20)) * 5 * time.Millisecond
			}
			p := core.MustPolicy(r)
			rec := int64(storetest.Recovery(p))
			var st core.State
			var d core.Decision
			now := int64(1_700_000_000) * int64(time.Second)
			for i := rnd(20); i >= 0; i-- {
				now += rnd(int64(r.Window) / 2)
				alg.Decide(p, &st, 1+rnd(p.Capacity()), now, true, &d)
			}
			alg.Decide(p, &st, 0, now, false, &d)
			before := d.Remaining
			var back int64
			switch rnd(3) {
			case 0:
				back = now - rnd(3*int64(r.Window))
			case 1:
				back = now - rnd(int64(100*365*24*time.Hour))
			default:
				back = -rnd(int64(50 * 365 * 24 * time.Hour))
			}
			alg.Decide(p, &st, 0, back, false, &d)
			if d.Remaining > before {
				t.Fatalf("%v: stepping back from %d to %d raised Remaining %d -> %d", p, now, back, before, d.Remaining)
			}
			// A state at most ClockTolerance ahead of back, which a state
			// written at most rec before now may be, is read at its own
			// time (see core.ClockTolerance): up to that much longer.
			if now-back <= int64(core.ClockTolerance)+rec {
				rec += int64(core.ClockTolerance)
			}
			cost := 1 + rnd(p.Capacity())
			alg.Decide(p, &st, cost, back, true, &d)
			if !d.Allowed && (d.RetryAfter <= 0 || int64(d.RetryAfter) > rec) {
				t.Fatalf("%v: after stepping back to %d, cost %d refused with RetryAfter %v, beyond recovery %v", p, back, cost, d.RetryAfter, time.Duration(rec))
			}
			alg.Decide(p, &st, 0, back+rec, false, &d)
			if d.Remaining != p.Capacity() || d.ResetAfter != 0 {
				t.Fatalf("%v: one recovery time (%v) after stepping back to %d: %+v, want whole", p, time.Duration(rec), back, d)
			}
		}
	}
}
