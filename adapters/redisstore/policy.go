package redisstore

import (
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitry/ratelimit/core"
)

// policyInfo is what the script needs of a policy, computed once.
type policyInfo struct {
	args any    // "alg W L cap maxDelay tauQ tauR" (times in µs), boxed once
	name string // the policy name, escaped for keys
	err  error  // why the Redis store cannot decide under the policy
}

// policyCache maps *core.Policy to *policyInfo. Policies are immutable and
// normally few and long-lived; past maxCachedPolicies (a program that
// makes a policy per request) infos are computed per call instead.
var (
	policyCache  sync.Map
	policyCached atomic.Int64
)

const maxCachedPolicies = 4096

func infoOf(p *core.Policy) *policyInfo {
	if v, ok := policyCache.Load(p); ok {
		return v.(*policyInfo)
	}
	info := newPolicyInfo(p)
	if policyCached.Load() < maxCachedPolicies {
		if _, loaded := policyCache.LoadOrStore(p, info); !loaded {
			policyCached.Add(1)
		}
	}
	return info
}

func newPolicyInfo(p *core.Policy) *policyInfo {
	info := &policyInfo{name: escapeName(p.Name())}
	var alg byte
	switch p.Algorithm() {
	case core.TokenBucket, core.LeakyBucket:
		alg = 'g'
	case core.FixedWindow:
		alg = 'f'
	case core.SlidingWindowCounter:
		alg = 'c'
	case core.SlidingWindowLog:
		alg = 'l'
	default:
		info.err = fmt.Errorf("%w: policy %q uses %q", ErrUnsupportedAlgorithm, p.Name(), p.Algorithm().Name())
		return info
	}
	w, md := p.Window(), p.MaxDelay()
	if w%time.Microsecond != 0 || md%time.Microsecond != 0 {
		info.err = fmt.Errorf("%w: policy %q: Window (%v) and MaxDelay (%v) must be whole microseconds", ErrUnsupportedRule, p.Name(), w, md)
		return info
	}
	wus, mdus := uint64(w/time.Microsecond), uint64(md/time.Microsecond)
	limit, capacity := uint64(p.Limit()), uint64(p.Capacity())
	// tau = capacity x W / L, at most MaxWindow (NewPolicy checks it in
	// nanoseconds), so the quotient fits.
	hi, lo := bits.Mul64(capacity, wus)
	tauQ, tauR := bits.Div64(hi, lo, limit)
	b := make([]byte, 0, 96)
	b = append(b, alg, ' ')
	for i, v := range [...]uint64{wus, limit, capacity, mdus, tauQ, tauR} {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, v, 10)
	}
	info.args = string(b)
	return info
}
