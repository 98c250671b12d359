package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/limitry/ratelimit/core"
)

// ErrUnknownLayer is returned by [Limiter.Reset] for a name no layer has.
var ErrUnknownLayer = errors.New("ratelimit: no layer of that name")

// msgRefund is logged once per Limiter when a refund fails.
const msgRefund = "ratelimit: refunding a request failed: the request stays charged"

// refundConfig is the WithRefund option of one Limiter.
type refundConfig struct {
	refund func(r *http.Request, status int) bool
}

// WithRefund gives back what a request was charged when refund, called
// after the handler ran with the status it wrote (200 when it wrote none),
// returns true: every layer the request was charged by is refunded, in one
// atomic store call (see core.Refunder), so that only some responses count
// against the quota. [RefundSuccessful] counts only failed requests (failed
// logins, say: express-rate-limit's skipSuccessfulRequests) and
// [RefundFailed] only successful ones (skipFailedRequests).
//
// A request is refunded only when [Limiter.Handler] served it after
// charging it: refused, skipped, dry-run-refused and failed decisions
// charged nothing and are given nothing back, and a handler that panics is
// refunded nothing. The refund happens at the Limiter's clock when the
// handler returns and names the time of the charge (core.Request's
// ChargedAt), so it gives back only what that charge still holds: nothing
// that has recovered meanwhile (a bucket never fills above its capacity),
// nothing once the charge's window is over, and none of the units of
// requests charged while the handler ran. Three kinds of layer keep their
// charge: a shaping layer (a rule with MaxDelay), whose bucket would give
// back its latest units, the place of a request booked behind this one,
// a layer whose key [Limiter.Reset] reset since (or while) the charge
// was made, whose record holds only later charges, and a layer whose rule
// [Limiter.SetRules] replaced while the request ran (see SetRules). The
// memory store also keeps the charge of a key it evicted since (see
// core.Refunder). Behind
// http.TimeoutHandler, a request that timed out is judged by the status
// its handler wrote, not the 503 the client got. It uses the request's context
// without its cancellation, so a client that hung up does not keep its
// charge. A failed refund leaves the charge in place (the limiter errs
// on the side of limiting), is reported to the Observer's ObserveError and
// logged once.
//
// The rate-limit headers are written before the handler runs, so they
// describe the request as charged: a refunded request leaves more quota
// than they said, never less, and they never over-promise.
//
// Refunds need a store implementing core.Refunder (the MemoryStore does),
// and algorithms implementing core.AlgorithmRefunder (the built-in ones
// do); otherwise New returns an error for the store, and a custom
// algorithm's refund fails as above. They apply to [Limiter.Handler] and
// [Limiter.HandlerWithResult]; flows built on [Limiter.Decide] or
// [Limiter.AdmitWithResult], such as framework adapters, refund with
// [Limiter.Refund]. refund must be safe for concurrent use.
func WithRefund(refund func(r *http.Request, status int) bool) Option {
	return func(c *config) {
		if refund == nil {
			c.fail("WithRefund: nil function")
			return
		}
		c.refund = &refundConfig{refund: refund}
	}
}

// checkRefund refuses WithRefund over a store that cannot refund.
func checkRefund(c *config, store core.Store) error {
	if c.refund == nil {
		return nil
	}
	if _, ok := store.(core.Refunder); !ok {
		return fmt.Errorf("ratelimit: WithRefund: the store (%T) cannot refund: it does not implement core.Refunder", store)
	}
	return nil
}

// RefundsByStatus reports whether the Limiter refunds by response status
// ([WithRefund]). Only [Limiter.Handler] and [Limiter.HandlerWithResult]
// see the status a handler writes; framework adapters that serve through
// [Limiter.AdmitFunc] use it to pass such a Limiter to Handler, or to
// refuse it at construction rather than never refund.
func (l *Limiter) RefundsByStatus() bool { return l.cfg.refund != nil }

// RefundSuccessful reports whether status is below 400: with [WithRefund],
// only failed requests count against the quota, as express-rate-limit's
// skipSuccessfulRequests does (count failed logins, and successful ones not
// at all).
func RefundSuccessful(_ *http.Request, status int) bool { return status < 400 }

