package core

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// listOnly makes every shard of m keep all its keys in its golang-lru list,
// as a KeepActive store does, while m keeps its own eviction (the order one
// list holding every key gives, which the ring must reproduce), and makes
// m hash keys as like does.
func listOnly(m, like *MemoryStore) *MemoryStore {
	m.seed = like.seed
	for i := range m.shards {
		m.shards[i].ringed = false
	}
	return m
}

// A store whose new keys enter the ring decides, holds and evicts exactly
// as one keeping every key in its list: the same decisions, errors and
// evictions, the same keys in the same order of use with the same stamps,
// under random decisions, batches, refunds, peeks and resets over more keys
// than it holds, and across restamps, with and without an Observer.
func TestMemRingMatchesList(t *testing.T) {
	for _, c := range []MemoryConfig{
		{Capacity: 1}, {Capacity: 2}, {Capacity: 7}, {Capacity: 16},
		{Capacity: 16, Observer: NopObserver{}},
		{Capacity: 2*minSpan + 2}, {Capacity: 4*ringMin + 5},
	} {
		c.Shards = 1
		t.Run(fmt.Sprintf("%d,Observer=%v", c.Capacity, c.Observer != nil), func(t *testing.T) {
			ringed := MustMemoryStore(&c)
			rc, lc := &recordingObserver{}, &recordingObserver{}
			if c.Observer != nil {
				c.Observer = rc
				ringed = MustMemoryStore(&c)
				c.Observer = lc
			}
			list := listOnly(MustMemoryStore(&c), ringed)
			rng := rand.New(rand.NewPCG(3, uint64(c.Capacity)))
			var pols []*Policy
			for _, r := range []Rule{
				{Name: "a", Limit: 5, Window: time.Second},
				{Name: "a", Limit: 3, Window: time.Second, Algorithm: SlidingWindowLog},
				{Name: "a", Limit: 4, Window: 10 * time.Second, Algorithm: FixedWindow},
				{Name: "b", Limit: 6, Window: time.Minute, Algorithm: LeakyBucket},
				{Name: "b", Limit: 2, Window: time.Minute, Algorithm: SlidingWindowCounter},
			} {
				pols = append(pols, MustPolicy(r))
			}
			ctx := context.Background()
			now := time.Unix(1_700_000_000, 0)
			// A few keys are busy, the rest arrive once or twice.
			nkeys := 3*c.Capacity + 10
			var a, b [4]Decision
			listed, inRing := 0, 0
			for step := 0; step < 6000; step++ {
				now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
				if step%1000 == 500 {
					// A restamp within the next few keys gone to the front.
					tick := (ringed.shards[0].tick/restampEvery+1)*restampEvery - 1 - uint64(rng.IntN(3))
					ringed.shards[0].tick, list.shards[0].tick = tick, tick
				}
				req := func() Request {
					k := rng.IntN(nkeys)
					if rng.IntN(3) == 0 {
						k = rng.IntN(3)
					}
					return Request{Policy: pols[rng.IntN(len(pols))], Key: fmt.Sprint("k", k), Cost: 1 + int64(rng.IntN(2))}
				}
				var errA, errB error
				var n int
				switch op := rng.IntN(20); {
				case op < 12:
					r := []Request{req()}
					n = 1
					errA, errB = ringed.Take(ctx, now, r, a[:1]), list.Take(ctx, now, r, b[:1])
				case op < 16:
					batch := []Request{req(), req(), req(), req()}[:2+rng.IntN(3)]
					n = len(batch)
					errA, errB = ringed.Take(ctx, now, batch, a[:n]), list.Take(ctx, now, batch, b[:n])
				case op < 18:
					r := []Request{req()}
					errA, errB = ringed.Refund(ctx, now, r), list.Refund(ctx, now, r)
				case op < 19:
					r := []Request{req()}
					n = 1
					errA, errB = ringed.Peek(ctx, now, r, a[:1]), list.Peek(ctx, now, r, b[:1])
				default:
					r := req()
					errA, errB = ringed.Reset(ctx, r.Policy, r.Key), list.Reset(ctx, r.Policy, r.Key)
				}
				if fmt.Sprint(errA) != fmt.Sprint(errB) {
					t.Fatalf("step %d: error %v, list-only %v", step, errA, errB)
				}
				for i := 0; i < n; i++ {
					if a[i] != b[i] {
						t.Fatalf("step %d: decision %+v, list-only %+v", step, a[i], b[i])
					}
				}
				rs, ls := &ringed.shards[0], &list.shards[0]
				ro, lo := order(t, rs), order(t, ls)
				if !slices.Equal(ro, lo) {
					t.Fatalf("step %d: order of use %x, list-only %x", step, ro, lo)
				}
				for _, h := range ro {
					x, _ := rs.stampOf(h)
					y, _ := ls.stampOf(h)
					if x != y {
						t.Fatalf("step %d: key %x stamp %d, list-only %d", step, h, x, y)
					}
				}
				if ringed.Evictions() != list.Evictions() {
					t.Fatalf("step %d: %d evictions, list-only %d", step, ringed.Evictions(), list.Evictions())
				}
				checkShard(t, rs)
				listed, inRing = max(listed, rs.lru.Len()), max(inRing, rs.ring.live)
			}
			if c.Observer != nil && fmt.Sprint(rc.events()) != fmt.Sprint(lc.events()) {
				t.Fatalf("eviction events differ:\n%v\n%v", rc.events(), lc.events())
			}
			if ringed.Evictions() == 0 || listed == 0 || inRing == 0 {
				t.Fatalf("the trace did not exercise both orders and eviction: %d evictions, at most %d keys listed, %d in the ring",
					ringed.Evictions(), listed, inRing)
			}
		})
	}
}

