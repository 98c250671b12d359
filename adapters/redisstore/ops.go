package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/limitry/ratelimit/core"
	"github.com/redis/go-redis/v9"
)

// The Store peeks, resets and refunds as core.MemoryStore does (see
// core.Peeker, core.Resetter and core.Refunder), each in one round trip
// (per Cluster slot of a batch): Peek and Refund run a second script, made
// of the take script's arithmetic and algorithm modules and lua/ops.lua,
// so a peek decides with the very code a take runs; Reset is one DEL.
// Each is bounded by Config.Timeout as a decision is (for a client without
// ContextTimeoutEnabled the call is abandoned at the Timeout, see
// callWithin), and counts as a running call for Close, as do the calls it
// abandons. Reset and Refund do not go through the circuit breaker: these
// are occasional calls whose failure the caller sees. Peek, which decides
// as Take does, goes through it as a decision does (see Peek), and so does
// a LeaseStore's refund of its leftovers, made on a decision's path (see
// refundOnPath).
var (
	_ core.Peeker   = (*Store)(nil)
	_ core.Resetter = (*Store)(nil)
	_ core.Refunder = (*Store)(nil)
)

var opsParts = []string{
	"lua/prelude.lua",
	"lua/arith.lua",
	"lua/helpers.lua",
	"lua/gcra.lua",
	"lua/fixed_window.lua",
	"lua/sliding_counter.lua",
	"lua/sliding_log.lua",
	"lua/records.lua",
	"lua/ops.lua",
}

var (
	opsScriptSource = composeScript(opsParts)
	// opsScript gives the ops script's SHA1 (run with EVALSHA, then EVAL
	// on NOSCRIPT, as the take script).
	opsScript = redis.NewScript(opsScriptSource)
)

// Modes of the ops script (see lua/ops.lua).
const (
	modePeek     = "P"
	modeGiveBack = "F"
)

// Peek implements core.Peeker: it decides reqs at now exactly as Take
// would, the same decisions and errors, and charges nothing (a key never
// seen stays absent; a record of another policy is read through the
// carry-over of units in use, and left as it is; a record of the request's
// policy left ahead of a clock that stepped back is written clamped, as
// core.Peeker says). One script call per
// Cluster slot of the batch (per hash tag for other clients), through the
// circuit breaker as a decision is (while it is open, Peek fails at once
// with ErrUnavailable). A backend failure goes to the Fallback's Peek when
// the Fallback is a core.Peeker, whose decisions then carry
// core.Decision.Fallback as Take's do, and is returned otherwise.
func (s *Store) Peek(ctx context.Context, now time.Time, reqs []core.Request, out []core.Decision) error {
	if !s.gate.enter() {
		return ErrClosed
	}
	defer s.gate.leave()
	over, err := core.CheckBatch(reqs, out)
	if err != nil && !errors.Is(err, core.ErrCostExceedsCapacity) {
		return err
	}
	if len(reqs) == 0 {
		return nil
	}
	infos, nowArg, err := s.opsPrepare(now, reqs)
	if err != nil {
		return err
	}
	var keys [core.MaxBatch]string
	s.keysOf(reqs, infos, keys[:len(reqs)])
	var zero [core.MaxBatch]core.Decision
	runs := s.opsRuns(modePeek, nowArg, reqs, infos, keys[:len(reqs)])
	var replies []string
	err = s.ringCheck(reqs, keys[:len(reqs)])
	start := time.Now()
	if err == nil {
		// Through the breaker, as a decision: while it is open, a peek
		// fails at once with ErrUnavailable instead of waiting on Redis.
		err = s.throughBreaker(ctx, keys[:len(reqs)], func() error {
			var rerr error
			replies, rerr = s.opsBounded(ctx, func(ctx context.Context, ended func() bool) ([]string, error) {
				return s.runOps(ctx, ended, runs)
			})
			return rerr
		})
	}
	for g := 0; err == nil && g < len(runs); g++ {
		if perr := parsePeek(replies[g], !s.clientTime, reqs, runs[g].idx, out, zero[:]); perr != nil {
			err = fmt.Errorf("redisstore: %w", perr)
		}
	}
	if err != nil {
		for i := range reqs {
			out[i] = core.Decision{Limit: reqs[i].Policy.Capacity(), Policy: reqs[i].Policy}
		}
		if pk, ok := s.fallback.(core.Peeker); ok && !IsCallerGone(err) {
			s.observe(reqs, err, time.Since(start))
			err = pk.Peek(ctx, now, reqs, out)
			for i := range reqs {
				out[i].Fallback = true // as Take marks the Fallback's decisions
			}
			return err
		}
		return err
	}
	all := over < 0
	for i := range reqs {
		all = all && out[i].Allowed
	}
	if !all {
		// As a refused batch reports them: the requests that would have
		// passed without their cost; those over their capacity refused with
		// no retry time.
		for i := range reqs {
			if big := reqs[i].Cost > reqs[i].Policy.Capacity(); big || out[i].Allowed {
				out[i] = zero[i]
				out[i].Allowed = !big
			}
		}
	}
	if over >= 0 {
		r := &reqs[over]
		return fmt.Errorf("%w: %q capacity %d, cost %d", core.ErrCostExceedsCapacity, r.Policy.Name(), r.Policy.Capacity(), r.Cost)
	}
	return nil
}

