package ratelimit

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/limitry/ratelimit/core"
)

// Concurrency limits.
//
// A rate limit bounds requests per unit of time; it does not stop a client
// from holding many slow requests open at once. A layer with
// [Layer.InFlight] set to N is a concurrency limit: it admits at most N
// requests per key in flight at once.
//
//	ratelimit.New([]ratelimit.Layer{
//		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "per-ip", Limit: 100, Window: time.Minute}},
//		{Key: ratelimit.MustClientIP(), Rule: core.Rule{Name: "in-flight"}, InFlight: 2},
//	})
//
// Such a layer's Rule gives only its Name (core.DefaultName when empty),
// which names it in headers and problem details like any layer; its other
// fields must be zero, and Cost and Resolver must be unset (every request
// holds one slot). Key, IfNoKey and Routes work as for any layer.
//
// A request takes one slot of every concurrency layer that applies to it,
// all or nothing, before any rate layer is charged; if a concurrency layer
// refuses, it takes no slot and charges no rate layer, and its Result lists
// only the concurrency layers (the rate layers were not asked). Then the rate
// layers are charged as one batch; if they refuse or fail (and the request
// is not served anyway, fail-open or dry-run), the slots are given back. So
// a request refused by any layer holds no slot and charges no rate layer.
// In dry-run mode a request a concurrency layer refuses is served without
// a slot, and its rate layers are not charged either.
//
// An admitted request gives its slots back exactly once, when it ends:
// [Limiter.Handler] gives them back when the next handler returns, also
// when it panics or after it hijacks the connection (the handler returns
// after hijacking); a client that goes away frees its slots when the handler
// notices and returns, since until then the work is still in flight. For
// framework adapters, [Limiter.AdmitFunc] returns the function that gives
// them back; plain [Limiter.Admit] gives them back when the request's
// context ends (net/http ends it when the handler returns, or earlier if
// the client goes away), and refuses a request whose context can never end.
//
// A concurrency refusal is answered like a rate refusal: 429 Too Many
// Requests, with Retry-After set to InFlightRetryAfter (when a slot frees is
// unknown), X-RateLimit-Limit N and X-RateLimit-Remaining 0 when the layer
// speaks, and in the IETF fields an item with the quota unit
// qu="concurrent-requests" and no window, such as
//
//	RateLimit-Policy: "in-flight";q=2;qu="concurrent-requests"
//	RateLimit: "in-flight";r=0;t=1
//
// For an admitted request the layer's Remaining is N minus the slots in use,
// this request's included, and its ResetAfter is 0. An Observer (see
// [WithObserver]) receives every concurrency decision as a
// core.DecisionEvent under the layer's policy, once the rate layers have
// decided (Admitted: the request was admitted, by its rate layers too; a
// slot given back because a rate layer refused is reported not admitted),
// and every slot store failure as a core.ErrorEvent.
//
// Slots live in a core.SlotTable of the Limiter's own unless
// [WithSlotStore] gives another store (redisstore.InFlight shares them in a
// fleet). A failing slot store is a store failure: the fail policy applies
// (see [WithFailClosed]) to the concurrency layers alone. Fail-closed
// answers 503; fail-open (the default) drops the concurrency layers for that
// request, logs it once and tells the Observer, while the rate layers still
// decide and charge it: a slot-store outage never lifts the rate limits. [Limiter.SetRules] cannot change a concurrency
// layer, and [Limiter.Rules] omits it.

// InFlightRetryAfter is the retry time of a request refused by a
// concurrency layer: the soonest a slot frees is unknown (it frees when a
// request ends), so a short delay is promised.
const InFlightRetryAfter = time.Second

// ErrNoRelease is wrapped (with ErrConfig) by the error of a request that
// [Limiter.Admit] refuses on a Limiter with concurrency layers because its
// context can never end, so its slots could never be given back: use
// [Limiter.AdmitFunc] or [Limiter.Handler] instead. In dry-run the request
// is served, as dry-run serves every configuration error, and its slots
// are given back at once (the error is logged all the same).
var ErrNoRelease = errors.New("ratelimit: the request's context never ends, so Admit cannot give back its in-flight slots: use AdmitFunc")

// inFlightAlg is the Algorithm of the policies that name concurrency layers
// and carry their limit for the headers. No Store ever runs it: such
// requests go to the SlotStore.
type inFlightAlg struct{}

