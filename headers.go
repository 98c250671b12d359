package ratelimit

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/limitry/ratelimit/core"
)

// Response header names. The constants use the conventional spelling; the
// middleware stores them under their canonical form ("X-Ratelimit-Limit"),
// which http.Header.Get finds from either spelling.
const (
	// HeaderRateLimitLimit is the capacity of the most restrictive applied
	// layer (core.Policy.Capacity): the most requests (cost units) it can
	// admit at once, and the upper bound of X-RateLimit-Remaining. That is
	// the Rule's Burst if set, else its Limit for TokenBucket and the window
	// algorithms and 1 for LeakyBucket, so it can differ from the q of
	// RateLimit-Policy, which is the Limit.
	HeaderRateLimitLimit = "X-RateLimit-Limit"

	// HeaderRateLimitRemaining is the number of units the most restrictive
	// applied layer would admit immediately after this request.
	HeaderRateLimitRemaining = "X-RateLimit-Remaining"

	// HeaderRateLimitReset is when the most restrictive applied layer's
	// quota is whole again: the Unix epoch second, rounded up, or with
	// [WithResetDelta] the number of seconds from now, rounded up.
	HeaderRateLimitReset = "X-RateLimit-Reset"

	// HeaderRateLimit is the IETF RateLimit field: the current state of
	// every applied layer ("name";r=<remaining>;t=<seconds>).
	HeaderRateLimit = "RateLimit"

	// HeaderRateLimitPolicy is the IETF RateLimit-Policy field: the quota
	// of every applied layer ("name";q=<limit>;w=<window seconds>).
	HeaderRateLimitPolicy = "RateLimit-Policy"

	// HeaderRetryAfter is set on every 429 response: the seconds to wait
	// before retrying, rounded up, at least 1 (RFC 9110 delay-seconds).
	HeaderRetryAfter = "Retry-After"
)

// Canonical forms, used as map keys to skip canonicalisation.
const (
	canonLimit     = "X-Ratelimit-Limit"
	canonRemaining = "X-Ratelimit-Remaining"
	canonReset     = "X-Ratelimit-Reset"
	canonRateLimit = "Ratelimit"
	canonPolicy    = "Ratelimit-Policy"
	canonRetry     = "Retry-After"
)

// HeaderSet selects the rate-limit header sets a [Limiter] writes (see
// [WithHeaders]). Sets combine with |.
type HeaderSet uint8

const (
	// XRateLimitHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset, the de facto standard most clients read. With
	// several layers the most restrictive applied layer speaks: when the
	// request is refused, the refusing layer with the longest RetryAfter;
	// otherwise the layer with the least Remaining (on a tie, the one with
	// the longer ResetAfter).
	XRateLimitHeaders HeaderSet = 1 << iota

	// IETFHeaders are the RateLimit-Policy and RateLimit fields of
	// draft-ietf-httpapi-ratelimit-headers (drafts 08 to 10), Structured
	// Field Lists with one item per applied layer:
	//
	//	RateLimit-Policy: "per-ip";q=100;w=60, "per-user";q=10;w=60
	//	RateLimit: "per-ip";r=97;t=2, "per-user";r=0;t=6
	//
	// q is the Rule's Limit and w its Window in whole seconds (rounded up,
	// at least 1). r is the Remaining units. t, in seconds rounded up, is
	// the time until the layer's quota is whole again (Decision.ResetAfter),
	// except for a layer that refused the request, where it is the time
	// until the same request would be admitted (Decision.RetryAfter): the
	// moment Retry-After names when that layer is the one that sets it, and
	// never a later one. Integers are clamped to 15 digits. With
	// [WithPartitionKey] each item also carries pk.
	IETFHeaders

	// AllHeaders writes both sets.
	AllHeaders = XRateLimitHeaders | IETFHeaders

	// NoHeaders writes no rate-limit headers; Retry-After is still set on
	// every 429.
	NoHeaders HeaderSet = 0
)

// IETF field parameter names, in one place: a later draft may rename them.
const (
	ietfQuota     = "q"
	ietfWindow    = "w"
	ietfRemaining = "r"
	ietfReset     = "t"
	ietfPartition = "pk"
)

// maxSFInteger is the largest Structured Field Integer (15 digits).
const maxSFInteger = 999_999_999_999_999

// sharedDigits reports whether X-RateLimit-Remaining takes its digits from
// the response's one allocation (the RateLimit field's r, or the
// X-RateLimit set's block) for remaining: beyond the cached small numbers,
// and within the Structured Field Integers the RateLimit field clamps to.
func sharedDigits(remaining int64) bool {
	return remaining > maxSmallInt && remaining <= maxSFInteger
}