// Refund implements core.Refunder: it gives back each request's cost as
// core.Refunder defines per algorithm, never more than the key has in use,
// converting a record of another policy first. A request's ChargedAt is
// read on the clock the store decides on, to the microsecond: on the
// server's clock (the default), a time of the server's clock, which every
// Decision of Take carries in its At and Policy.ChargeStart returns (the
// root package's Limiter names its charges so); in ClientTime mode, the
// time given to the Take that made the charge. A sliding log gives back
// only the entry recorded at exactly that time. The batch is validated
// (core.CheckRefund, and the policies the store cannot run) before Redis
// is contacted, and refunded in one atomic script call when its keys share
// a Cluster slot (always on a single node; on a Cluster, with a
// Config.HashTag such as TagByKey). A batch spanning several slots is
// refunded one slot at a time, each atomically: after a failure, the
// slots not reached keep their charges (a refund that fails limits more,
// never less). On a Ring, a batch with a key whose shard is down fails
// with ErrShardDown, refunding nothing. A failure is not sent to the
// Fallback, which did not make the charges.
//
// A batch whose charges the Fallback made (Request.Fallback, set from
// the charges' Decision.Fallback by the HTTP middleware's refunds) is
// refunded by the Fallback, never by Redis, which never saw those charges
// (a refund there would give back units other requests were charged); it
// is refused when the store has no Fallback, or one that cannot refund
// (core.ErrUnsupported). A batch mixing the two is refused: one Take's
// charges are all made by one of them.
func (s *Store) Refund(ctx context.Context, now time.Time, reqs []core.Request) error {
	return s.refund(ctx, now, reqs, false)
}

// refundOnPath is Refund for a refund made on a decision's path (a
// LeaseStore's leftovers): it goes through the circuit breaker of the
// keys' node as a decision does, so that while the breaker is open it
// fails at once with ErrUnavailable instead of waiting on Redis (the
// caller then loses the units), and its failures count against the
// breaker.
func (s *Store) refundOnPath(ctx context.Context, now time.Time, reqs []core.Request) error {
	return s.refund(ctx, now, reqs, true)
}

// refund is Refund, through the breaker if viaBreaker.
func (s *Store) refund(ctx context.Context, now time.Time, reqs []core.Request, viaBreaker bool) error {
	if !s.gate.enter() {
		return ErrClosed
	}
	defer s.gate.leave()
	if err := core.CheckRefund(reqs); err != nil {
		return err
	}
	if len(reqs) == 0 {
		return nil
	}
	for i := range reqs {
		if reqs[i].Fallback != reqs[0].Fallback {
			return errMixedRefund
		}
	}
	if reqs[0].Fallback {
		return s.refundFallback(ctx, now, reqs)
	}
	infos, nowArg, err := s.opsPrepare(now, reqs)
	if err != nil {
		return err
	}
	var keys [core.MaxBatch]string
	s.keysOf(reqs, infos, keys[:len(reqs)])
	if err := s.ringCheck(reqs, keys[:len(reqs)]); err != nil {
		return err // the key's shard is down: its charges are not where the Ring would send the refund
	}
	runs := s.opsRuns(modeGiveBack, nowArg, reqs, infos, keys[:len(reqs)])
	run := func() error {
		_, err := s.opsBounded(ctx, func(ctx context.Context, ended func() bool) ([]string, error) {
			return s.runOps(ctx, ended, runs)
		})
		return err
	}
	if !viaBreaker {
		return run()
	}
	return s.throughBreaker(ctx, keys[:len(reqs)], run)
}