func (inFlightAlg) Name() string                           { return "in_flight" }
func (inFlightAlg) Validate(core.Rule) error               { return nil }
func (inFlightAlg) Capacity(r core.Rule) int64             { return r.Limit }
func (inFlightAlg) Expiry(*core.Policy, *core.State) int64 { return math.MinInt64 }
func (inFlightAlg) Decide(p *core.Policy, _ *core.State, _, _ int64, _ bool, d *core.Decision) {
	*d = core.Decision{Limit: p.Capacity(), RetryAfter: InFlightRetryAfter, Policy: p}
}

// isInFlight reports whether p names a concurrency layer.
func isInFlight(p *core.Policy) bool {
	_, ok := p.Algorithm().(inFlightAlg)
	return ok
}

// layerPolicy validates ly's rule and returns its policy: the Rule's for a
// rate layer, a policy carrying the name and limit for a concurrency layer.
func layerPolicy(ly *Layer) (*core.Policy, error) {
	if ly.InFlight == 0 {
		return core.NewPolicy(ly.Rule)
	}
	r := ly.Rule
	switch {
	case ly.InFlight < 0:
		return nil, fmt.Errorf("InFlight must not be negative, got %d", ly.InFlight)
	case ly.InFlight > core.MaxLimit:
		return nil, fmt.Errorf("InFlight %d exceeds core.MaxLimit (%d)", ly.InFlight, int64(core.MaxLimit))
	case r.Algorithm != nil || r.Limit != 0 || r.Window != 0 || r.Burst != 0 || r.MaxDelay != 0:
		return nil, errors.New("a concurrency layer (InFlight set) takes only Rule.Name: its Rule must have no Algorithm, Limit, Window, Burst or MaxDelay")
	case ly.Cost != nil:
		return nil, errors.New("a concurrency layer (InFlight set) takes no Cost: every request holds one slot")
	case ly.Resolver != nil:
		return nil, errors.New("a concurrency layer (InFlight set) takes no Resolver")
	}
	return core.NewPolicy(core.Rule{Name: r.Name, Algorithm: inFlightAlg{}, Limit: ly.InFlight, Window: time.Second})
}

// slotStore returns the SlotStore of a Limiter with layers: nil without a
// concurrency layer, else s or a new SlotTable.
func slotStore(layers []Layer, s core.SlotStore) core.SlotStore {
	for i := range layers {
		if layers[i].InFlight > 0 {
			if s == nil {
				s = core.NewSlotTable(0)
			}
			return s
		}
	}
	return nil
}

// acquire takes the slots of the concurrency layers among the applied
// layers buf (with their requests reqs), before the rate layers are
// charged. It moves the rate layers to buf[:m] and reqs[:m] and returns m;
// when the slots are taken, the concurrency layers follow in buf[m:] with
// their decisions, also written to out[m:], and res holds the slots. With
// stop set, the request is decided without charging the rate layers: a
// concurrency refusal (its layers are then in buf[:m]) or an error (m is 0).
func (l *Limiter) acquire(ctx context.Context, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision) (m int, stop bool) {
	if len(buf) <= smallBatch {
		var (
			sreqs [smallBatch]core.SlotRequest
			sout  [smallBatch]core.SlotDecision
			slot  [smallBatch]LayerResult
			pols  [smallBatch]*core.Policy
		)
		return l.acquireWith(ctx, res, buf, reqs, out, sreqs[:], sout[:], slot[:], pols[:])
	}
	var (
		sreqs [core.MaxBatch]core.SlotRequest
		sout  [core.MaxBatch]core.SlotDecision
		slot  [core.MaxBatch]LayerResult
		pols  [core.MaxBatch]*core.Policy
	)
	return l.acquireWith(ctx, res, buf, reqs, out, sreqs[:], sout[:], slot[:], pols[:])
}