// RefundFailed reports whether status is 400 or above: with [WithRefund],
// only successful requests count against the quota, as express-rate-limit's
// skipFailedRequests does.
func RefundFailed(_ *http.Request, status int) bool { return status >= 400 }

// refundHandler is Handler with WithRefund: Admit, then the handler with
// its status recorded, then the refund.
func (l *Limiter) refundHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var (
			res  Result
			buf  [core.MaxBatch]LayerResult
			reqs [core.MaxBatch]core.Request
			out  [core.MaxBatch]core.Decision
		)
		n := l.decide(l.routeRequest(r), &res, buf[:], reqs[:], out[:], true)
		ok := l.serve(w, r, &res, buf[:n])
		if done := res.takeRelease(ok); done != nil {
			defer done() // the in-flight slots, also when next panics
		}
		if !ok {
			return
		}
		if !charged(&res, buf[:n]) {
			next.ServeHTTP(w, r)
			return
		}
		if l.serveRefundable(w, r, next) {
			var rq [core.MaxBatch]core.Request
			if k := l.refundRequests(buf[:n], res.rs, res.at, &rq); k > 0 && claimRefund(&res) {
				l.refund(context.WithoutCancel(r.Context()), rq[:k])
			}
		}
	})
}

// refundResultHandler is HandlerWithResult with WithRefund.
func (l *Limiter) refundResultHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, ok, done := l.admitWithResult(w, r)
		if done != nil {
			defer done() // the in-flight slots, also when next panics
		}
		if !ok {
			return
		}
		res, _ := ResultFromContext(r.Context())
		if !charged(res, res.Layers) {
			next.ServeHTTP(w, r)
			return
		}
		// The handler may have refunded its Result, or a copy of it,
		// itself (Limiter.Refund): a charge is given back at most once.
		if l.serveRefundable(w, r, next) {
			var rq [core.MaxBatch]core.Request
			if k := l.refundRequests(res.Layers, res.rs, res.at, &rq); k > 0 && claimRefund(res) {
				l.refund(context.WithoutCancel(r.Context()), rq[:k])
			}
		}
	})
}

// serveRefundable serves a charged request with its status recorded and
// reports whether the WithRefund function asks for a refund. A panic in
// next goes up with no refund.
func (l *Limiter) serveRefundable(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
	hw, sw := newStatusWriter(w)
	next.ServeHTTP(hw, r)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	return l.cfg.refund.refund(r, status)
}

// charged reports whether the request of res, whose applied layers are
// layers, was charged and not refunded since: every applied layer admitted
// it, nothing failed, and it was decided, not peeked.
func charged(res *Result, layers []LayerResult) bool {
	return len(layers) > 0 && res.Err == nil && res.kind == outcomeOK && !res.peeked &&
		(res.claim == nil || atomic.LoadUint32(res.claim) == 0)
}

// claimRefund claims the refund of res's charge: true for the first
// caller, whichever copy of the Result it holds (the copies share
// res.claim), false for every later one. A Result without a claim cell
// (one the caller cannot have copied) is claimed at once.
func claimRefund(res *Result) bool {
	return res.claim == nil || atomic.CompareAndSwapUint32(res.claim, 0, 1)
}