// errMixedRefund refuses a refund batch whose charges were made partly by
// Redis and partly by the Fallback.
var errMixedRefund = errors.New("redisstore: a refund batch mixes charges of Redis and of the Fallback")

// refundFallback refunds reqs, charges the Fallback made, to the Fallback.
func (s *Store) refundFallback(ctx context.Context, now time.Time, reqs []core.Request) error {
	if s.fallback == nil {
		return core.ErrFallbackCharge
	}
	rf, ok := s.fallback.(core.Refunder)
	if !ok {
		return fmt.Errorf("redisstore: refund of the Fallback's charges: %w: the Fallback (%T) cannot refund", core.ErrUnsupported, s.fallback)
	}
	own := make([]core.Request, len(reqs))
	copy(own, reqs)
	for i := range own {
		own[i].Fallback = false // the Fallback's own charges, to it
	}
	return rf.Refund(ctx, now, own)
}

// Reset implements core.Resetter: it deletes the key's record under the
// policy's Name (whatever policy wrote it), with one DEL. It does not
// reset the Fallback. On a Ring, it fails with ErrShardDown while the
// key's shard is down (the DEL would reach another shard, which holds
// nothing of the key).
func (s *Store) Reset(ctx context.Context, p *core.Policy, key string) error {
	if p == nil {
		return errors.New("redisstore: reset without a policy")
	}
	if !s.gate.enter() {
		return ErrClosed
	}
	defer s.gate.leave()
	r := core.Request{Policy: p, Key: key}
	tag := ""
	if s.hashTag != nil {
		tag = s.hashTag(p.Name(), key)
	}
	k := redisKey(s.prefix, escapeName(p.Name()), tag, &r)
	if err := s.ringCheck([]core.Request{r}, []string{k}); err != nil {
		return err // the key's shard is down: a DEL would reach another shard
	}
	_, err := s.opsBounded(ctx, func(ctx context.Context, _ func() bool) ([]string, error) {
		return nil, s.client.Del(ctx, k).Err()
	})
	return err
}

// opsPrepare returns the batch's policy infos and the script's time
// argument, or the error that refuses the batch before Redis is asked.
func (s *Store) opsPrepare(now time.Time, reqs []core.Request) ([]*policyInfo, any, error) {
	infos := make([]*policyInfo, len(reqs))
	for i := range reqs {
		infos[i] = infoOf(reqs[i].Policy)
		if infos[i].err != nil {
			return nil, nil, infos[i].err
		}
	}
	var nowArg any = ""
	if s.clientTime {
		us := now.UnixMicro()
		if us < -maxNowMicros || us > maxNowMicros {
			return nil, nil, fmt.Errorf("%w: %v", ErrTimeOutOfRange, now)
		}
		nowArg = strconv.FormatInt(us, 10)
	}
	return infos, nowArg, nil
}

// opsBounded runs f within the store's Timeout, also for a client that
// does not bound its I/O by the context's deadline (f is then abandoned at
// the Timeout, see callWithin, and counts as a running call for Close
// until it ends: it must use only memory of its own, and it should start
// no further call once ended reports true, the caller having stopped
// waiting), and wraps its error as Take does: a caller whose own context
// ended gets an IsCallerGone error.
func (s *Store) opsBounded(ctx context.Context, f func(ctx context.Context, ended func() bool) ([]string, error)) ([]string, error) {
	if ctx.Err() != nil {
		return nil, callerGone(ctx, nil)
	}
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if s.timeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, s.timeout)
	}
	defer cancel()
	// Within a running call the gate cannot have drained: Close waits for
	// an abandoned call as for an abandoned decision.
	ended := func() bool { return tctx.Err() != nil }
	v, err := callWithin(tctx, s.ctxBound, func() func() { s.gate.hold(); return s.gate.leave }, func(ctx context.Context) ([]string, error) {
		return f(ctx, ended)
	}, nil)
	switch {
	case err == nil:
		return v, nil
	case ctx.Err() != nil:
		return nil, callerGone(ctx, err)
	case tctx.Err() != nil:
		return nil, fmt.Errorf("redisstore: timed out after %v: %w: %w", s.timeout, context.DeadlineExceeded, err)
	}
	return nil, fmt.Errorf("redisstore: %w", err)
}