// recordingObserver records eviction events.
type recordingObserver struct {
	NopObserver
	evs []EvictionEvent
}

func (o *recordingObserver) ObserveEviction(e EvictionEvent) { o.evs = append(o.evs, e) }

func (o *recordingObserver) events() []EvictionEvent { return o.evs }

// Stale ring entries (keys gone to the list, keys reset, keys reset and
// added again) do not survive a restamp, which could otherwise give a
// stale entry its key's stamp: after it, the order of use is still each
// key once, oldest first, in the order one list would keep (k5, added
// again after k0 to k3 went to the list, stays behind them), and the
// oldest key is evicted first.
func TestMemRingRestamp(t *testing.T) {
	m, s, do := oneShard(t, MemoryConfig{Capacity: 16})
	p := MustPolicy(Rule{Name: "r", Limit: 1 << 20, Window: time.Hour})
	take := func(k string) { do(Request{Policy: p, Key: k, Cost: 1}) }
	hash := func(k string) uint64 { return m.hash(&Request{Policy: p, Key: k}) }
	for i := 0; i < 16; i++ {
		take(fmt.Sprint("k", i))
	}
	// k0 to k3 drift and go to the list; k4 and k5 are reset, and k5
	// comes back: stale entries for all six, behind live ones.
	s.tick += 100
	for i := 0; i < 4; i++ {
		take(fmt.Sprint("k", i))
	}
	m.Reset(context.Background(), p, "k4")
	m.Reset(context.Background(), p, "k5")
	take("k5")
	if s.ring.n <= s.ring.live {
		t.Fatalf("no stale entries: %d entries, %d live", s.ring.n, s.ring.live)
	}
	checkShard(t, s)
	// Jump to just before a restamp: every key has drifted.
	s.tick = restampEvery - 1
	take("k6") // drifted: to the list, through the restamp
	checkShard(t, s)
	// The compaction kept k6's entry, live until its slot took its new
	// stamp: no other stale entry is left.
	if s.ring.n != s.ring.live+1 {
		t.Fatalf("%d ring entries after a restamp, %d live", s.ring.n, s.ring.live)
	}
	want := []uint64{}
	for _, k := range []string{"k7", "k8", "k9", "k10", "k11", "k12", "k13", "k14", "k15", "k0", "k1", "k2", "k3", "k5", "k6"} {
		want = append(want, hash(k))
	}
	if got := order(t, s); !slices.Equal(got, want) {
		t.Fatalf("order after the restamp:\n got %x\nwant %x", got, want)
	}
	// Two new keys fill the shard and evict k7, the oldest.
	take("n1")
	take("n2")
	if s.holds(hash("k7")) || !s.holds(hash("k8")) {
		t.Fatal("the oldest key was not the one evicted")
	}
	checkShard(t, s)
}