// refundRequests fills reqs with the charges of layers, the applied layers
// of a charged request of this Limiter decided under the rule set rs at the
// Unix nanosecond at (their ChargedAt, so that a refund made after later
// charges or a window boundary gives back only what this charge still
// holds), and returns their number: every rate layer (a concurrency layer holds a slot,
// not a charge). It returns 0 for layers that were not all charged.
//
// A layer decided under its own rule that SetRules has since replaced by a
// rule of another core.Policy.Identity (even if a later SetRules brought
// the charge's rule back) keeps its charge. Refunding under the old rule
// would carry the key's state back to it, clamped to the old capacity,
// crediting what was charged since (see core.Refunder); and under the new
// one, the key's record holds only the units the first request under it
// found in use, in absolute numbers: a charge whose units had come back by
// then is not among them, and a refund naming its time would give back a
// later request's unit. The same rule set again reads the record as it was
// charged: the refund is made under it.
func (l *Limiter) refundRequests(layers []LayerResult, rs *ruleSet, at int64, reqs *[core.MaxBatch]core.Request) int {
	cur := l.rules.Load()
	n := 0
	for i := range layers {
		ly := &layers[i]
		idx, kept := ly.index, false
		if rs == nil && ly.Decision.Policy != nil {
			idx, kept = l.handBuilt(ly.Decision.Policy, cur)
		}
		if idx >= 0 && idx < len(l.layers) && l.layers[idx].inFlight > 0 {
			continue
		}
		if n == len(reqs) || ly.Refused || !ly.Decision.Allowed || ly.Decision.Policy == nil {
			return 0
		}
		if idx >= 0 && idx < len(l.layers) && l.resetCount(l.layers[idx].name, ly.Key) != ly.resets {
			// Reset since (or while) the layer was charged: the key's
			// record holds only later charges, none of this one, and a
			// refund would give back one of theirs. (A layer built by
			// hand, which does not say how many resets it followed,
			// keeps its charge once its key has ever been reset.)
			continue
		}
		if kept {
			continue // see handBuilt
		}
		p, cost := ly.Decision.Policy, ly.Cost
		if rs != nil && rs != cur && own(rs, ly) && ly.index < len(cur.rules) {
			if cur.rules[ly.index].gen != rs.rules[ly.index].gen {
				continue // replaced since: the charge stays (see above)
			}
			p = cur.rules[ly.index].policy // of the same Identity
		}
		if ly.Decision.Policy.MaxDelay() > 0 || p.MaxDelay() > 0 {
			// A shaping layer (under the rule that charged it or the
			// one in force) keeps its charge: a bucket gives back its
			// latest units, not this request's, so that with requests
			// booked behind it meanwhile, the next request would be
			// released with one of them (as the Transport keeps a shaped
			// charge it does not send).
			continue
		}
		reqs[n] = core.Request{Policy: p, Key: ly.Key, Cost: cost, Fallback: ly.Decision.Fallback}
		if at != 0 {
			// When the charge began to give its units back, so that the
			// refund gives back only what it still holds.
			reqs[n].ChargedAt = ly.Decision.Policy.ChargeStart(time.Unix(0, at), ly.Cost, ly.Decision)
		}
		n++
	}
	return n
}

// handBuilt returns, for a layer of a Result built by hand (which says
// neither the layer it belongs to nor the rules it was decided under), the
// index of the layer p, its Decision.Policy, belongs to (the layer of that
// name, or the one whose Resolver lists p's name), and whether its charge
// stays. A policy the layer's Resolver lists is not a rule SetRules
// replaces: its charge is refunded under it. The charge stays when p is
// named as a layer but is neither its rule in force nor one of those (a
// rule SetRules has replaced since, whose refund would carry the key's
// state back to it, see refundRequests; or a policy the layer's Resolver
// returned unlisted under the layer's name, which cannot be told from
// one), and when no layer names or lists p's name (a policy a Resolver
// returned unlisted, whose layer, and so whose resets, cannot be told).
func (l *Limiter) handBuilt(p *core.Policy, cur *ruleSet) (int, bool) {
	i, ok := l.owners[p.Name()]
	if !ok {
		return -1, true
	}
	if l.layers[i].name != p.Name() || slices.Contains(l.layers[i].listed, p) {
		return i, false
	}
	return i, i >= len(cur.rules) || cur.rules[i].policy != p
}