// pkLen is the number of SHA-256 bytes in a partition key.
const pkLen = 12

// WriteHeaders sets the rate-limit headers of res, a Result of this
// Limiter's Decide (or one built by hand from its exported fields, see
// [Limiter.Refuse]), on h, per the Limiter's
// header sets (see [HeaderSet]), and Retry-After when res is a refusal that
// promises a retry time. Headers are set, replacing earlier values, never
// added. It writes nothing for a skipped Result or one without Layers (no
// layer applied, or an error left nothing decided). A layer of a Result
// built by hand without its Decision.Policy has no item in the IETF
// fields, which are not written when no layer has one. In dry-run mode the
// headers describe the decisions but Retry-After is not sent, since the
// request is served.
func (l *Limiter) WriteHeaders(h http.Header, res *Result) { l.writeHeaders(h, res, res.Layers) }

// writeHeaders is WriteHeaders with the layers passed apart (see
// Limiter.Admit).
func (l *Limiter) writeHeaders(h http.Header, res *Result, ls []LayerResult) {
	if res.Skipped || len(ls) == 0 {
		return
	}
	// A Result built by hand has no rule set: its headers use the rules in
	// force, not recorded in it (a refund would take them for the rules it
	// was decided under).
	rs := res.rs
	if rs == nil {
		rs = l.rules.Load()
	}
	kind := outcomeOf(res, ls)
	retry := !res.Proceed && (kind == outcomeRefused || kind == outcomeQueueFull)
	set := l.cfg.headers
	n := 0
	if set&XRateLimitHeaders != 0 {
		n += 3
	}
	if set&IETFHeaders != 0 {
		n += 2
	}
	if retry {
		n++
	}
	if n == 0 {
		return
	}
	sp := speaker(ls)
	var (
		policy, state, rem string
		vals               []string
	)
	if set&IETFHeaders != 0 {
		// RateLimit first: X-RateLimit-Remaining can share its digits.
		var sbuf [256]byte
		var b []byte
		var remStart, remEnd int
		if l.cfg.partitionKey {
			policy, b, remStart, remEnd = ietfValuesPK(rs, ls, sp, sbuf[:0])
		} else {
			policy, b, remStart, remEnd = ietfValues(rs, ls, sp, sbuf[:0], nil)
		}
		vals, state = headerValues(n, b)
		rem = state[remStart:remEnd]
	} else if d := ls[sp].Decision.Remaining; n == 3 && sharedDigits(d) {
		// The values and X-RateLimit-Remaining's digits in one block.
		vals, rem = xHeaderValues(d)
	} else {
		// One backing array for every value of this response.
		vals = make([]string, n)
	}
	i := 0
	put := func(name, v string) {
		vals[i] = v
		h[name] = vals[i : i+1 : i+1]
		i++
	}
	if set&XRateLimitHeaders != 0 {
		s := &ls[sp]
		d := &s.Decision
		if own(rs, s) {
			put(canonLimit, rs.rules[s.index].xLimit)
		} else {
			put(canonLimit, itoa(d.Limit))
		}
		if rem == "" || !sharedDigits(d.Remaining) {
			rem = itoa(d.Remaining)
		}
		put(canonRemaining, rem)
		if l.cfg.resetDelta {
			put(canonReset, itoa(ceilSeconds(d.ResetAfter)))
		} else {
			at := res.at
			if at == 0 {
				at = l.clock.Now().UnixNano()
			}
			put(canonReset, l.epochString(at+int64(d.ResetAfter)))
		}
	}
	if set&IETFHeaders != 0 && policy != "" { // no item: every layer of a hand-built Result lacks its policy
		put(canonPolicy, policy)
		put(canonRateLimit, state)
	}
	if retry {
		put(canonRetry, itoa(max(ceilSeconds(retryAfter(res, ls)), 1)))
	}
}

// own reports whether lr was decided under its layer's own policy in rs (not
// one a Resolver picked), so that the layer's precomputed strings apply.
func own(rs *ruleSet, lr *LayerResult) bool {
	return lr.index < len(rs.rules) && lr.Decision.Policy == rs.rules[lr.index].policy
}

// headerBlock and headerBlockLarge are the one allocation behind the
// header values of a response with both header sets that needs no
// Retry-After: the five values and the bytes of the RateLimit value (one or
// two layers, and up to five with short names), which is a string over b.
type (
	headerBlock struct {
		vals [5]string
		b    [32]byte
	}
	headerBlockLarge struct {
		vals [5]string
		b    [80]byte
	}
)

