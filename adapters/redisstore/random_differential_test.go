package redisstore

// A randomized differential test of the Redis store against core.MemoryStore
// with conversions between equally named policies, peeks, refunds (with and
// without ChargedAt), resets and a client clock that sometimes steps back;
// plus model checks of the quota and of "retry at RetryAfter is admitted".
// Failing traces are shrunk to a minimal sequence.

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/limitry/ratelimit/core/storetest"
	"github.com/limitry/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

type rdOp struct {
	kind byte  // 'T' take, 'P' peek, 'R' refund, 'X' reset
	at   int64 // microseconds since storetest.T0
	reqs []core.Request
}

func (o rdOp) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%c at=%dus", o.kind, o.at)
	for _, r := range o.reqs {
		fmt.Fprintf(&b, " [%s/%s %q c=%d", r.Policy.Name(), r.Policy.Identity(), r.Key, r.Cost)
		if !r.ChargedAt.IsZero() {
			fmt.Fprintf(&b, " chargedAt=%dns", r.ChargedAt.Sub(storetest.T0).Nanoseconds())
		}
		b.WriteString("]")
	}
	return b.String()
}

func rdAt(us int64) time.Time { return storetest.T0.Add(time.Duration(us) * time.Microsecond) }

var (
	ms1   = time.Millisecond
	ms999 = 999 * time.Millisecond
	s1    = time.Second
	h1    = time.Hour
)

// rdPolicies returns policies grouped by Name: "mix*" names have several
// policies (conversions), "p-*" names one each (model-checked).
func rdPolicies(t testing.TB) (mixed map[string][]*core.Policy, pure []*core.Policy) {
	mk := func(name string, a core.Algorithm, l int64, w time.Duration, b int64, md time.Duration) *core.Policy {
		return mustPolicy(t, core.Rule{Name: name, Algorithm: a, Limit: l, Window: w, Burst: b, MaxDelay: md})
	}
	tb, lb, fw, swl, swc := core.TokenBucket, core.LeakyBucket, core.FixedWindow, core.SlidingWindowLog, core.SlidingWindowCounter
	mixed = map[string][]*core.Policy{
		"mix1": {
			mk("mix1", tb, 3, s1, 0, 0), mk("mix1", tb, 1, ms999, 0, 0), mk("mix1", tb, 3, s1, 7, 0),
			mk("mix1", lb, 3, s1, 0, 0), mk("mix1", lb, 7, h1, 3, ms999), mk("mix1", fw, 3, s1, 0, 0),
			mk("mix1", swc, 7, ms999, 0, 0), mk("mix1", swl, 3, s1, 0, 0),
		},
		"mix2": {
			mk("mix2", fw, 1, ms1, 0, 0), mk("mix2", swl, 7, ms999, 0, 0), mk("mix2", swc, 3, s1, 0, 0),
			mk("mix2", tb, 7, ms1, 1, 0), mk("mix2", lb, 1, ms1, 0, 0), mk("mix2", lb, 3, ms999, 3, s1),
			mk("mix2", lb, 3, ms999, 3, 0), mk("mix2", fw, 7, h1, 0, 0), mk("mix2", swl, 3, h1, 0, 0),
		},
		"mix3": { // same algorithm, other limits/windows
			mk("mix3", swl, 3, s1, 0, 0), mk("mix3", swl, 7, s1, 0, 0), mk("mix3", swl, 1, ms999, 0, 0),
			mk("mix3", swc, 7, s1, 0, 0), mk("mix3", swc, 3, ms999, 0, 0),
			mk("mix3", tb, 7, s1, 3, 0), mk("mix3", lb, 7, s1, 3, 2*s1),
		},
	}
	pure = []*core.Policy{
		mk("p-tb", tb, 3, ms999, 7, 0), mk("p-tb1", tb, 1, ms1, 0, 0), mk("p-tbh", tb, 7, h1, 0, 0),
		mk("p-lb", lb, 7, s1, 3, s1), mk("p-lbm", lb, 3, s1, 0, 0), mk("p-lbb", lb, 3, ms999, 7, 0),
		mk("p-fw", fw, 7, ms999, 0, 0), mk("p-fw1", fw, 1, h1, 0, 0), mk("p-fw3", fw, 3, ms1, 0, 0),
		mk("p-swl", swl, 3, s1, 0, 0), mk("p-swl7", swl, 7, ms999, 0, 0), mk("p-swl1", swl, 1, ms1, 0, 0),
		mk("p-swc", swc, 7, s1, 0, 0), mk("p-swc3", swc, 3, ms1, 0, 0), mk("p-swc1", swc, 1, ms999, 0, 0),
	}
	return mixed, pure
}