// Refund gives back what the request res was decided for was charged, on
// every layer but those that keep their charge (a shaping layer, a layer
// whose key Reset reset since the charge, and a layer whose rule SetRules
// replaced since: see [WithRefund]; in a Result built by hand, which says
// neither its layers' places nor the rules they were decided under, a
// layer whose Decision.Policy is named as a layer but is neither its rule
// in force nor a policy its Resolver lists (core.PolicyLister), a layer
// whose policy no layer names or its Resolver lists, and a layer whose key
// Reset has ever reset), in one
// atomic store call (see core.Refunder), for flows
// built on [Limiter.Decide] or [Limiter.AdmitWithResult] (a framework
// handler reading [ResultFromContext]) that decide on a refund themselves;
// [WithRefund] does it for [Limiter.Handler] and
// [Limiter.HandlerWithResult]. A Result that charged nothing (refused,
// skipped, failed, no layer applied, or one of [Limiter.Peek]) or that was
// already refunded, through it or any copy of it, is left alone: Refund
// returns nil, so a charge is given back at most once (under [WithRefund],
// a handler that refunds its own Result is not refunded again after it
// returns; refund it from the handler, not from a goroutine that outlives
// it). Refund uses ctx as is: pass context.WithoutCancel(r.Context())
// to refund for a client that has gone. It returns an error wrapping
// core.ErrUnsupported when the store cannot refund, and the store's error,
// after which the charge stays.
func (l *Limiter) Refund(ctx context.Context, res *Result) error {
	if res == nil || !charged(res, res.Layers) {
		return nil
	}
	var reqs [core.MaxBatch]core.Request
	n := l.refundRequests(res.Layers, res.rs, res.at, &reqs)
	if n == 0 {
		return nil // only concurrency layers applied: a slot is no charge
	}
	if _, ok := l.cl.Store().(core.Refunder); !ok {
		return fmt.Errorf("%w: refund: the store (%T) does not implement core.Refunder", core.ErrUnsupported, l.cl.Store())
	}
	if !claimRefund(res) {
		return nil
	}
	if err := l.refund(ctx, reqs[:n]); err != nil {
		if res.claim != nil {
			atomic.StoreUint32(res.claim, 0) // the charge stays: it may be refunded again
		}
		return err
	}
	return nil
}

// refund gives back the batch reqs, reporting a failure (to the Observer,
// and logged once), and returns it. The end of the caller's context (its
// client went away) is no store failure: returned, not reported.
func (l *Limiter) refund(ctx context.Context, reqs []core.Request) error {
	var start time.Time
	if l.cfg.observer != nil {
		start = l.clock.Now() // the Limiter's clock, as every latency it reports
	}
	err := l.cl.Refund(ctx, reqs)
	if err == nil || ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	if l.cfg.observer != nil {
		ps := make([]*core.Policy, len(reqs))
		for i := range reqs {
			ps[i] = reqs[i].Policy
		}
		l.cfg.observer.ObserveError(core.ErrorEvent{Policies: ps, Err: fmt.Errorf("ratelimit: refund: %w", err), Latency: l.clock.Now().Sub(start)})
	}
	l.logOnce(logRefund, msgRefund, "error", err.Error())
	return err
}

// refundStopped gives back the charge of res, a request whose rate layers
// admitted it and that the error handler stopped (it was not served).
func (l *Limiter) refundStopped(r *http.Request, res *Result, layers []LayerResult) {
	if !charged(res, layers) {
		return
	}
	var reqs [core.MaxBatch]core.Request
	if n := l.refundRequests(layers, res.rs, res.at, &reqs); n > 0 && claimRefund(res) {
		l.refund(context.WithoutCancel(r.Context()), reqs[:n])
	}
}

// statusWriter records the status a handler writes: the first final
// WriteHeader (not 1xx, but for 101 Switching Protocols, which net/http
// sends as final), or 200 on the first Write, ReadFrom or successful
// flush. The handler gets it inside a writer that keeps the optional
// interfaces of the writer it wraps (http.Flusher, http.Hijacker,
// http.Pusher: see newStatusWriter) and claims no other;
// http.ResponseController reaches the rest through Unwrap.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom lets io.Copy reach the writer's own io.ReaderFrom (net/http's
// response sends a file with sendfile), or copies as Write would.
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, r)
}

// writerOnly hides every method of a writer but Write, so that io.Copy
// does not call ReadFrom again.
type writerOnly struct{ io.Writer }

// FlushError flushes the underlying writer, as http.ResponseController
// does, and returns its error (http.ErrNotSupported when it cannot flush):
// a flush that fails starts no response, and records no status.
func (w *statusWriter) FlushError() error {
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err == nil && w.status == 0 {
		w.status = http.StatusOK
	}
	return err
}

// Unwrap lets http.ResponseController reach the underlying writer. A
// connection hijacked that way, through a writer that is no http.Hijacker
// but unwraps to one, counts as status 200 unless a status was written.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hijack hijacks the underlying connection; a hijacked connection counts
// as status 101 Switching Protocols unless a status was written.
func (w *statusWriter) hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