// acquireWith is acquire with scratch space for len(buf) layers.
func (l *Limiter) acquireWith(ctx context.Context, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision,
	sreqs []core.SlotRequest, sout []core.SlotDecision, slot []LayerResult, pols []*core.Policy) (m int, stop bool) {
	k := 0
	for j := range buf {
		ly := &l.layers[buf[j].index]
		if ly.inFlight == 0 {
			buf[m], reqs[m] = buf[j], reqs[j]
			m++
			continue
		}
		slot[k], pols[k] = buf[j], reqs[j].Policy
		sreqs[k] = core.SlotRequest{Name: ly.name, Key: reqs[j].Key, Limit: ly.inFlight}
		k++
	}
	if k == 0 {
		return m, false
	}
	var start time.Time
	if l.cfg.observer != nil {
		start = l.clock.Now()
	}
	var (
		release func()
		err     error
	)
	if t, ok := l.slots.(*core.SlotTable); ok {
		release, err = t.Acquire(ctx, sreqs[:k], sout[:k]) // a direct call: the arrays stay on the stack
	} else { // on copies, so that the arrays stay on the stack
		rq, ro := append([]core.SlotRequest(nil), sreqs[:k]...), make([]core.SlotDecision, k)
		release, err = l.slots.Acquire(ctx, rq, ro)
		copy(sout, ro)
	}
	if l.cfg.observer != nil && err != nil && (ctx.Err() == nil || !errors.Is(err, ctx.Err())) { // a client gone is no failure
		l.cfg.observer.ObserveError(core.ErrorEvent{Policies: append([]*core.Policy(nil), pols[:k]...), Err: err, Latency: l.clock.Now().Sub(start)})
	}
	if err != nil {
		switch {
		case l.goneWith(res, ctx, err):
		case errors.Is(err, core.ErrStoreFull):
			l.failed(res, outcomeStoreFull, prefixed("refused", err))
			res.Delay = InFlightRetryAfter
		case m > 0 && !l.cfg.failClosed:
			// Fail-open for the concurrency layers alone: the rate
			// layers, whose store answers, still decide the request (in
			// dry-run too, so that it previews what enforcing would do).
			// Logged by serve, once the request is served without them.
			res.slotErr = wrap(ErrStoreFailure, "in-flight slots", err)
			res.slotsFailed = true
			return m, false
		default:
			l.failed(res, outcomeStore, wrap(ErrStoreFailure, "", err))
			// The slot store's failure, logged on a line of its own (see
			// noteFailedOpen) when served: a rate store failing later is
			// logged too.
			res.slotsFailed = true
		}
		return 0, true
	}
	for i := 0; i < k; i++ {
		s := &sout[i]
		d := core.Decision{Allowed: s.Allowed, Limit: s.Limit, Remaining: min(max(s.Limit-s.InFlight, 0), s.Limit), Policy: pols[i]}
		if !s.Allowed {
			d.RetryAfter, d.ResetAfter = InFlightRetryAfter, InFlightRetryAfter
		}
		slot[i].Decision, slot[i].Refused = d, !s.Allowed
	}
	if l.cfg.observer != nil {
		res.slotLatency = l.clock.Now().Sub(start)
	}
	if release == nil {
		l.observeSlots(res, slot[:k], false)
		copy(buf, slot[:k])
		res.kind, res.Proceed = outcomeRefused, l.cfg.dryRun
		return k, true
	}
	copy(buf[m:], slot[:k])
	for i := 0; i < k; i++ {
		out[m+i] = slot[i].Decision
	}
	res.held = release
	return m, false
}

// settle ends a decision that took in-flight slots: it puts the applied
// layers back in layer order, reports the slot layers' decisions, and gives
// the slots back unless the request proceeds.
func (l *Limiter) settle(res *Result, buf []LayerResult) {
	for i := 1; i < len(buf); i++ {
		for j := i; j > 0 && buf[j].index < buf[j-1].index; j-- {
			buf[j], buf[j-1] = buf[j-1], buf[j]
		}
	}
	if !res.Proceed && res.held != nil {
		// Given back before anything else runs (an Observer that panics
		// must not keep them), and reported without this request's slot,
		// as a layer whose cost another layer refused is.
		res.held()
		res.held = nil
		for i := range buf {
			if d := &buf[i].Decision; l.layers[buf[i].index].inFlight > 0 && d.Allowed {
				d.Remaining = min(d.Remaining+1, d.Limit)
			}
		}
	}
	if l.cfg.observer != nil {
		// Admitted when the slots stay held: the request proceeds (also a
		// dry-run refusal, which is served, and a request a failed rate
		// store served fail-open).
		admitted := res.Proceed
		for i := range buf {
			if l.layers[buf[i].index].inFlight > 0 {
				l.observeSlots(res, buf[i:i+1], admitted)
			}
		}
	}
}