// rdGen generates a trace of steps operations from seed: with back, a
// clock that sometimes steps back (and refunds and resets reaching the
// model-checked names too, the model being off then); leave, if set, says
// which policies to leave out of the names with several policies.
func rdGen(t testing.TB, seed uint64, steps int, back bool, leave func(*core.Policy) bool) []rdOp {
	windowsOnly := back
	mixed, pure := rdPolicies(t)
	if leave != nil {
		for n, ps := range mixed {
			var keep []*core.Policy
			for _, p := range ps {
				if !leave(p) {
					keep = append(keep, p)
				}
			}
			mixed[n] = keep
		}
	}
	var all []*core.Policy
	for _, n := range []string{"mix1", "mix2", "mix3"} {
		all = append(all, mixed[n]...)
	}
	all = append(all, pure...)
	keys := []string{"k1", "k2"}
	rng := rand.New(rand.NewPCG(seed, 0xd1ff))
	// A memory store drives the generation (what was admitted, for refunds).
	ms := core.MustMemoryStore(nil)
	ctx := context.Background()
	var at int64
	type charge struct {
		req core.Request
		at  int64
		d   core.Decision
	}
	var charges []charge
	var ops []rdOp
	randCost := func(c int64) int64 {
		switch x := rng.IntN(100); {
		case x < 55:
			return 1
		case x < 80:
			return 1 + rng.Int64N(min(c, 3))
		case x < 92:
			return c
		case x < 97:
			return 1 + rng.Int64N(c)
		default:
			return c + 1 + rng.Int64N(2)
		}
	}
	for len(ops) < steps {
		switch x := rng.IntN(100); {
		case x < 35:
		case x < 55:
			at += rng.Int64N(1000)
		case x < 60:
			at += 1000 * rng.Int64N(3)
		case x < 80:
			at += rng.Int64N(1_000_000)
		case x < 90:
			at += rng.Int64N(5_000_000)
		case x < 93:
			at += rng.Int64N(7_200_000_000)
		default:
			if back {
				at -= rng.Int64N(2_000_000)
				if rng.IntN(8) == 0 { // now and then up to two hours
					at -= rng.Int64N(7_200_000_000)
				}
			} else {
				at += 999_000
			}
		}
		n := 1
		if rng.IntN(3) == 0 {
			n = 2 + rng.IntN(3)
		}
		var reqs []core.Request
		for len(reqs) < n {
			p := all[rng.IntN(len(all))]
			if rng.IntN(2) == 0 { // favour the mixed names
				ms := []string{"mix1", "mix2", "mix3"}[rng.IntN(3)]
				p = mixed[ms][rng.IntN(len(mixed[ms]))]
			}
			k := keys[rng.IntN(len(keys))]
			dup := false
			for _, r := range reqs {
				dup = dup || (r.Policy.Name() == p.Name() && r.Key == k)
			}
			if !dup {
				reqs = append(reqs, core.Request{Policy: p, Key: k, Cost: randCost(p.Capacity())})
			}
		}
		op := rdOp{at: at}
		switch y := rng.IntN(100); {
		case y < 60:
			op.kind = 'T'
			op.reqs = reqs
			out := make([]core.Decision, len(reqs))
			err := ms.Take(ctx, rdAt(at), reqs, out)
			ok := err == nil
			for _, d := range out[:len(reqs)] {
				ok = ok && d.Allowed
			}
			if ok {
				for i, r := range reqs {
					charges = append(charges, charge{r, at, out[i]})
				}
			}
		case y < 72:
			op.kind = 'P'
			op.reqs = reqs
		case y < 92:
			op.kind = 'R'
			// Refund recent charges of mixed names (pure names are model-checked).
			m := 1 + rng.IntN(2)
			for j := len(charges) - 1; j >= 0 && len(op.reqs) < m && j >= len(charges)-8; j-- {
				c := charges[j]
				if (!windowsOnly && strings.HasPrefix(c.req.Policy.Name(), "p-")) || rng.IntN(3) == 0 {
					continue
				}
				dup := false
				for _, r := range op.reqs {
					dup = dup || (r.Policy.Name() == c.req.Policy.Name() && r.Key == c.req.Key)
				}
				if dup {
					continue
				}
				r := c.req
				if rng.IntN(3) > 0 {
					// ChargedAt from the charge's decision, rounded as the
					// Redis store rounds it (equal after ceilMicro).
					d := c.d
					d.ResetAfter = ceilMicro(d.ResetAfter)
					// In whole microseconds, the Redis store's resolution
					// (ChargeStart may give a fraction, which that store
					// rounds: later, never earlier).
					r.ChargedAt = r.Policy.ChargeStart(rdAt(c.at), r.Cost, d).Truncate(time.Microsecond)
				}
				if rng.IntN(4) == 0 {
					r.Cost = 1 + rng.Int64N(r.Policy.Capacity())
				}
				op.reqs = append(op.reqs, r)
			}
			if len(op.reqs) == 0 {
				continue
			}
			if err := ms.Refund(ctx, rdAt(at), op.reqs); err != nil {
				t.Fatalf("gen refund: %v", err)
			}
		default:
			op.kind = 'X'
			r := reqs[0]
			if !windowsOnly && strings.HasPrefix(r.Policy.Name(), "p-") {
				continue
			}
			op.reqs = reqs[:1]
			ms.Reset(ctx, r.Policy, r.Key)
		}
		ops = append(ops, op)
	}
	return ops
}