// The optional interfaces of a statusWriter, one type per part, combined
// by newStatusWriter as the underlying writer has them.
type (
	flushPart  struct{ w *statusWriter }
	hijackPart struct{ w *statusWriter }
	pushPart   struct{ w *statusWriter }
)

// Flush implements http.Flusher.
func (p flushPart) Flush() { _ = p.w.FlushError() }

// Hijack implements http.Hijacker.
func (p hijackPart) Hijack() (net.Conn, *bufio.ReadWriter, error) { return p.w.hijack() }

// Push implements http.Pusher.
func (p pushPart) Push(target string, opts *http.PushOptions) error {
	return p.w.ResponseWriter.(http.Pusher).Push(target, opts)
}

// Writers with the optional interfaces of the writers they wrap (see
// newStatusWriter), each one allocation, the parts pointing at its own
// statusWriter.
type (
	swF struct {
		statusWriter
		flushPart
	}
	swH struct {
		statusWriter
		hijackPart
	}
	swP struct {
		statusWriter
		pushPart
	}
	swFH struct {
		statusWriter
		flushPart
		hijackPart
	}
	swFP struct {
		statusWriter
		flushPart
		pushPart
	}
	swHP struct {
		statusWriter
		hijackPart
		pushPart
	}
	swFHP struct {
		statusWriter
		flushPart
		hijackPart
		pushPart
	}
)

// newStatusWriter returns the writer a handler gets in place of w, which
// has http.Flusher, http.Hijacker and http.Pusher exactly when w has them,
// and the statusWriter inside it that records the status.
func newStatusWriter(w http.ResponseWriter) (http.ResponseWriter, *statusWriter) {
	_, f := w.(http.Flusher)
	_, h := w.(http.Hijacker)
	_, p := w.(http.Pusher)
	switch {
	case f && h && p:
		x := &swFHP{statusWriter: statusWriter{ResponseWriter: w}}
		x.flushPart.w, x.hijackPart.w, x.pushPart.w = &x.statusWriter, &x.statusWriter, &x.statusWriter
		return x, &x.statusWriter
	case f && h:
		x := &swFH{statusWriter: statusWriter{ResponseWriter: w}}
		x.flushPart.w, x.hijackPart.w = &x.statusWriter, &x.statusWriter
		return x, &x.statusWriter
	case f && p:
		x := &swFP{statusWriter: statusWriter{ResponseWriter: w}}
		x.flushPart.w, x.pushPart.w = &x.statusWriter, &x.statusWriter
		return x, &x.statusWriter
	case h && p:
		x := &swHP{statusWriter: statusWriter{ResponseWriter: w}}
		x.hijackPart.w, x.pushPart.w = &x.statusWriter, &x.statusWriter
		return x, &x.statusWriter
	case f:
		x := &swF{statusWriter: statusWriter{ResponseWriter: w}}
		x.flushPart.w = &x.statusWriter
		return x, &x.statusWriter
	case h:
		x := &swH{statusWriter: statusWriter{ResponseWriter: w}}
		x.hijackPart.w = &x.statusWriter
		return x, &x.statusWriter
	case p:
		x := &swP{statusWriter: statusWriter{ResponseWriter: w}}
		x.pushPart.w = &x.statusWriter
		return x, &x.statusWriter
	}
	x := &statusWriter{ResponseWriter: w}
	return x, x
}

// Peek returns the Result r would get from [Limiter.Decide], without
// charging anything and without writing headers: the same keys, policies,
// costs and decisions, through the store's core.Peeker. A store that is not
// a Peeker gives a Result whose Err wraps [ErrStoreFailure] and
// core.ErrUnsupported. It takes no waiting-room slot, so a shaping layer's
// Delay is reported but not reserved. Decisions a store's fallback made
// carry core.Decision.Fallback, as Decide's do, but a peek is not logged as
// one (the line is logged for a decision that charges).
func (l *Limiter) Peek(r *http.Request) Result {
	var (
		res  Result
		reqs [core.MaxBatch]core.Request
		out  [core.MaxBatch]core.Decision
	)
	buf := make([]LayerResult, len(l.layers))
	if n := l.decideOrPeek(l.routeRequest(r), &res, buf, reqs[:], out[:], false, true, nil); n > 0 {
		res.Layers = buf[:n]
	}
	res.peeked = true
	return res
}