// opsRun is one call of the ops script: the requests idx of a batch, and
// the call's arguments, its own (a call abandoned at its deadline may
// still read them after the batch's memory is reused).
type opsRun struct {
	idx  []int
	args []any
}

// opsRuns returns the calls of the ops script in mode for the batch, one
// per group of keys one script call can see (see Store.groups), in order;
// a request over its capacity is peeked at cost 0.
func (s *Store) opsRuns(mode string, nowArg any, reqs []core.Request, infos []*policyInfo, keys []string) []opsRun {
	gs := s.groups(keys)
	if gs == nil {
		all := make([]int, len(keys))
		for i := range all {
			all[i] = i
		}
		gs = [][]int{all}
	}
	runs := make([]opsRun, len(gs))
	for g, idx := range gs {
		args := make([]any, 0, 3+len(idx)+3+3*len(idx))
		args = append(args, nil, nil, len(idx))
		for _, i := range idx {
			args = append(args, keys[i])
		}
		args = append(args, mode, nowArg, s.slackArg)
		for _, i := range idx {
			cost := reqs[i].Cost
			if cost > reqs[i].Policy.Capacity() {
				cost = 0
			}
			args = append(args, infos[i].args, cost, chargeTime(mode, reqs[i].ChargedAt))
		}
		runs[g] = opsRun{idx: idx, args: args}
	}
	return runs
}

// chargeTime is the ops script's charge-time argument of a request: for a
// refund naming the time of its charge (core.Request.ChargedAt), that time
// in microseconds, rounded down and clamped to the times the script
// holds, read by the script on the clock it decides on (the server's,
// where Policy.ChargeStart has read it from the charge's Decision.At, or
// in ClientTime mode the one given to Take); "" otherwise.
func chargeTime(mode string, at time.Time) any {
	if mode != modeGiveBack || at.IsZero() {
		return ""
	}
	ns := core.ClampTime(at)
	us := ns / 1000
	if ns%1000 < 0 {
		us--
	}
	return min(max(us, -maxNowMicros), maxNowMicros)
}

// runOps makes the calls runs, in order, stopping at an error, or before
// a call once ended reports true (so that a refund abandoned at its
// deadline reaches no further slot: the caller was told it failed), and
// returns their replies.
func (s *Store) runOps(ctx context.Context, ended func() bool, runs []opsRun) ([]string, error) {
	replies := make([]string, len(runs))
	for g := range runs {
		if g > 0 && ended() {
			return nil, context.DeadlineExceeded
		}
		args := runs[g].args
		args[0], args[1] = "evalsha", opsScript.Hash()
		cmd := redis.NewStringCmd(ctx, args...)
		_ = s.client.Process(ctx, noRetryCmd{cmd})
		err := cmd.Err()
		if err != nil && isNoScript(err) {
			args[0], args[1] = "eval", opsScriptSource
			cmd = redis.NewStringCmd(ctx, args...)
			_ = s.client.Process(ctx, noRetryCmd{cmd})
			err = cmd.Err()
		}
		if err != nil {
			if len(runs) > 1 {
				err = &groupFault{key: runs[g].idx[0], err: err}
			}
			return nil, err
		}
		replies[g] = cmd.Val()
	}
	return replies, nil
}

// parsePeek reads a peek's reply: now, then per request the decision at
// its cost (to out) and at cost 0 (to zero). The decisions' At is that now
// when serverClock.
func parsePeek(reply string, serverClock bool, reqs []core.Request, idx []int, out, zero []core.Decision) error {
	p := replyParser{s: reply}
	var at time.Time
	if now := p.next(); serverClock { // the time decided at
		at = time.UnixMicro(now)
	}
	for _, i := range idx {
		pol := reqs[i].Policy
		out[i] = core.Decision{
			Allowed:    p.next() == 1,
			Limit:      pol.Capacity(),
			Remaining:  p.next(),
			ResetAfter: micros(p.next()),
			RetryAfter: micros(p.next()),
			Delay:      micros(p.next()),
			Policy:     pol,
			At:         at,
		}
		zero[i] = core.Decision{
			Allowed:    true,
			Limit:      pol.Capacity(),
			Remaining:  p.next(),
			ResetAfter: micros(p.next()),
			Delay:      micros(p.next()),
			Policy:     pol,
			At:         at,
		}
	}
	if p.err || p.pos != len(p.s) {
		return fmt.Errorf("unexpected script reply %q", reply)
	}
	return nil
}