type rdAdm struct {
	at   int64 // ns since T0
	cost int64
}

type rdFail struct {
	step int
	kind string
	msg  string
}

func (f *rdFail) Error() string { return fmt.Sprintf("step %d: %s: %s", f.step, f.kind, f.msg) }

func sameErrKind(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	for _, e := range []error{core.ErrCostExceedsCapacity, core.ErrInvalidCost, core.ErrDuplicateRequest, core.ErrBatchTooLarge} {
		if errors.Is(a, e) != errors.Is(b, e) {
			return false
		}
	}
	return true
}

// rdReplay replays ops against fresh stores and returns the first failure.
// model enables the quota model checks (traces whose clock never steps back).
type rdStats struct{ takes, peeks, refunds, resets, refused, probes, modelChecks int }

var rdLast rdStats

func rdReplay(t *testing.T, client redis.UniversalClient, ops []rdOp, model bool, verbose bool) *rdFail {
	ctx := context.Background()
	var st rdStats
	defer func() { rdLast = st }()
	rs := newStore(t, client, &Config{ClientTime: true})
	ms := core.MustMemoryStore(nil)
	adm := map[string][]rdAdm{}
	logf := func(format string, args ...any) {
		if verbose {
			t.Logf(format, args...)
		}
	}
	for step, op := range ops {
		now := rdAt(op.at)
		switch op.kind {
		case 'X':
			st.resets++
			r := op.reqs[0]
			if err := ms.Reset(ctx, r.Policy, r.Key); err != nil {
				return &rdFail{step, "reset", err.Error()}
			}
			if err := rs.Reset(ctx, r.Policy, r.Key); err != nil {
				return &rdFail{step, "reset", err.Error()}
			}
			logf("%d %v", step, op)
		case 'R':
			st.refunds++
			werr := ms.Refund(ctx, now, op.reqs)
			gerr := rs.Refund(ctx, now, op.reqs)
			logf("%d %v -> mem %v redis %v", step, op, werr, gerr)
			if !sameErrKind(werr, gerr) {
				return &rdFail{step, "refund-err", fmt.Sprintf("memory %v, redis %v", werr, gerr)}
			}
		case 'T', 'P':
			n := len(op.reqs)
			want, got := make([]core.Decision, n), make([]core.Decision, n)
			var werr, gerr error
			if op.kind == 'T' {
				st.takes++
				werr = ms.Take(ctx, now, op.reqs, want)
				gerr = rs.Take(ctx, now, op.reqs, got)
			} else {
				st.peeks++
				werr = ms.Peek(ctx, now, op.reqs, want)
				gerr = rs.Peek(ctx, now, op.reqs, got)
			}
			if verbose {
				logf("%d %v -> err mem %v redis %v", step, op, werr, gerr)
				for i := range want {
					logf("    mem   %s", rdDec(want[i]))
					logf("    redis %s", rdDec(got[i]))
				}
			}
			if !sameErrKind(werr, gerr) {
				return &rdFail{step, "err", fmt.Sprintf("memory %v, redis %v", werr, gerr)}
			}
			all := werr == nil
			for i := range op.reqs {
				w := want[i]
				w.RetryAfter, w.ResetAfter, w.Delay = ceilMicro(w.RetryAfter), ceilMicro(w.ResetAfter), ceilMicro(w.Delay)
				if w != got[i] {
					return &rdFail{step, "decision", fmt.Sprintf("request %d: memory %s, redis %s", i, rdDec(w), rdDec(got[i]))}
				}
				all = all && w.Allowed
				if !w.Allowed {
					st.refused++
				}
				if w.Remaining < 0 || w.Remaining > w.Limit {
					return &rdFail{step, "remaining-range", rdDec(w)}
				}
				if w.Allowed && w.RetryAfter != 0 {
					return &rdFail{step, "allowed-retry", rdDec(w)}
				}
			}
			if op.kind == 'T' && all && model {
				for i, r := range op.reqs {
					if !strings.HasPrefix(r.Policy.Name(), "p-") {
						continue
					}
					k := r.Policy.Name() + "/" + r.Key
					st.modelChecks++
					adm[k] = append(adm[k], rdAdm{now.Sub(storetest.T0).Nanoseconds(), r.Cost})
					if msg := rdModel(r.Policy, adm[k], want[i]); msg != "" {
						return &rdFail{step, "model", fmt.Sprintf("%s key %s: %s", r.Policy, r.Key, msg)}
					}
				}
			}
			// Retry exactly at RetryAfter (a peek of the request alone).
			if werr == nil && !all {
				for i, r := range op.reqs {
					for si, pk := range []interface {
						Peek(context.Context, time.Time, []core.Request, []core.Decision) error
					}{ms, rs} {
						d := want[i]
						if si == 1 {
							d = got[i]
						}
						if d.Allowed || d.RetryAfter <= 0 {
							if !d.Allowed && d.RetryAfter <= 0 {
								return &rdFail{step, "retry-zero", fmt.Sprintf("request %d refused with RetryAfter %v", i, d.RetryAfter)}
							}
							continue
						}
						st.probes++
						var pd [1]core.Decision
						if err := pk.Peek(ctx, now.Add(d.RetryAfter), []core.Request{r}, pd[:]); err != nil {
							return &rdFail{step, "probe-err", err.Error()}
						}
						if !pd[0].Allowed {
							return &rdFail{step, "retry-early", fmt.Sprintf("store %d request %d (%s %q cost %d) refused at %v with RetryAfter %v; at +RetryAfter: %s",
								si, i, r.Policy.Identity(), r.Key, r.Cost, now.Sub(storetest.T0), d.RetryAfter, rdDec(pd[0]))}
						}
					}
				}
			}
		}
	}
	return nil
}