// headerValues returns the backing array of n header values and the
// RateLimit value state, in one allocation when they fit a header block.
// The string shares the block's bytes, as strings.Builder does: they are
// never written again, so it is immutable.
func headerValues(n int, state []byte) ([]string, string) {
	switch {
	case n != 5 || len(state) == 0 || len(state) > len(headerBlockLarge{}.b):
		return make([]string, n), string(state)
	case len(state) <= len(headerBlock{}.b):
		blk := new(headerBlock)
		m := copy(blk.b[:], state)
		return blk.vals[:], unsafe.String(&blk.b[0], m)
	default:
		blk := new(headerBlockLarge)
		m := copy(blk.b[:], state)
		return blk.vals[:], unsafe.String(&blk.b[0], m)
	}
}

// xHeaderBlock is the one allocation behind the header values of a
// response with the X-RateLimit set alone, no Retry-After and a Remaining
// that needs formatting: the three values and Remaining's digits.
type xHeaderBlock struct {
	vals [3]string
	b    [16]byte
}

// xHeaderValues returns the backing array of the three X-RateLimit values
// and rem, the decimal digits of remaining (at most 15), in one
// allocation. As in headerValues, the string shares the block's bytes,
// which are never written again.
func xHeaderValues(remaining int64) ([]string, string) {
	blk := new(xHeaderBlock)
	d := strconv.AppendInt(blk.b[:0], remaining, 10) // a longer number would move to a new array, still right
	return blk.vals[:], unsafe.String(unsafe.SliceData(d), len(d))
}

// ietfValuesPK is ietfValues with the partition key of every layer. A
// Limiter's Result has at most core.MaxBatch layers, whose keys fit on the
// stack; a Result built by hand may have more.
func ietfValuesPK(rs *ruleSet, ls []LayerResult, speaker int, b []byte) (policy string, state []byte, remStart, remEnd int) {
	var arr [core.MaxBatch][pkLen]byte
	pks := arr[:]
	if len(ls) > len(arr) {
		pks = make([][pkLen]byte, len(ls))
	}
	for j := range ls {
		sum := sha256.Sum256([]byte(ls[j].Key))
		copy(pks[j][:], sum[:pkLen])
	}
	return ietfValues(rs, ls, speaker, b, pks[:len(ls)])
}

// ietfValues returns the RateLimit-Policy value for the applied layers ls,
// and appends their RateLimit value to b: state[remStart:remEnd] are the
// digits of the remaining units of layer ls[speaker] (they equal
// X-RateLimit-Remaining, so that header needs no string of its own). pks
// holds each layer's partition key, or is nil for none. A layer without its
// Decision.Policy (in a Result built by hand) has no item in either: policy
// is "" when no layer has one.
func ietfValues(rs *ruleSet, ls []LayerResult, speaker int, b []byte, pks [][pkLen]byte) (policy string, state []byte, remStart, remEnd int) {
	if len(ls) == 1 && pks == nil && own(rs, &ls[0]) {
		// The common Result: one layer, under its own policy.
		b, remStart, remEnd = appendOwnState(b, rs, &ls[0])
		return rs.rules[ls[0].index].policyItem, b, remStart, remEnd
	}
	pk := func(j int) []byte {
		if pks == nil {
			return nil
		}
		return pks[j][:]
	}

	// RateLimit-Policy: precomputed unless a Resolver changed a policy or
	// partition keys vary per request.
	static := pks == nil
	var mask uint32
	for j := range ls {
		mask |= 1 << ls[j].index
		if !own(rs, &ls[j]) {
			static = false
		}
	}
	switch {
	case static && int(mask) < len(rs.policyBySet):
		policy = rs.policyBySet[mask]
	case static && mask == rs.allMask:
		policy = rs.policyBySet[0]
	case static && len(ls) == 1:
		policy = rs.rules[ls[0].index].policyItem
	default:
		var buf [256]byte
		pb := buf[:0]
		for j := range ls {
			if ls[j].Decision.Policy == nil {
				continue // a layer of a Result built by hand, without its policy: no item
			}
			if len(pb) > 0 {
				pb = append(pb, ", "...)
			}
			pb = appendPolicyItem(pb, ls[j].Decision.Policy, pk(j))
		}
		policy = string(pb)
	}

	first := len(b)
	for j := range ls {
		d := &ls[j].Decision
		if d.Policy == nil {
			continue // as above
		}
		if len(b) > first {
			b = append(b, ", "...)
		}
		if pks == nil && own(rs, &ls[j]) {
			var from, to int
			if b, from, to = appendOwnState(b, rs, &ls[j]); j == speaker {
				remStart, remEnd = from, to
			}
			continue
		}
		start := len(b)
		b = appendItem(b, d.Policy.Name(), ietfRemaining, d.Remaining, ietfReset, ceilSeconds(stateReset(&ls[j])), pk(j))
		if j == speaker {
			// The item is `"name";r=<digits>;...`.
			remStart = start + len(d.Policy.Name()) + 3 + len(ietfRemaining) + 1
			remEnd = remStart
			for remEnd < len(b) && b[remEnd] >= '0' && b[remEnd] <= '9' {
				remEnd++
			}
		}
	}
	return policy, b, remStart, remEnd
}