// observeSlots reports the decisions of the slot layers ls to the Observer,
// if any. Slots taken are reported once the rate layers have decided (see
// settle), so that a request another layer refused is not counted as
// admitted by its concurrency layers.
func (l *Limiter) observeSlots(res *Result, ls []LayerResult, admitted bool) {
	if l.cfg.observer == nil {
		return
	}
	for i := range ls {
		l.cfg.observer.ObserveDecision(core.DecisionEvent{Key: ls[i].Key, Decision: ls[i].Decision, Admitted: admitted, DryRun: l.cfg.dryRun, Latency: res.slotLatency})
	}
}

// Release gives back the in-flight slots res holds (see [Layer.InFlight]):
// a Result of [Limiter.Decide] that proceeds holds one slot of each applied
// concurrency layer until it is released. Call it when the request has
// been served. Only the first call on any copy of the Result gives the
// slots back; later calls, and calls on a Result that holds no slot, do
// nothing.
func (res *Result) Release() {
	if res.held != nil {
		res.held()
	}
}

// AdmitFunc is [Limiter.Admit] for callers that serve the request
// themselves, such as framework adapters: it decides r and writes the
// headers and, when r must not be served, the response, and it returns
// whether to serve r and done, which gives back the in-flight slots r
// holds (see [Layer.InFlight]). Call done once the request has been served,
// with defer so that it runs on a panic too; done is never nil, and calls
// after the first do nothing. For a Limiter without concurrency layers,
// done does nothing.
//
//	ok, done := l.AdmitFunc(w, r)
//	defer done()
//	if ok {
//		next.ServeHTTP(w, r)
//	}
func (l *Limiter) AdmitFunc(w http.ResponseWriter, r *http.Request) (ok bool, done func()) {
	var res Result
	ok = l.admit(w, r, &res)
	done = res.takeRelease(ok)
	if done == nil {
		done = noRelease
	}
	return ok, done
}

// takeRelease returns the function that gives back the in-flight slots res
// holds, for a request that will be served (ok), after giving them back at
// once for one that will not; it returns nil when there is nothing left to
// give back.
func (res *Result) takeRelease(ok bool) func() {
	held := res.held
	if held != nil && !ok {
		held()
		return nil
	}
	return held
}

func noRelease() {}

// admitContext is Admit for a Limiter with concurrency layers: the slots are
// given back when the request's context ends. A request whose context can
// never end is refused with a configuration error (see noRelease).
func (l *Limiter) admitContext(w http.ResponseWriter, r *http.Request) bool {
	if r.Context().Done() == nil {
		if !l.noRelease(w, r) {
			return false
		}
		ok, done := l.AdmitFunc(w, r)
		done() // dry-run: served, its slots given back at once
		return ok
	}
	ok, done := l.AdmitFunc(w, r)
	if ok {
		context.AfterFunc(r.Context(), done)
	}
	return ok
}

// noRelease handles a request whose context can never end, on a Limiter
// with concurrency layers: nothing could give its slots back, a
// configuration error, logged. It answers it as one (500) and returns
// false; in dry-run it returns true, for the caller to serve the request,
// as dry-run serves every configuration error, giving its slots back at
// once.
func (l *Limiter) noRelease(w http.ResponseWriter, r *http.Request) bool {
	var res Result
	l.failed(&res, outcomeConfig, wrap(ErrConfig, "Admit", ErrNoRelease))
	l.logConfigError(res.Err)
	if res.Proceed {
		// Dry-run: served, unless the error handler, which sees every
		// error, stops it.
		return l.cfg.errHandler == nil || !l.callErrorHandler(w, r, res.Err)
	}
	l.Refuse(w, r, export(&res, nil))
	return false
}

// releaseWithContext calls done, if not nil, when ctx ends.
func releaseWithContext(ctx context.Context, done func()) {
	if done != nil {
		context.AfterFunc(ctx, done)
	}
}

// appendInFlightItem appends the RateLimit-Policy member of a concurrency
// layer's policy p: its quota with the unit "concurrent-requests" and no
// window, as appendItem writes items.
func appendInFlightItem(b []byte, p *core.Policy, pk []byte) []byte {
	b = append(b, '"')
	b = append(b, p.Name()...)
	b = append(b, '"', ';')
	b = append(b, ietfQuota...)
	b = append(b, '=')
	b = strconv.AppendInt(b, clampSF(p.Limit()), 10)
	b = append(b, `;qu="concurrent-requests"`...)
	if pk != nil {
		b = append(b, ';')
		b = append(b, ietfPartition...)
		b = append(b, '=', ':')
		b = base64.StdEncoding.AppendEncode(b, pk)
		b = append(b, ':')
	}
	return b
}