func rdDec(d core.Decision) string {
	return fmt.Sprintf("{ok=%v lim=%d rem=%d retry=%v reset=%v delay=%v}", d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Delay)
}

// rdModel checks the admissions of one pure key against its algorithm's
// definition; the last admission is new.
func rdModel(p *core.Policy, a []rdAdm, d core.Decision) string {
	r := p.Rule()
	L, W := r.Limit, int64(r.Window)
	last := a[len(a)-1]
	switch p.Algorithm() {
	case core.TokenBucket, core.LeakyBucket:
		// In any [s, t]: sum <= C + (t - s + MaxDelay) x L / W.
		C := p.Capacity()
		var sum int64
		for j := len(a) - 1; j >= 0; j-- {
			sum += a[j].cost
			span := last.at - a[j].at + int64(r.MaxDelay)
			lhs := new(big.Int).Mul(big.NewInt(sum-C), big.NewInt(W))
			rhs := new(big.Int).Mul(big.NewInt(span), big.NewInt(L))
			if lhs.Cmp(rhs) > 0 {
				return fmt.Sprintf("%d units admitted in [%d, %d]ns, capacity %d, rate %d/%v", sum, a[j].at, last.at, C, L, r.Window)
			}
		}
	case core.FixedWindow:
		idx := floorDiv(last.at+storetest.T0.UnixNano(), W)
		var sum int64
		for _, x := range a {
			if floorDiv(x.at+storetest.T0.UnixNano(), W) == idx {
				sum += x.cost
			}
		}
		if sum > L {
			return fmt.Sprintf("%d units in window %d", sum, idx)
		}
	case core.SlidingWindowLog:
		var sum int64
		for _, x := range a {
			if x.at > last.at-W {
				sum += x.cost
			}
		}
		if sum > L {
			return fmt.Sprintf("%d units in (%d-W, %d]", sum, last.at, last.at)
		}
	case core.SlidingWindowCounter:
		abs := last.at + storetest.T0.UnixNano()
		idx := floorDiv(abs, W)
		e := abs - idx*W
		var prev, curr int64
		for _, x := range a[:len(a)-1] {
			switch floorDiv(x.at+storetest.T0.UnixNano(), W) {
			case idx:
				curr += x.cost
			case idx - 1:
				prev += x.cost
			}
		}
		// prev x (W-e)/W + curr + cost <= L
		lhs := new(big.Int).Add(new(big.Int).Mul(big.NewInt(prev), big.NewInt(W-e)), new(big.Int).Mul(big.NewInt(curr+last.cost), big.NewInt(W)))
		if lhs.Cmp(new(big.Int).Mul(big.NewInt(L), big.NewInt(W))) > 0 {
			return fmt.Sprintf("prev %d curr %d cost %d at elapsed %d of %d", prev, curr, last.cost, e, W)
		}
	}
	return ""
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// rdShrink reduces ops to a minimal trace failing with the same kind.
func rdShrink(t *testing.T, client redis.UniversalClient, ops []rdOp, model bool, kind string) []rdOp {
	fails := func(c []rdOp) bool {
		f := rdReplay(t, client, c, model, false)
		return f != nil && f.kind == kind
	}
	chunk := len(ops) / 2
	for chunk >= 1 {
		removed := false
		for i := 0; i+chunk <= len(ops); {
			cand := append(append([]rdOp{}, ops[:i]...), ops[i+chunk:]...)
			if len(cand) > 0 && fails(cand) {
				ops = cand
				removed = true
			} else {
				i += chunk
			}
		}
		if !removed {
			chunk /= 2
		}
	}
	// Also try to drop single requests from batches and lower costs.
	for i := range ops {
		for j := 0; len(ops[i].reqs) > 1 && j < len(ops[i].reqs); {
			cand := append([]rdOp{}, ops...)
			rq := append(append([]core.Request{}, ops[i].reqs[:j]...), ops[i].reqs[j+1:]...)
			cand[i].reqs = rq
			if fails(cand) {
				ops = cand
			} else {
				j++
			}
		}
	}
	return ops
}

// TestRandomDifferential replays random traces (conversions between
// policies of one Name, batches, peeks, refunds with and without
// ChargedAt, resets) on a clock that never steps back against both stores:
// every decision and error must be equal, every admission within the
// algorithm's quota (checked on names of one policy), and every refusal's
// RetryAfter must hold (a peek at that time is admitted). A failing trace
// is shrunk to a minimal one.
func TestRandomDifferential(t *testing.T) {
	rdRun(t, false, nil)
}

// TestRandomDifferentialStepBack is TestRandomDifferential on a clock that
// now and then steps back (no quota model then), without conversions of
// leaky bucket records, which the Redis store reads from their raw arrival
// time after a step back (documented: it counts more units in use, never
// fewer).
func TestRandomDifferentialStepBack(t *testing.T) {
	rdRun(t, true, func(p *core.Policy) bool { return p.Algorithm() == core.LeakyBucket })
}

func rdRun(t *testing.T, back bool, leave func(*core.Policy) bool) {
	client := newClient(t, redistest.Server(t))
	const steps, seeds = 1000, 12
	for seed := 1; seed <= seeds; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			ops := rdGen(t, uint64(seed)+uint64(b2i(back))*1000, steps, back, leave)
			f := rdReplay(t, client, ops, !back, false)
			t.Logf("stats %+v", rdLast)
			if f == nil {
				return
			}
			t.Logf("failure: %v", f)
			ops = ops[:f.step+1]
			min := rdShrink(t, client, ops, !back, f.kind)
			t.Logf("shrunk to %d ops:", len(min))
			for i, o := range min {
				t.Logf("  %d: %v", i, o)
			}
			t.Errorf("minimal failure: %v", rdReplay(t, client, min, !back, true))
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