// stateReset is the t of lr's RateLimit member (see [IETFHeaders]).
func stateReset(lr *LayerResult) time.Duration {
	d := &lr.Decision
	if lr.Refused && d.RetryAfter > 0 {
		return d.RetryAfter
	}
	return d.ResetAfter
}

// appendOwnState appends the RateLimit member of lr, a layer decided under
// its own policy in rs, whose prefix is precomputed, and returns where the
// digits of its remaining units start and end in b.
func appendOwnState(b []byte, rs *ruleSet, lr *LayerResult) (_ []byte, remStart, remEnd int) {
	b = append(b, rs.rules[lr.index].stateItem...)
	remStart = len(b)
	b = strconv.AppendInt(b, clampSF(lr.Decision.Remaining), 10)
	remEnd = len(b)
	b = append(b, ';')
	b = append(b, ietfReset...)
	b = append(b, '=')
	b = strconv.AppendInt(b, clampSF(ceilSeconds(stateReset(lr))), 10)
	return b, remStart, remEnd
}

// stateItem returns the start of the RateLimit member of the policy named
// name, up to its remaining units: `"name";r=`.
func stateItem(name string) string {
	return `"` + name + `";` + ietfRemaining + "="
}

// appendPolicyItem appends the RateLimit-Policy member of p.
func appendPolicyItem(b []byte, p *core.Policy, pk []byte) []byte {
	if isInFlight(p) {
		return appendInFlightItem(b, p, pk)
	}
	return appendItem(b, p.Name(), ietfQuota, p.Limit(), ietfWindow, max(ceilSeconds(p.Window()), 1), pk)
}

// appendItem is the IETF serialiser: it appends one Structured Field List
// member, a quoted name with two Integer parameters and an optional Byte
// Sequence pk:
//
//	"name";k1=v1;k2=v2;pk=:base64:
//
// Names are core rule names (printable ASCII without '"' or '\'), so they
// need no escaping. Integers are clamped to [0, 999999999999999].
func appendItem(b []byte, name, k1 string, v1 int64, k2 string, v2 int64, pk []byte) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ';')
	b = append(b, k1...)
	b = append(b, '=')
	b = strconv.AppendInt(b, clampSF(v1), 10)
	b = append(b, ';')
	b = append(b, k2...)
	b = append(b, '=')
	b = strconv.AppendInt(b, clampSF(v2), 10)
	if pk != nil {
		b = append(b, ';')
		b = append(b, ietfPartition...)
		b = append(b, '=', ':')
		b = base64.StdEncoding.AppendEncode(b, pk)
		b = append(b, ':')
	}
	return b
}

func clampSF(v int64) int64 { return min(max(v, 0), maxSFInteger) }

// maskLayers is the most layers for which RateLimit-Policy is precomputed
// for every subset of applied layers.
const maskLayers = 6

// buildPolicySets precomputes RateLimit-Policy for every subset of layers
// (indexed by bitmask) when there are at most maskLayers; otherwise only for
// all layers, stored at index 0.
func buildPolicySets(ls []layerRule) []string {
	join := func(mask uint32) string {
		var parts []string
		for i := range ls {
			if mask&(1<<i) != 0 {
				parts = append(parts, ls[i].policyItem)
			}
		}
		return strings.Join(parts, ", ")
	}
	if len(ls) > maskLayers {
		return []string{join(1<<len(ls) - 1)}
	}
	sets := make([]string, 1<<len(ls))
	for m := range sets {
		sets[m] = join(uint32(m))
	}
	return sets
}

// speaker returns the index in ls of the most restrictive layer: when any
// refused, the refusing layer with the longest RetryAfter; otherwise the
// one with the least Remaining, ties broken by the longer ResetAfter. The
// first such layer wins a full tie.
func speaker(ls []LayerResult) int {
	best, refused := 0, ls[0].Refused
	for i := 1; i < len(ls); i++ {
		d, b := &ls[i].Decision, &ls[best].Decision
		switch {
		case ls[i].Refused:
			if !refused || d.RetryAfter > b.RetryAfter {
				best, refused = i, true
			}
		case refused:
		case d.Remaining < b.Remaining || (d.Remaining == b.Remaining && d.ResetAfter > b.ResetAfter):
			best = i
		}
	}
	return best
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}