// A flood of new keys grows the ring; once they all go to the list, the
// ring shrinks back to ringMin entries: it never holds more than four
// entries per key it holds.
func TestMemRingShrinks(t *testing.T) {
	const capacity = 64 * ringMin
	m, s, do := oneShard(t, MemoryConfig{Capacity: capacity})
	p := MustPolicy(Rule{Name: "r", Limit: 1 << 20, Window: time.Hour})
	for i := 0; i < capacity; i++ {
		do(Request{Policy: p, Key: fmt.Sprint(i), Cost: 1})
	}
	if s.ring.live != capacity || len(s.ring.h) < capacity {
		t.Fatalf("%d keys in a ring of %d entries, want %d", s.ring.live, len(s.ring.h), capacity)
	}
	s.tick += capacity // every key has drifted
	for i := 0; i < capacity; i++ {
		do(Request{Policy: p, Key: fmt.Sprint(i), Cost: 1})
		if i%97 == 0 {
			order(t, s) // checks the ring's size against its keys
		}
	}
	if s.ring.live != 0 || len(s.ring.h) != ringMin || s.lru.Len() != capacity || m.Len() != capacity {
		t.Fatalf("%d keys in a ring of %d entries, %d listed, %d held", s.ring.live, len(s.ring.h), s.lru.Len(), m.Len())
	}
	checkShard(t, s)
}

// A new key evicting a key used once allocates nothing; with KeepActive
// (every key in the list) it allocates its list entry.
func TestMemRingNewKeyAllocs(t *testing.T) {
	for _, keep := range []bool{false, true} {
		m := MustMemoryStore(&MemoryConfig{Capacity: 1024, Shards: 1, KeepActive: keep})
		p := MustPolicy(Rule{Name: "a", Limit: 1 << 20, Window: time.Nanosecond * 1 << 20})
		reqs := []Request{{Policy: p, Cost: 1}}
		var out [1]Decision
		ctx := context.Background()
		t0 := time.Unix(1_700_000_000, 0)
		keys := make([]string, 8192)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%014d", i)
		}
		i := 0
		next := func() {
			reqs[0].Key = keys[i]
			i++
			if err := m.Take(ctx, t0.Add(time.Duration(i)*time.Second), reqs, out[:]); err != nil || !out[0].Allowed {
				t.Fatalf("key %d: %v, %+v", i, err, out[0])
			}
		}
		for range 4096 { // fill the store, then overflow it
			next()
		}
		want := 0.0
		if keep {
			want = 1
		}
		if n := testing.AllocsPerRun(1000, next); n != want {
			t.Errorf("KeepActive %v: a new key: %v allocations, want %v", keep, n, want)
		}
	}
}