// Reset forgets key's state under the layer named layerName (its Rule's
// Name, core.DefaultName for an unnamed layer), so that the key's next
// request finds that layer's quota whole: after a successful login, say.
// For a layer with a Resolver, the key is reset under the policy the
// Resolver picks for it. key is the layer's key as its KeyFunc gives it
// (LayerResult.Key): for a client-IP layer, an IPv6 client's key is its
// network ("2001:db8::/64" with the default IPv6Prefix), not its address,
// and resetting a key that holds no state does nothing. A refund of a
// charge made before the reset gives nothing back on that layer (see
// [WithRefund]), nor does one of a charge made while the reset runs; the
// Limiter counts its resets in 1,024 slots by hash, so a key sharing a
// slot with a key reset since its charge keeps its charge too. Once a
// Limiter has reset a key, each decision hashes its layers' keys once
// more to read their counts. It returns an error
// wrapping ErrUnknownLayer for a name no layer has, and one wrapping
// core.ErrUnsupported when the store is not a core.Resetter or the layer
// is a concurrency layer (Layer.InFlight): its slots are given back by the
// requests that hold them, and freeing them otherwise would let more than
// InFlight requests run at once.
func (l *Limiter) Reset(ctx context.Context, layerName, key string) error {
	rs := l.rules.Load()
	for i := range l.layers {
		ly := &l.layers[i]
		if ly.name != layerName {
			continue
		}
		if ly.inFlight > 0 {
			return fmt.Errorf("%w: Reset: layer %s is a concurrency layer (InFlight): its slots are given back by the requests that hold them", core.ErrUnsupported, ly.desc)
		}
		p := rs.rules[i].policy
		if ly.resolver != nil {
			rp, err := ly.resolver.Resolve(ctx, key)
			if err != nil {
				return wrap(ErrStoreFailure, "layer "+ly.desc+": resolving the policy", err)
			}
			if rp != nil {
				if err := l.clashes(i, rp, nil); err != nil {
					return wrap(ErrConfig, "layer "+ly.desc, err)
				}
				p = rp
			}
		}
		// Counted before and after the store's reset, so that a request
		// charged meanwhile, whose charge the reset may or may not have
		// erased, keeps it too.
		l.noteReset(layerName, key)
		defer l.noteReset(layerName, key)
		return l.cl.Reset(ctx, p, key)
	}
	return fmt.Errorf("%w: %q", ErrUnknownLayer, layerName)
}

// resetSlots is the number of counts a resetLog keeps.
const resetSlots = 1024

// resetLog counts the resets of each layer's keys (Limiter.Reset), so
// that the refund of a charge made before a reset gives nothing back (the
// record then holds only charges made after it): a charge reads its
// key's count first, and its refund gives nothing back if the count has
// changed. Keys share resetSlots counts by hash: a key sharing one with a
// key reset since its charge keeps its charge too, which errs on the side
// of limiting. It knows only this Limiter's resets.
type resetLog struct {
	seed  maphash.Seed
	count [resetSlots]atomic.Uint64
}

// slot returns the count of layer name's key.
func (r *resetLog) slot(name, key string) *atomic.Uint64 {
	var h maphash.Hash
	h.SetSeed(r.seed)
	h.WriteString(name)
	h.WriteByte(0)
	h.WriteString(key)
	return &r.count[h.Sum64()%resetSlots]
}

// noteReset counts a reset of layer name's key.
func (l *Limiter) noteReset(name, key string) {
	r := l.resets.Load()
	if r == nil {
		l.resets.CompareAndSwap(nil, &resetLog{seed: maphash.MakeSeed()})
		r = l.resets.Load()
	}
	r.slot(name, key).Add(1)
}

// resetCount returns the count of resets of layer name's key: 0 before
// any Reset.
func (l *Limiter) resetCount(name, key string) uint64 {
	if r := l.resets.Load(); r != nil {
		return r.slot(name, key).Load()
	}
	return 0
}
