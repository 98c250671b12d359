package ratelimit

import (
	"context"
	"net/http"

	"github.com/limitry/ratelimit/core"
)

// resultContextKey is the context key of the Result of an admitted request.
type resultContextKey struct{}

// resultContext is the context of a request decided by
// [Limiter.AdmitWithResult]: one allocation holds the context node, the
// Result and, for limiters of up to inlineResults layers, its Layers. It
// answers the Result only once the request is admitted, so a KeyFunc
// deciding the request never sees a half-made one.
type resultContext struct {
	context.Context
	res   Result
	ready bool
	claim uint32 // res.claim
	buf   [inlineResults]LayerResult
}

// inlineResults is the number of layer results a resultContext holds
// without another allocation: one or two layers (per IP, then per user) are
// the common case, and a larger array would cost every request its bytes.
const inlineResults = 2

func (c *resultContext) Value(key any) any {
	if _, ok := key.(resultContextKey); ok {
		if c.ready {
			return &c.res
		}
		return nil
	}
	return c.Context.Value(key)
}

// ResultFromContext returns the decision of the request whose context is
// ctx, as [Limiter.HandlerWithResult] and [Limiter.AdmitWithResult] (and the
// framework adapters' result options) store it for the requests they admit:
// the handler can show a quota in a response body, as Layers[i].Decision
// holds each applied layer's Limit and Remaining after this request.
//
// ok is false for a context that carries no Result: the request was decided
// by [Limiter.Handler] or [Limiter.Admit], which store none, or it was not
// decided at all. A stored Result may be Skipped, have no Layers (no layer
// applied), or carry Err for a store failure served under the fail-open
// policy: read it as [Limiter.Decide]'s Result. Where several Limiters
// store one, the innermost (the last to decide) is found. The Result
// belongs to the request; the handler may keep it.
func ResultFromContext(ctx context.Context) (res *Result, ok bool) {
	res, ok = ctx.Value(resultContextKey{}).(*Result)
	return res, ok
}

// AdmitWithResult is [Limiter.Admit] that also hands the decision to the
// handler: it decides r, writes the headers and, when the request must not
// be served, the response, exactly as Admit does, and returns the request
// to serve, a shallow copy of r whose context holds the Result for
// [ResultFromContext], with true, or that copy and false when the request
// must not be served (its context then holds no Result).
//
// It costs two allocations per request more than Admit, one for the context
// (holding the Result and, for up to two layers, their results) and one for
// the copy of r, and a third for a Limiter of more than two layers. Admit
// and [Limiter.Handler] pay none of them; use this only where a handler
// reads the Result.
//
// For a Limiter with concurrency layers ([Layer.InFlight]), the slots an
// admitted request holds are given back when its context ends, as with
// Admit; [Limiter.HandlerWithResult] gives them back when the handler
// returns.
func (l *Limiter) AdmitWithResult(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if l.slots != nil && r.Context().Done() == nil {
		if !l.noRelease(w, r) {
			return r, false
		}
		r2, ok, done := l.admitWithResult(w, r)
		if done != nil {
			done() // dry-run: served, its slots given back at once
		}
		return r2, ok
	}
	r2, ok, done := l.admitWithResult(w, r)
	if ok {
		releaseWithContext(r2.Context(), done)
	}
	return r2, ok
}

// AdmitWithResultFunc is [Limiter.AdmitWithResult] for callers that serve
// the request themselves, as [Limiter.AdmitFunc] is for Admit: it also
// returns done, which gives back the in-flight slots an admitted request
// holds (see [Layer.InFlight]). Call done once the request has been served,
// with defer; it is never nil, and calls after the first do nothing.
func (l *Limiter) AdmitWithResultFunc(w http.ResponseWriter, r *http.Request) (*http.Request, bool, func()) {
	r2, ok, done := l.admitWithResult(w, r)
	if done == nil {
		done = noRelease
	}
	return r2, ok, done
}

// admitWithResult is AdmitWithResult returning done, which gives back the
// in-flight slots an admitted request holds (see AdmitFunc), or nil when it
// holds none.
func (l *Limiter) admitWithResult(w http.ResponseWriter, r *http.Request) (*http.Request, bool, func()) {
	rc := &resultContext{Context: r.Context()}
	rc.res.claim = &rc.claim
	r = r.WithContext(rc)
	kr := l.routeRequest(r)
	var buf []LayerResult
	var ok bool
	if n := len(l.layers); n <= smallBatch {
		buf = rc.buf[:]
		if n > len(buf) {
			buf = make([]LayerResult, n)
		}
		var (
			reqs [smallBatch]core.Request
			out  [smallBatch]core.Decision
		)
		buf = buf[:l.decide(kr, &rc.res, buf, reqs[:], out[:], true)]
		ok = l.serve(w, r, &rc.res, buf)
	} else {
		buf, ok = l.admitManyResult(w, r, kr, &rc.res)
	}
	done := rc.res.takeRelease(ok)
	if !ok {
		return r, false, done
	}
	if len(buf) > 0 {
		rc.res.Layers = buf
	}
	rc.ready = true
	return r, true, done
}

// admitManyResult is AdmitWithResult's decision for limiters with more than
// smallBatch layers: their results live on the heap with the Result.
//
//go:noinline
func (l *Limiter) admitManyResult(w http.ResponseWriter, r, kr *http.Request, res *Result) ([]LayerResult, bool) {
	var (
		reqs [core.MaxBatch]core.Request
		out  [core.MaxBatch]core.Decision
	)
	buf := make([]LayerResult, len(l.layers))
	n := l.decide(kr, res, buf, reqs[:], out[:], true)
	return buf[:n], l.serve(w, r, res, buf[:n])
}

// HandlerWithResult is [Limiter.Handler] whose next handler can read each
// admitted request's decision with [ResultFromContext] (express-rate-limit's
// req.rateLimit), for instance to show the remaining quota in a response
// body. It costs two allocations per request more than Handler (three for
// more than two layers, see [Limiter.AdmitWithResult]), which is why Handler
// does not do it. It panics
// if next is nil.
func (l *Limiter) HandlerWithResult(next http.Handler) http.Handler {
	if next == nil {
		panic("ratelimit: HandlerWithResult called with a nil http.Handler")
	}
	if l.cfg.refund != nil {
		return l.refundResultHandler(next) // see WithRefund
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, ok, done := l.admitWithResult(w, r)
		if done != nil {
			defer done() // also when next panics or hijacks
		}
		if ok {
			next.ServeHTTP(w, r)
		}
	})
}