// epochString is a cached decimal Unix second.
type epochString struct {
	sec int64
	s   string
}

// epochString returns the Unix second of the Unix nanosecond ns, rounded up,
// in decimal, from a small cache indexed by second.
func (l *Limiter) epochString(ns int64) string {
	sec := ns / 1e9
	if ns%1e9 > 0 {
		sec++
	}
	slot := &l.epochs[uint64(sec)%uint64(len(l.epochs))]
	if e := slot.Load(); e != nil && e.sec == sec {
		return e.s
	}
	e := &epochString{sec: sec, s: strconv.FormatInt(sec, 10)}
	slot.Store(e)
	return e.s
}

// smallInts caches the decimal strings of 0..maxSmallInt, all slices of one
// string.
const maxSmallInt = 4096

var smallInts = func() [maxSmallInt + 1]string {
	var all []byte
	var ends [maxSmallInt + 2]int
	for i := 0; i <= maxSmallInt; i++ {
		all = strconv.AppendInt(all, int64(i), 10)
		ends[i+1] = len(all)
	}
	s := string(all)
	var out [maxSmallInt + 1]string
	for i := range out {
		out[i] = s[ends[i]:ends[i+1]]
	}
	return out
}()

// itoa formats n in decimal without allocating for 0..maxSmallInt.
func itoa(n int64) string {
	if n >= 0 && n <= maxSmallInt {
		return smallInts[n]
	}
	return strconv.FormatInt(n, 10)
}

// Problem details (RFC 9457).

// ProblemTypeQuotaExceeded is the problem type of a request over its quota,
// as proposed by the IETF RateLimit draft (see [WithProblemDetails]).
const ProblemTypeQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

func refusingNames(res *Result) []string {
	var names []string
	for i := range res.Layers {
		if res.Layers[i].Refused && res.Layers[i].Decision.Policy != nil {
			names = append(names, res.Layers[i].Decision.Policy.Name())
		}
	}
	return names
}

func problemQuotaExceeded(res *Result) problem {
	secs := max(ceilSeconds(res.RetryAfter()), 1)
	unit := "seconds"
	if secs == 1 {
		unit = "second"
	}
	detail := fmt.Sprintf("Quota exceeded; retry after %d %s.", secs, unit)
	if res.kind == outcomeQueueFull {
		detail = fmt.Sprintf("Too many requests are waiting; retry after %d %s.", secs, unit)
	}
	return problem{
		Type:             ProblemTypeQuotaExceeded,
		Title:            "Too Many Requests",
		Status:           http.StatusTooManyRequests,
		Detail:           detail,
		ViolatedPolicies: refusingNames(res),
	}
}

// problemStoreFull is the problem of a request refused because a full
// store (core.MemoryConfig.KeepActive) holds no room for its key.
func problemStoreFull(res *Result) problem {
	secs := max(ceilSeconds(res.RetryAfter()), 1)
	unit := "seconds"
	if secs == 1 {
		unit = "second"
	}
	return problem{
		Type:   "about:blank",
		Title:  "Too Many Requests",
		Status: http.StatusTooManyRequests,
		Detail: fmt.Sprintf("The rate limiter holds too many active clients; retry after %d %s.", secs, unit),
	}
}

func problemTooCostly(res *Result) problem {
	detail := "The request's cost exceeds the capacity of a rate limit; it can never be admitted."
	for i := range res.Layers {
		ly := &res.Layers[i]
		if ly.Refused && ly.Decision.RetryAfter == 0 && ly.Decision.Policy != nil && ly.Cost > ly.Decision.Policy.Capacity() {
			detail = fmt.Sprintf("The request's cost (%d) exceeds the capacity (%d) of policy %q; it can never be admitted.",
				ly.Cost, ly.Decision.Policy.Capacity(), ly.Decision.Policy.Name())
			break
		}
	}
	return problem{
		Type:   "about:blank",
		Title:  "Content Too Large",
		Status: http.StatusRequestEntityTooLarge,
		Detail: detail,
	}
}

func writeProblem(w http.ResponseWriter, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: strings and ints only
		writeText(w, p.Status, http.StatusText(p.Status)+"\n")
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	h["Cache-Control"] = []string{"no-store"} // RFC 6585: a 429 must not be stored
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}