// Across a restamp, a key used once (in the ring) and a key gone to the
// list, both drifted, keep their order: the store evicts the list's key,
// used before the ring's was added, first, as one list would.
func TestMemRingRestampKeepsListOrder(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	p := MustPolicy(Rule{Name: "r", Limit: 1 << 20, Window: time.Hour})
	ringed := MustMemoryStore(&MemoryConfig{Capacity: 16, Shards: 1})
	list := listOnly(MustMemoryStore(&MemoryConfig{Capacity: 16, Shards: 1}), ringed)
	stores := []*MemoryStore{ringed, list}
	take := func(k string) {
		for _, m := range stores {
			var out [1]Decision
			if err := m.Take(ctx, now, []Request{{Policy: p, Key: k, Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 16; i++ {
		take(fmt.Sprint("k", i))
	}
	for _, m := range stores {
		m.shards[0].tick += 100
	}
	take("k0") // drifted: to the list
	for _, m := range stores {
		if err := m.Reset(ctx, p, "k1"); err != nil {
			t.Fatal(err)
		}
	}
	take("k16") // a key used once, added after k0 last went to the front
	for _, m := range stores {
		m.shards[0].tick = restampEvery - 1
	}
	take("k2") // drifted: to the list, through the restamp
	if got, want := order(t, &ringed.shards[0]), order(t, &list.shards[0]); !slices.Equal(got, want) {
		t.Fatalf("order after the restamp %x, one list's %x", got, want)
	}
	// Every key has recovered: each new key drops the oldest.
	now = now.Add(2 * time.Hour)
	hash := func(k string) uint64 { return ringed.hash(&Request{Policy: p, Key: k}) }
	for i := 0; i < 14; i++ {
		take(fmt.Sprint("new", i))
		for _, k := range []string{"k0", "k16"} {
			if r, l := ringed.shards[0].holds(hash(k)), list.shards[0].holds(hash(k)); r != l {
				t.Fatalf("after %d new keys: %s held %v with the ring, %v with one list", i+1, k, r, l)
			}
		}
	}
	checkShard(t, &ringed.shards[0])
}

// A refund by charge of a key evicted, holding state, since the charge
// gives nothing back: the key's record, made again after the eviction,
// holds only later charges. A refund of a key not evicted since its charge
// still gives its charge back, and a shard that has evicted more keys than
// its log holds since a charge keeps that charge.
func TestMemoryRefundAfterEviction(t *testing.T) {
	p := MustPolicy(Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Hour})
	m, at, takeD, refund := refundTrace(t, 4, p)
	s := &m.shards[0]
	take := func(k string, now time.Time) bool { t.Helper(); return takeD(k, now).Allowed }
	// A refund with no eviction since: given back.
	take("a", at(0))
	take("a", at(time.Second))
	refund("a", at(time.Second), at(2*time.Second))
	if !take("a", at(3*time.Second)) {
		t.Fatal("a refund with no eviction since its charge gave nothing back")
	}
	// x is charged, then evicted by four other keys holding state, then
	// charged twice anew: its fresh record is full.
	take("x", at(4*time.Second))
	for i := 0; i < 4; i++ {
		take(fmt.Sprint("f", i), at(5*time.Second))
	}
	if s.holds(m.hash(&Request{Policy: p, Key: "x"})) || m.Evictions() == 0 {
		t.Fatal("x was not evicted")
	}
	if !take("x", at(6*time.Second)) || !take("x", at(6*time.Second)) {
		t.Fatal("x's fresh record refused")
	}
	refund("x", at(4*time.Second), at(7*time.Second))
	if take("x", at(8*time.Second)) {
		t.Fatal("the refund of a charge made before x's eviction gave back one of the later charges")
	}
	// More evictions than the log holds since a charge: kept. A charge
	// made more than ClockTolerance after them: given back.
	take("y", at(9*time.Second))
	for i := 0; i < 2*evictLogSize; i++ {
		take(fmt.Sprint("g", i), at(10*time.Second))
	}
	take("y", at(12*time.Second)) // y, evicted among them, is back with one charge
	refund("y", at(12*time.Second), at(13*time.Second))
	if !take("y", at(14*time.Second)) || !take("y", at(14*time.Second)) {
		// The refund of the later charge is given back: y holds no
		// charge, then two.
		t.Fatal("a refund of a charge made after the evictions was not given back")
	}
	take("z", at(15*time.Second))
	for i := 0; i < 2*evictLogSize; i++ {
		take(fmt.Sprint("h", i), at(16*time.Second))
	}
	take("z", at(17*time.Second))
	take("z", at(17*time.Second))
	refund("z", at(15*time.Second), at(18*time.Second))
	if take("z", at(19*time.Second)) {
		t.Fatal("a refund of a charge older than the shard's eviction log gave back a later charge")
	}
	checkShard(t, s)
}

// A bucket's refund by charge names ChargeStart (the charge time plus the
// lead of the units in use before it), not the charge's time: an eviction
// between the charge and that start is still seen, and the refund keeps
// the charge made on the key's fresh record after the eviction.
func TestMemoryRefundBucketEvicted(t *testing.T) {
	p := MustPolicy(Rule{Name: "r", Algorithm: TokenBucket, Limit: 4, Window: 4 * time.Second})
	m, at, take, refund := refundTrace(t, 2, p)
	t0 := at(0)
	take("a", at(0))
	take("a", at(0))
	d := take("a", at(0)) // the charge to refund: 3 tokens in use
	chargedAt := p.ChargeStart(at(0), 1, d)
	if chargedAt.Sub(t0) <= time.Second {
		t.Fatalf("ChargedAt t0+%v: the test needs a start after the eviction", chargedAt.Sub(t0))
	}
	// b and c evict a, holding state, at t0+0.5s.
	take("b", at(500*time.Millisecond))
	take("c", at(500*time.Millisecond))
	if m.Evictions() != 1 {
		t.Fatalf("%d evictions", m.Evictions())
	}
	// a comes back: its fresh record holds one charge, made after the eviction.
	take("a", at(time.Second))
	refund("a", chargedAt, at(time.Second))
	n := 0
	for take("a", at(time.Second)).Allowed {
		n++
	}
	if n != 3 {
		t.Fatalf("after the refund of a charge made before a's eviction, a admits %d more; want 3 (its later charge kept)", n)
	}
}

// Evictions logged out of time order (Take's now is the caller's, read
// before the lock; goroutines pass times a little out of order): an
// overwritten eviction of the key, after the charge, is still counted, by
// the latest time of the entries overwritten.
func TestMemoryRefundEvictLogOutOfOrder(t *testing.T) {
	p := MustPolicy(Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Hour})
	_, at, takeD, refund := refundTrace(t, 4, p)
	take := func(k string, now time.Time) bool { t.Helper(); return takeD(k, now).Allowed }
	take("x", at(10*time.Millisecond)) // the charge to refund
	// Other keys fill the shard; x is evicted at t0+20ms...
	for i := 0; i < 4; i++ {
		take(fmt.Sprint("f", i), at(20*time.Millisecond))
	}
	// ...then more keys evict, with times a few ms earlier (goroutines
	// that read the clock before x's charge and got the lock later).
	for i := 0; i < 2*evictLogSize; i++ {
		take(fmt.Sprint("g", i), at(5*time.Millisecond))
	}
	take("x", at(30*time.Millisecond))
	take("x", at(30*time.Millisecond)) // x's fresh record is full
	refund("x", at(10*time.Millisecond), at(40*time.Millisecond))
	if take("x", at(50*time.Millisecond)) {
		t.Fatal("the refund of a charge made before x's eviction gave back a later charge")
	}
}

// refundTrace returns a one-shard store of capacity keys, the time t0 + d
// as at(d), and functions taking one unit of key k under p at now
// (reporting its Decision) and refunding one unit of k charged at charged.
func refundTrace(t *testing.T, capacity int, p *Policy) (m *MemoryStore, at func(time.Duration) time.Time, take func(k string, now time.Time) Decision, refund func(k string, charged, now time.Time)) {
	m = MustMemoryStore(&MemoryConfig{Capacity: capacity, Shards: 1})
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	at = func(d time.Duration) time.Time { return t0.Add(d) }
	take = func(k string, now time.Time) Decision {
		t.Helper()
		var out [1]Decision
		if err := m.Take(ctx, now, []Request{{Policy: p, Key: k, Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	refund = func(k string, charged, now time.Time) {
		t.Helper()
		if err := m.Refund(ctx, now, []Request{{Policy: p, Key: k, Cost: 1, ChargedAt: charged}}); err != nil {
			t.Fatal(err)
		}
	}
	return m, at, take, refund
}
