package redisstore

import (
	"encoding/binary"
	"errors"
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
	args any    // alg W L cap maxDelay tauQ tauR (times in µs; see policyArg), boxed once
	name string // the policy name, escaped for keys
	err  error  // why the Redis store cannot decide under the policy
}

// policyGen is one generation of the policy cache: a map of *core.Policy
// to *policyInfo, and the number of infos stored in it.
type policyGen struct {
	m sync.Map
	n atomic.Int64
}

// policyCache holds the current generation. Policies are immutable and
// normally few and long-lived; a program that makes many (a Resolver
// building a policy per tenant or per request, rules reloaded over and
// over) fills a generation with maxCachedPolicies infos, and the next
// info starts a new, empty one: the policies in use are cached again as
// they are met, and those no longer used are let go.
var policyCache atomic.Pointer[policyGen]

func init() { policyCache.Store(new(policyGen)) }

const maxCachedPolicies = 4096

// unsupportedError is a sentinel error of the store that wraps
// core.ErrUnsupportedPolicy.
type unsupportedError struct{ msg string }

func (e *unsupportedError) Error() string { return e.msg }
func (e *unsupportedError) Unwrap() error { return core.ErrUnsupportedPolicy }

// CheckPolicy implements core.PolicyChecker: it returns nil when the store
// can decide p, and otherwise the error Take would return for it
// (wrapping ErrUnsupportedAlgorithm or ErrUnsupportedRule, and
// core.ErrUnsupportedPolicy).
func (s *Store) CheckPolicy(p *core.Policy) error {
	if p == nil {
		return errors.New("redisstore: CheckPolicy of a nil policy")
	}
	return infoOf(p).err
}

func infoOf(p *core.Policy) *policyInfo {
	g := policyCache.Load()
	if v, ok := g.m.Load(p); ok {
		return v.(*policyInfo)
	}
	info := newPolicyInfo(p)
	if g.n.Load() >= maxCachedPolicies {
		// Full: a new generation (one caller makes it; the others use it).
		policyCache.CompareAndSwap(g, new(policyGen))
		g = policyCache.Load()
	}
	if v, loaded := g.m.LoadOrStore(p, info); loaded {
		return v.(*policyInfo)
	}
	g.n.Add(1)
	return info
}

func newPolicyInfo(p *core.Policy) *policyInfo {
	info := &policyInfo{name: escapeName(p.Name())}
	var alg, id byte
	switch p.Algorithm() {
	case core.TokenBucket:
		alg, id = 'g', 't'
	case core.LeakyBucket:
		alg, id = 'g', 'k'
	case core.FixedWindow:
		alg, id = 'f', 'f'
	case core.SlidingWindowCounter:
		alg, id = 'c', 'c'
	case core.SlidingWindowLog:
		alg, id = 'l', 'l'
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
	tag := identityTag(id, limit, wus, capacity)
	info.args = policyArg(alg, tag, wus, limit, capacity, mdus, tauQ, tauR)
	return info
}

// identityTag is the form of core.Policy.Identity stored with every record
// (see the package documentation): the algorithm's code ('t' token bucket,
// 'k' leaky bucket, 'f' fixed window, 'c' sliding window counter, 'l'
// sliding window log), then Limit, Window in microseconds and capacity,
// which the script needs to read a record written under another policy.
// Two policies have equal tags exactly when they have equal Identities
// (the store runs only policies whose Window is whole microseconds).
func identityTag(id byte, limit, wus, capacity uint64) string {
	return string(id) + "," + strconv.FormatUint(limit, 10) + "," + strconv.FormatUint(wus, 10) + "," + strconv.FormatUint(capacity, 10)
}

// policyArg encodes a policy for the script as MessagePack, which the
// script decodes with cmsgpack.unpack (built into Redis since 2.6) at a
// fraction of the cost of matching and converting decimal text: the
// algorithm's code as a one-character string, its identity tag as a
// string, then the six parameters as unsigned integers in their shortest
// form. Each is below 2^53, so each decodes to an exact Lua number.
func policyArg(alg byte, tag string, vs ...uint64) string {
	b := make([]byte, 0, 2+3+len(tag)+9*len(vs))
	b = append(b, 0xa1, alg)                                             // fixstr of length 1
	b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(len(tag))) // raw16
	b = append(b, tag...)
	for _, v := range vs {
		switch {
		case v < 1<<7:
			b = append(b, byte(v)) // positive fixint
		case v < 1<<8:
			b = append(b, 0xcc, byte(v))
		case v < 1<<16:
			b = binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
		case v < 1<<32:
			b = binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
		default:
			b = binary.BigEndian.AppendUint64(append(b, 0xcf), v)
		}
	}
	return string(b)
}
