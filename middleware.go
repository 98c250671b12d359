package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/limitry/ratelimit/core"
)

var (
	// ErrStoreFailure is wrapped by the error the error handler receives when
	// the store fails to decide a request (or a layer's Resolver fails). The
	// fail policy then applies (see [WithFailClosed]).
	ErrStoreFailure = errors.New("ratelimit: store failure")

	// ErrTooManyWaiting is the Result.Err of a shaped request refused
	// because [WithMaxWaiting] requests were already waiting.
	ErrTooManyWaiting = errors.New("ratelimit: too many requests waiting for a shaping delay")

	// ErrConfig is wrapped by the error the error handler receives when a
	// request meets a configuration error that only shows at request time:
	// a [Route] layer that finds no route pattern ([ErrNoRoute]), a key
	// function whose error wraps ErrConfig (such as a framework adapter's
	// key function on a Limiter mounted without that framework's
	// middleware), a Resolver that returns a policy named as another layer,
	// as a policy another layer's Resolver lists, or as the policy another
	// layer decides the same request under (it would share that layer's
	// state), a policy a Resolver picks without listing it that the store
	// cannot decide (core.ErrUnsupportedPolicy; a [Transport] fails such a
	// request with an error wrapping ErrConfig too), or a memory store too
	// small to hold one request's keys (core.ErrStoreFull with no retry
	// time). Such a request is answered 500 Internal Server Error unless
	// the error handler writes a response, whatever the fail policy: it is
	// never served unlimited. It is logged once.
	ErrConfig = errors.New("ratelimit: configuration error")

	// ErrMissingKey is wrapped by the error the error handler receives when
	// a layer with IfNoKey set to [NoKeyRefuse] finds no key (its KeyFunc
	// returned [ErrNoKey]). Unless the error handler writes a response, the
	// request is answered 401 Unauthorized. Nothing is charged.
	ErrMissingKey = errors.New("ratelimit: required key is missing")
)

// NoKey says what a layer does with a request its Key does not apply to
// (the KeyFunc returned an error wrapping [ErrNoKey]). To fall back to
// another key instead, give the layer a [FirstOf] key function.
type NoKey uint8

const (
	// NoKeySkip skips the layer for that request; the other layers still
	// decide it. It is the default, for optional layers such as a per-user
	// layer beside a per-IP one. A layer whose key is absent on every one
	// of the first [AbsentKeyLogAfter] requests it sees is logged once.
	NoKeySkip NoKey = iota

	// NoKeyRefuse refuses the request: the error handler receives an error
	// wrapping [ErrMissingKey] and, unless it writes a response, the request
	// is answered 401 Unauthorized (write 400 from the error handler if
	// that suits the API better). The 401 carries no WWW-Authenticate: RFC
	// 9110 requires one with a challenge of the application's
	// authentication scheme, which the Limiter cannot know, so set it from
	// the error handler. Nothing is charged. Use it for a layer
	// that must apply to every request, such as an API-key layer that is
	// the only limit.
	NoKeyRefuse
)

// AbsentKeyLogAfter is the number of requests after which a layer whose key
// was absent on every one of them (see [NoKeySkip]) is logged once.
const AbsentKeyLogAfter = 100

// UnmatchedRoutesLogAfter is the number of routed requests after which a
// layer whose Routes matched none of them is logged once (see
// [Layer.Routes]): a Routes entry written otherwise than the route keys are
// ("POST /login" for a route registered for every method, "{id}" for a
// router that writes ":id") would make the layer limit nothing. A layer
// for a route that is rarely requested may be logged too.
const UnmatchedRoutesLogAfter = 10_000

// Layer is one limit of a [Limiter]: requests are keyed by Key and decided
// under Rule. All layers of a Limiter are decided and charged together,
// atomically: a request refused by any layer charges no layer.
type Layer struct {
	// Key derives the key the request is charged to, such as ClientIP() or
	// User(). A Key returning an error wrapping ErrNoKey does what
	// IfNoKey says (skip the layer by default); any other error is a key
	// error (see [WithErrorHandler]). Required.
	Key KeyFunc

	// Rule is the quota. Its Name (core.DefaultName when empty) names the
	// layer in headers, problem details and metrics, and namespaces its keys
	// in the store: names must be unique within a Limiter, and two Limiters
	// sharing a store share the state of equally named layers.
	Rule core.Rule

	// Cost returns the cost of a request under this layer. The default
	// value is the Limiter's cost (see [WithCost]), 1 unless set.
	Cost func(r *http.Request) int64

	// Resolver, if set, picks the policy per key (tiers such as free and
	// pro, see core.Tiers); a nil policy means Rule. Resolved policies speak
	// in the headers under their own names and are namespaced in the store
	// by them, so give tier rules names distinct from other layers'.
	// A Resolver error is handled like a store failure. If the Resolver
	// implements core.PolicyLister (core.Tiers' does), New refuses policy
	// names that clash with another layer's; a policy it returns unlisted
	// under another layer's name is a configuration error at request time
	// (see [ErrConfig]).
	Resolver core.Resolver

	// IfNoKey says what a request Key does not apply to means: skip the
	// layer (the default, [NoKeySkip]) or refuse the request
	// ([NoKeyRefuse]).
	IfNoKey NoKey

	// Routes, if set, limits the layer to requests whose route (the key
	// [Route] gives them, such as "POST /login" or "GET /users/{id}") is
	// one of Routes; the layer does not apply to other requests (nor to
	// requests no route matches), which is not an absent key. This lets one
	// Limiter mounted before routing hold per-IP, per-user and per-route
	// limits in one atomic batch. The route is found as [Route] finds it:
	// through [WithServeMux], a framework adapter, or r.Pattern. A request
	// for which no routing information exists at all is a configuration
	// error (see [ErrConfig]). Write each entry as the adapter keys the
	// route; a layer whose Routes match none of its first
	// [UnmatchedRoutesLogAfter] routed requests is logged once.
	Routes []string

	// InFlight, if positive, makes the layer a concurrency limit: at most
	// InFlight requests per key in flight at once, instead of a rate (see
	// inflight.go and [Limiter.AdmitFunc]). Rule then gives only the
	// layer's Name; Cost and Resolver must be unset. A slot is given back
	// when the handler the Limiter wraps returns: put a handler that returns
	// before its work ends, such as http.TimeoutHandler, outside the
	// Limiter, or the work it leaves running holds no slot.
	InFlight int64
}

// Result is the outcome of deciding one request: what [Limiter.Decide]
// returns and what a denied handler receives.
type Result struct {
	// Proceed reports whether the request may be served, after waiting
	// Delay. It is true for admitted, skipped and dry-run requests and for
	// store failures under the default fail-open policy; it is false for a
	// full store, a configuration error and a request that ended before it
	// was decided, whatever the fail policy.
	Proceed bool

	// Skipped reports that the request matched [WithSkip] or an allowlist
	// ([WithSkipCIDRs]): nothing was decided or charged, and no headers are
	// written.
	Skipped bool

	// DryRun reports that the Limiter is in dry-run mode: Proceed is true
	// even when a layer refused.
	DryRun bool

	// Layers holds the decision of every applied layer, in the order the
	// layers were given to New. Layers whose key did not apply (ErrNoKey)
	// are omitted, so Layers is empty when no layer applied. It is empty
	// too after a key error or a store failure, when nothing was decided.
	Layers []LayerResult

	// Delay is how long to hold an admitted request before serving it: the
	// longest Decision.Delay of the applied layers (non-zero only for
	// shaping LeakyBucket layers). See [Limiter.Wait].
	Delay time.Duration

	// Err is nil for an admitted or refused request. Otherwise it is the
	// reason the request could not be decided or served normally: a key
	// error (wrapping the KeyFunc's error), an invalid cost (wrapping
	// core.ErrInvalidCost), a store or Resolver failure (wrapping
	// ErrStoreFailure), a cost above a layer's capacity (wrapping
	// core.ErrCostExceedsCapacity; that layer has Refused set),
	// ErrTooManyWaiting, a full store (wrapping core.ErrStoreFull: refused
	// with 429), a configuration error (wrapping [ErrConfig]), a missing
	// required key (wrapping [ErrMissingKey]), or the request context's
	// error when it ended during a shaping delay or before the store
	// answered.
	Err error

	kind     outcome
	at       int64  // Unix ns of the decision, 0 before one was made
	reserved bool   // holds a waiting-room slot that wait releases
	held     func() // gives back the in-flight slots the request holds
	// slotsFailed reports that the slot store failed: under fail-open,
	// the request was decided by its rate layers alone, and slotErr is that
	// failure, for the error handler; with no rate layer applied (or under
	// fail-closed), Err is that failure and slotErr nil.
	slotsFailed bool
	slotErr     error
	storeErr    error // the store's failure behind a too costly request's refusal, for the error handler
	// slotLatency is the time the slot store took, for the slot layers'
	// decision events, reported once the rate layers have decided.
	slotLatency time.Duration
	rs          *ruleSet // the rules the request was decided under
	peeked      bool     // a Peek's Result: nothing was charged
	// claim, shared by the copies of a Result that may be copied (from
	// Decide, or in a request's context), is 1 once its charge was
	// refunded, so that it is refunded once whichever copy asks; nil for
	// a Result the caller cannot copy.
	claim *uint32
}

// LayerResult is the decision of one applied layer.
type LayerResult struct {
	// Key is the key the layer charged (or would have charged).
	Key string

	// Cost is the cost asked of the layer.
	Cost int64

	// Decision is the layer's decision. Decision.Policy.Name() names the
	// layer. When another layer refused, an Allowed decision reports
	// Remaining without this request's cost: nothing was charged.
	Decision core.Decision

	// Refused reports that this layer refused the request: its quota is
	// exhausted (Decision.Allowed is false), or the cost exceeds its
	// capacity, or it is a shaping layer whose delayed request found the
	// waiting room full.
	Refused bool

	index int // position of the layer in Limiter.layers
	// resets is the Limiter's count of resets of the layer's key (see
	// resetLog) read before the layer was charged.
	resets uint64
	// claim is the storage of Result.claim for a Result of Decide, in the
	// element after the last of its Layers' array, which no copy's Layers
	// reaches (so reading them never races with a refund).
	claim uint32
}

// outcome classifies a Result for the default responses.
type outcome uint8

const (
	outcomeOK         outcome = iota // admitted, skipped or nothing applied
	outcomeRefused                   // a layer refused: 429
	outcomeTooCostly                 // cost above capacity: 413
	outcomeQueueFull                 // waiting room full: 429
	outcomeBadRequest                // key error, invalid cost: 400
	outcomeStore                     // store or resolver failure: fail policy, 503 when closed
	outcomeCancelled                 // context ended while waiting: 503
	outcomeStoreFull                 // a KeepActive store refused a new key: 429
	outcomeConfig                    // configuration error met at request time: 500
	outcomeMissingKey                // a required key is missing: 401
	outcomeGone                      // the request ended before it was decided: nothing written
)

// outcomeOf returns the outcome of res, whose applied layers are layers:
// the kind its Limiter set or, for a Result built by hand from its
// exported fields (kind unset) that does not proceed, the outcome those
// fields describe (see handOutcome). A Result the Limiter built costs one
// more comparison.
func outcomeOf(res *Result, layers []LayerResult) outcome {
	if res.kind != outcomeOK || res.Proceed {
		return res.kind
	}
	return handOutcome(res, layers)
}

// handOutcome is the outcome of a Result built by hand that does not
// proceed: too costly when its Err wraps core.ErrCostExceedsCapacity,
// refused when it has no Err and some layer Refused, and outcomeOK (the
// default denied response, without a retry time) otherwise.
func handOutcome(res *Result, layers []LayerResult) outcome {
	if res.Err != nil {
		if errors.Is(res.Err, core.ErrCostExceedsCapacity) {
			return outcomeTooCostly
		}
		return outcomeOK
	}
	for i := range layers {
		if layers[i].Refused {
			return outcomeRefused
		}
	}
	return outcomeOK
}

// RetryAfter returns how long a refused client should wait before retrying:
// the longest RetryAfter among the refusing layers (for ErrTooManyWaiting,
// the shaping delay, or the longest MaxDelay of the shaping layers when the
// request was refused before being decided; for a full store, the refusing
// decision's RetryAfter and at least one second), never early. It is 0 when the request proceeds, when
// the refusal promises no retry time (a cost above capacity), and for errors.
func (res *Result) RetryAfter() time.Duration { return retryAfter(res, res.Layers) }

// retryAfter is Result.RetryAfter with the layers passed apart (see
// Limiter.Admit).
func retryAfter(res *Result, layers []LayerResult) time.Duration {
	if res.Proceed {
		return 0
	}
	switch outcomeOf(res, layers) {
	case outcomeRefused:
		var ra time.Duration
		for i := range layers {
			if layers[i].Refused {
				ra = max(ra, layers[i].Decision.RetryAfter)
			}
		}
		return ra
	case outcomeQueueFull:
		return res.Delay
	case outcomeStoreFull:
		return max(res.Delay, time.Second)
	}
	return 0
}

// export returns a heap copy of res with a copy of layers, for handing to
// user code (which may keep it) while res and layers live on the stack.
func export(res *Result, layers []LayerResult) *Result {
	return &Result{
		Proceed:  res.Proceed,
		Skipped:  res.Skipped,
		DryRun:   res.DryRun,
		Layers:   append([]LayerResult(nil), layers...),
		Delay:    res.Delay,
		Err:      res.Err,
		kind:     res.kind,
		at:       res.at,
		rs:       res.rs,
		storeErr: res.storeErr,
	}
}

// Limiter is the HTTP rate limiter: one or more layers decided together for
// every request, with the response policy set by options. Build it once with
// [New] and wrap handlers with [Limiter.Handler]; it is safe for concurrent
// use.
//
// Besides Handler it exposes the steps Handler is made of, for framework
// adapters and custom flows: [Limiter.Admit] does everything except calling
// the next handler; [Limiter.Decide], [Limiter.WriteHeaders],
// [Limiter.Refuse] and [Limiter.Wait] are its parts.
//
// The zero value is not usable: build one with New.
type Limiter struct {
	cl     *core.Limiter
	clock  core.Clock
	slots  core.SlotStore // nil: no concurrency layer
	layers []layer
	cfg    config
	// owners maps every layer's name, and every policy a layer's Resolver
	// lists, to that layer's index: a policy a Resolver returns must not
	// be named as another layer's.
	owners map[string]int

	// rules holds the layers' rules and the header strings derived from
	// them; SetRules replaces it whole, so a request sees one set.
	rules atomic.Pointer[ruleSet]
	// resets counts the resets of each layer's keys (see resetLog); nil
	// until the first Reset.
	resets atomic.Pointer[resetLog]
	// reloadMu serialises SetRules calls.
	reloadMu sync.Mutex

	waiting atomic.Int64
	// waitEnd is the latest Unix nanosecond by which a request that took
	// a waiting-room slot has been served: through Admit, its decision's
	// time plus the longest MaxDelay its rules could give it, under
	// whatever rules it was decided (SetRules may have lowered MaxDelay
	// since); through Wait, when its delay ends.
	waitEnd atomic.Int64
	sleep   func(ctx context.Context, d time.Duration) error // replaced in tests

	epochs [64]atomic.Pointer[epochString]

	routed        bool          // a layer has Routes
	useCtx        bool          // a decision needs the request's context (see decideLayers)
	resolvers     bool          // a layer has a Resolver
	resolverDelay time.Duration // the longest MaxDelay of the policies Resolvers list
	logs          logState
}

// layer is a validated Layer, apart from its rule (see ruleSet).
type layer struct {
	key      KeyFunc
	cost     func(*http.Request) int64
	resolver core.Resolver
	ifNoKey  NoKey
	routes   []string // nil: every request
	desc     string   // the layer in the user's words: `"login"` or `0 (unnamed)`
	name     string   // the layer's policy Name, which SetRules keeps
	inFlight int64    // > 0: a concurrency layer (see Layer.InFlight)
	// listed holds the policies the layer's Resolver lists
	// (core.PolicyLister), which SetRules never replaces.
	listed []*core.Policy
}

// ruleSet is the rule of every layer with its precomputed header strings:
// what a reload changes. It is immutable once published.
type ruleSet struct {
	rules []layerRule // by layer index
	// policyBySet[mask] is the RateLimit-Policy value when exactly the
	// layers in mask applied (for up to maskLayers layers).
	policyBySet []string
	allMask     uint32
	maxDelay    time.Duration // the longest MaxDelay of the shaping policies
	// scopeDigest is the digest of the rules an Idempotency filter's
	// scope names (ruleDigest), computed on first use.
	scopeDigest atomic.Pointer[string]
}

// layerRule is one layer's validated rule and its header strings.
type layerRule struct {
	policy *core.Policy
	// gen counts the times SetRules gave the layer a policy of another
	// Identity, so that a refund can tell whether the key's state has been
	// carried over since its charge (even back to the charge's own rule).
	gen        uint64
	xLimit     string // X-RateLimit-Limit value
	policyItem string // RateLimit-Policy member, without pk
	stateItem  string // RateLimit member up to its remaining units, without pk
}

// newRuleSet returns the ruleSet of policies, one per layer.
func newRuleSet(policies []*core.Policy, resolverDelay time.Duration) *ruleSet {
	rs := &ruleSet{rules: make([]layerRule, len(policies)), maxDelay: resolverDelay}
	for i, p := range policies {
		rs.rules[i] = layerRule{
			policy:     p,
			xLimit:     itoa(p.Capacity()),
			policyItem: string(appendPolicyItem(nil, p, nil)),
			stateItem:  stateItem(p.Name()),
		}
		rs.maxDelay = max(rs.maxDelay, p.MaxDelay())
	}
	rs.allMask = uint32(1)<<len(policies) - 1
	rs.policyBySet = buildPolicySets(rs.rules)
	return rs
}

// allowList is one WithSkipCIDRs or WithSkipCIDRsFrom option.
type allowList struct {
	ip       KeyFunc // nil: r.RemoteAddr
	prefixes []netip.Prefix
}

// New returns a Limiter deciding every request under layers, configured by
// opts. It reports every configuration problem now, never at request time:
// no layers, more than core.MaxBatch layers, a layer without Key, an invalid
// Rule (the error wraps core.ErrInvalidRule), two layers with the same name
// (including the policies a layer's Resolver lists, see core.PolicyLister),
// a policy the store cannot decide (core.PolicyChecker: a custom algorithm
// on a Redis store, say; the error wraps core.ErrUnsupportedPolicy), or an
// invalid option. A policy a Resolver returns without listing it is met
// only at request time: if the store cannot decide it, the request is
// answered as a configuration error (500, see [ErrConfig]), never served
// fail-open. Errors start with one "ratelimit: " and name the
// layer as it was given: by its Rule.Name, or by its index when unnamed.
//
// Unless [WithStore] is given, the Limiter keeps its state in a new
// core.MemoryStore of its own.
func New(layers []Layer, opts ...Option) (*Limiter, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("ratelimit: nil Option")
		}
		o(&cfg)
	}
	if len(cfg.errs) > 0 {
		return nil, cfg.errs[0]
	}
	if len(layers) == 0 {
		return nil, errors.New("ratelimit: no layers")
	}
	if len(layers) > core.MaxBatch {
		return nil, fmt.Errorf("ratelimit: %d layers, at most %d (core.MaxBatch)", len(layers), core.MaxBatch)
	}
	l := &Limiter{cfg: cfg, layers: make([]layer, len(layers)), sleep: waitTimer}
	l.waitEnd.Store(math.MinInt64) // no request has waited
	l.logs.keys = make([]keyStat, len(layers))
	policies := make([]*core.Policy, len(layers))
	type owner struct {
		layer    int
		named    bool
		resolver bool // the name is a policy the layer's Resolver lists
	}
	names := make(map[string]owner, len(layers))
	var listed []*core.Policy // the policies Resolvers list, for the store's check
	claim := func(i int, named bool, p *core.Policy, resolver bool) error {
		o, dup := names[p.Name()]
		if !dup {
			names[p.Name()] = owner{i, named, resolver}
			return nil
		}
		if o.layer == i {
			return nil // one layer decides one of its policies per request
		}
		if !o.named && !named {
			return fmt.Errorf("ratelimit: layers %d and %d are both unnamed (both named %q by default): name them with Rule.Named", o.layer, i, p.Name())
		}
		side := func(layer int, resolver bool) string {
			d := "layer " + layerDesc(layer, layers[layer].Rule.Name)
			if resolver {
				d += " (a policy its Resolver can return)"
			}
			return d
		}
		return fmt.Errorf("ratelimit: %s and %s are both named %q: layer and policy names must be unique within a Limiter", side(o.layer, o.resolver), side(i, resolver), p.Name())
	}
	for i, ly := range layers {
		desc := layerDesc(i, ly.Rule.Name)
		if ly.Key == nil {
			return nil, fmt.Errorf("ratelimit: layer %s has no Key", desc)
		}
		if ly.IfNoKey > NoKeyRefuse {
			return nil, fmt.Errorf("ratelimit: layer %s: unknown IfNoKey value %d", desc, ly.IfNoKey)
		}
		p, err := layerPolicy(&ly)
		if err != nil {
			return nil, prefixed("layer "+desc, err)
		}
		if err := claim(i, ly.Rule.Name != "", p, false); err != nil {
			return nil, err
		}
		var own []*core.Policy
		if pl, ok := ly.Resolver.(core.PolicyLister); ok {
			for _, rp := range pl.Policies() {
				if rp == nil {
					continue
				}
				if err := claim(i, true, rp, true); err != nil {
					return nil, err
				}
				l.resolverDelay = max(l.resolverDelay, rp.MaxDelay())
				listed = append(listed, rp)
				own = append(own, rp)
			}
		}
		var routes []string
		for _, rt := range ly.Routes {
			rt = normalizePattern(strings.TrimSpace(rt))
			if rt == "" {
				return nil, fmt.Errorf("ratelimit: layer %s: empty route in Routes", desc)
			}
			routes = append(routes, rt)
		}
		if len(ly.Routes) > 0 {
			l.routed = true
		}
		policies[i] = p
		l.layers[i] = layer{
			key:      ly.Key,
			cost:     ly.Cost,
			resolver: ly.Resolver,
			ifNoKey:  ly.IfNoKey,
			routes:   routes,
			desc:     desc,
			name:     p.Name(),
			inFlight: ly.InFlight,
			listed:   own,
		}
	}
	l.owners = make(map[string]int, len(names))
	for name, o := range names {
		l.owners[name] = o.layer
	}
	l.slots = slotStore(layers, cfg.slots)
	if st, ok := l.slots.(*core.SlotTable); ok {
		n := 0
		for i := range layers {
			if layers[i].InFlight > 0 {
				n++
			}
		}
		if st.Capacity() < n {
			// Every request would be refused with a Retry-After never kept.
			return nil, fmt.Errorf("ratelimit: WithSlotStore: the SlotTable holds at most %d keys, fewer than one request's %d concurrency layers", st.Capacity(), n)
		}
	}
	l.rules.Store(newRuleSet(policies, l.resolverDelay))

	var coreOpts []core.Option
	if cfg.dryRun {
		coreOpts = append(coreOpts, core.WithDryRun())
	}
	store := cfg.store
	if store == nil {
		m, err := core.NewMemoryStore(&core.MemoryConfig{Observer: cfg.observer})
		if err != nil {
			return nil, prefixed("", err)
		}
		store = m
	}
	if err := l.checkPolicies(store, policies, listed); err != nil {
		return nil, err
	}
	if err := checkRefund(&cfg, store); err != nil {
		return nil, err
	}
	coreOpts = append(coreOpts, core.WithStore(store))
	if cfg.clock != nil {
		coreOpts = append(coreOpts, core.WithClock(cfg.clock))
	}
	if cfg.observer != nil {
		coreOpts = append(coreOpts, core.WithObserver(cfg.observer))
	}
	cl, err := core.NewWithPolicy(nil, coreOpts...)
	if err != nil {
		return nil, prefixed("", err)
	}
	l.cl = cl
	l.clock = cl.Clock()
	_, mem := store.(*core.MemoryStore)
	l.useCtx = !mem || l.slots != nil
	for i := range l.layers {
		if l.layers[i].resolver != nil {
			l.useCtx, l.resolvers = true, true
		}
	}
	l.observeRules(policies) // once nothing can refuse them
	return l, nil
}

// checkPolicies returns the error of the first policy store cannot decide
// (core.PolicyChecker): of the rate layers' policies, by layer, then of
// those their Resolvers list. A concurrency layer's policy is never sent to
// store.
func (l *Limiter) checkPolicies(store core.Store, policies, listed []*core.Policy) error {
	for i, p := range policies {
		if l.layers[i].inFlight > 0 {
			continue
		}
		if err := core.CheckPolicies(store, p); err != nil {
			return prefixed("layer "+l.layers[i].desc, err)
		}
	}
	if err := core.CheckPolicies(store, listed...); err != nil {
		return prefixed("a policy a Resolver lists", err)
	}
	return nil
}

// layerDesc names layer i in the user's words: its Rule.Name, quoted, or its
// index when it has none.
func layerDesc(i int, name string) string {
	if name == "" {
		return strconv.Itoa(i) + " (unnamed)"
	}
	return strconv.Quote(name)
}

// prefixedError is an error whose message carries one "ratelimit: " prefix
// however many the errors it wraps had.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// prefixed returns err under "ratelimit: where: ", with the "ratelimit: "
// prefix err's own message had removed; errors.Is still sees err.
func prefixed(where string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "ratelimit: ")
	if where != "" {
		msg = where + ": " + msg
	}
	return &prefixedError{msg: "ratelimit: " + msg, err: err}
}

// wrapError is a sentinel and a cause under one "ratelimit: " prefix:
// errors.Is sees both.
type wrapError struct {
	msg  string
	errs [2]error
}

func (e *wrapError) Error() string   { return e.msg }
func (e *wrapError) Unwrap() []error { return e.errs[:] }

// wrap returns an error wrapping sentinel and err whose message is
// sentinel's, then where (if any), then err's, with one "ratelimit: " prefix.
func wrap(sentinel error, where string, err error) error {
	msg := sentinel.Error()
	if where != "" {
		msg += ": " + where
	}
	return &wrapError{msg: msg + ": " + strings.TrimPrefix(err.Error(), "ratelimit: "), errs: [2]error{sentinel, err}}
}

// Must panics if err is not nil and returns l otherwise, for limiters built
// at program start: ratelimit.Must(ratelimit.New(layers)).
func Must(l *Limiter, err error) *Limiter {
	if err != nil {
		panic(err)
	}
	return l
}

// Middleware is shorthand for New(layers, opts...) followed by
// [Limiter.Handler], for routers that take a func(http.Handler)
// http.Handler.
func Middleware(layers []Layer, opts ...Option) (func(http.Handler) http.Handler, error) {
	l, err := New(layers, opts...)
	if err != nil {
		return nil, err
	}
	return l.Handler, nil
}

// Handler returns a handler that decides every request and calls next only
// for the requests it admits (after their shaping delay): see
// [Limiter.Admit]. It panics if next is nil.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	if next == nil {
		panic("ratelimit: Handler called with a nil http.Handler")
	}
	if l.cfg.refund != nil {
		return l.refundHandler(next) // see WithRefund
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.slots != nil {
			ok, done := l.AdmitFunc(w, r)
			defer done() // also when next panics or hijacks
			if !ok {
				return
			}
		} else if !l.Admit(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Admit decides r, writes the rate-limit headers and, when the request must
// not be served, the response; it reports whether the caller should serve the
// request. It waits out a shaping delay before returning true. It is
// everything [Limiter.Handler] does except calling the next handler, for
// framework adapters:
//
//	if !l.Admit(c.Writer, c.Request) { c.Abort(); return }
//
// In order: a skipped request (or one no layer applies to) is admitted
// without headers. A request whose context ended before the store answered
// gets no response at all (its client is gone). An error goes to the error
// handler; unless it writes a response, a request error is answered 400, a
// missing required key 401, a configuration error 500, a full store 429
// with Retry-After, a store failure is served (fail-open, without headers,
// logged once) or answered 503 (fail-closed), and in dry-run mode the
// request is served. Otherwise the headers are set; a refused
// request gets Retry-After and the denied response (429, or 413 for a cost
// above capacity). An admitted request with a Delay waits for it (see
// [Limiter.Wait]); a full waiting room refuses it with 429 and a request
// whose context ends first is answered 503 (if anyone still listens).
//
// With concurrency layers ([Layer.InFlight]), Admit gives the request's
// slots back when its context ends; prefer [Limiter.AdmitFunc], which
// returns the function that gives them back when the request is served.
func (l *Limiter) Admit(w http.ResponseWriter, r *http.Request) bool {
	if l.slots != nil {
		return l.admitContext(w, r)
	}
	var res Result
	return l.admit(w, r, &res)
}

// admit is Admit's decision and response into res, for Admit and
// AdmitFunc. The Result's layers stay on the stack, apart from the Result:
// escape analysis is field-insensitive, so a Result holding both them and
// an error handed to user code would move them to the heap.
func (l *Limiter) admit(w http.ResponseWriter, r *http.Request, res *Result) bool {
	kr := l.routeRequest(r)
	switch n := len(l.layers); {
	case n == 1:
		// The most common Limiter: zero one element of each, not four.
		var (
			buf  [1]LayerResult
			reqs [1]core.Request
			out  [1]core.Decision
		)
		n := l.decide(kr, res, buf[:], reqs[:], out[:], true)
		return l.serve(w, r, res, buf[:n])
	case n <= smallBatch:
		var (
			buf  [smallBatch]LayerResult
			reqs [smallBatch]core.Request
			out  [smallBatch]core.Decision
		)
		n := l.decide(kr, res, buf[:], reqs[:], out[:], true)
		return l.serve(w, r, res, buf[:n])
	}
	return l.admitMany(w, r, kr, res)
}

// routeRequest returns r ready for [Route] when the Limiter knows the
// ServeMux (see [WithServeMux]) and no framework adapter has keyed its
// route: it sets r.Pattern to the pattern the mux will match, as the mux
// itself does when it serves r, or, when the mux matches nothing, returns a
// copy of r marked as routed without a match. A pattern already on r is
// replaced by the one the mux matches: it is an outer mux's (the Limiter's
// mux mounted under "/api/"), not the route the wrapped mux will serve. It
// is kept for a Limiter mounted inside its own mux behind http.StripPrefix:
// when the mux matches the path as the request came in to that pattern
// (the stripped path may match another pattern, such as a catch-all "/"),
// or matches nothing: a route layer then limits by it rather than skip the
// request.
func (l *Limiter) routeRequest(r *http.Request) *http.Request {
	mux := l.cfg.mux
	if mux == nil {
		return r
	}
	if _, routed := r.Context().Value(routeContextKey{}).(string); routed {
		return r
	}
	_, pattern := mux.Handler(r)
	if pattern != "" && redirectPath(r, pattern) {
		// The mux answers r with a redirect to its path and a slash, and
		// names that path (the client's text, a new key for every path)
		// where it would name a pattern: a CONNECT request, or any method
		// on toolchains without the fix of golang/go#73688. The route is
		// the pattern that serves the redirect's target, as ServeMux
		// names it otherwise.
		rr, u := *r, *r.URL
		u.Path, u.RawPath = pattern, ""
		rr.URL = &u
		_, pattern = mux.Handler(&rr)
	}
	if r.Pattern != "" && pattern != r.Pattern && ownPattern(mux, r) {
		return r // the Limiter is inside its own mux, behind a prefix strip
	}
	if pattern != "" {
		r.Pattern = pattern
		return r
	}
	if r.Pattern != "" {
		return r
	}
	return r.WithContext(WithRoute(r.Context(), ""))
}

// observeRoomFull reports a request refused for a full waiting room to the
// Observer, as an error of its shaping layers' policies ps: no rule
// refused it.
func (l *Limiter) observeRoomFull(ps []*core.Policy) {
	if l.cfg.observer != nil {
		l.cfg.observer.ObserveError(core.ErrorEvent{Policies: ps, Err: ErrTooManyWaiting})
	}
}

// redirectPath reports whether pattern, what mux.Handler returned for r,
// is the target of the mux's trailing-slash redirect: r's path, cleaned,
// and a slash.
func redirectPath(r *http.Request, pattern string) bool {
	p := r.URL.Path
	if pattern[0] != '/' || !strings.HasSuffix(pattern, "/") || p == "" || p[0] != '/' || strings.HasSuffix(p, "/") {
		return false
	}
	if len(pattern) == len(p)+1 {
		return strings.HasPrefix(pattern, p)
	}
	// A path with dot segments or repeated slashes is cleaned first (a
	// clean one is as it is); Clean allocates only for those.
	if len(pattern) > len(p) || !strings.Contains(p, "/.") && !strings.Contains(p, "//") {
		return false
	}
	c := path.Clean(p)
	return len(pattern) == len(c)+1 && strings.HasPrefix(pattern, c)
}

// patternPath returns the path of a ServeMux pattern, without its method
// and host.
func patternPath(p string) string {
	if i := strings.IndexAny(p, " \t"); i >= 0 && !strings.Contains(p[:i], "/") {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:]
	}
	return p
}

// ownPattern reports whether mux matches r as it came in (its path before
// a handler such as http.StripPrefix cut it) to r.Pattern: the Limiter then
// serves inside the mux it routes with, and r.Pattern is its route, though
// the cut path matches another of the mux's patterns (a catch-all "/").
func ownPattern(mux *http.ServeMux, r *http.Request) bool {
	ru, _, _ := strings.Cut(r.RequestURI, "?")
	if ru == r.URL.Path || (r.URL.RawPath != "" && ru == r.URL.RawPath) {
		return false // nothing was cut: the usual case, with no parsing
	}
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || u.Path == r.URL.Path {
		return false
	}
	// The part cut must be a literal prefix of the pattern's path (what
	// StripPrefix cuts behind "/api/" is "/api"): an outer mux's catch-all
	// "/" in front of a cut "/app" is another mux's pattern.
	cut, ok := strings.CutSuffix(u.Path, r.URL.Path)
	if !ok || cut == "" || !strings.HasPrefix(patternPath(r.Pattern), strings.TrimSuffix(cut, "/")+"/") {
		return false
	}
	orig := *r
	ou := *r.URL
	ou.Path, ou.RawPath = u.Path, u.RawPath
	orig.URL = &ou
	_, pattern := mux.Handler(&orig)
	return pattern == r.Pattern
}

// admitMany is Admit for limiters with more than smallBatch layers, apart
// so that the common case does not zero its larger arrays.
//
//go:noinline
func (l *Limiter) admitMany(w http.ResponseWriter, r, kr *http.Request, res *Result) bool {
	var (
		buf  [core.MaxBatch]LayerResult
		reqs [core.MaxBatch]core.Request
		out  [core.MaxBatch]core.Decision
	)
	n := l.decide(kr, res, buf[:], reqs[:], out[:], true)
	return l.serve(w, r, res, buf[:n])
}

// smallBatch is the size of the stack arrays Admit uses for limiters with
// few layers (zeroing core.MaxBatch of each would cost more than deciding).
const smallBatch = 4

// serve is Admit after the decision, with the Result's layers apart (its
// Layers field is unused). Both may live on the caller's stack: user code
// gets only their export.
func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, res *Result, layers []LayerResult) bool {
	if res.held != nil || res.reserved {
		// An error handler or denied handler that panics must not keep
		// the request's in-flight slots, or its waiting-room slot, for
		// good.
		defer l.releaseOnPanic(res)
	}
	if res.slotErr != nil && l.cfg.errHandler != nil && l.callErrorHandler(w, r, res.slotErr) {
		// The concurrency layers failed open (the rate layers decided):
		// the error handler, which sees every store error, stopped it.
		if res.Proceed {
			// Not served: charged nothing, as under the fail-closed policy.
			l.refundStopped(r, res, layers)
			l.release(res) // a waiting-room slot a shaping delay would have released
		}
		return false
	}
	switch res.kind {
	case outcomeGone:
		return false // the client went away: nobody to answer
	case outcomeBadRequest, outcomeStore, outcomeConfig, outcomeMissingKey, outcomeStoreFull:
		if !res.Proceed {
			l.Refuse(w, r, export(res, layers))
			return false
		}
		// Fail-open, or dry-run: the error handler may still stop it.
		if l.cfg.errHandler != nil && l.callErrorHandler(w, r, res.Err) {
			return false
		}
		l.noteFailedOpen(res)
		return true
	case outcomeQueueFull, outcomeTooCostly:
		if len(layers) == 0 {
			// Refused before anything was decided (a full room, or a
			// cost no layer can admit met with the store down, whose
			// failure the error handler sees first): no state to write
			// headers from.
			if !res.Proceed {
				l.Refuse(w, r, export(res, layers)) // the error handler sees a store failure first
				return false
			}
			if res.storeErr != nil && l.cfg.errHandler != nil && l.callErrorHandler(w, r, res.storeErr) {
				return false // dry-run: the error handler may still stop it
			}
		}
	}
	if res.Skipped || len(layers) == 0 {
		return res.Proceed
	}
	l.writeHeaders(w.Header(), res, layers)
	if !res.Proceed {
		l.Refuse(w, r, export(res, layers))
		return false
	}
	if res.Delay > 0 && !res.DryRun {
		if err := l.wait(r.Context(), res, layers); err != nil {
			l.Refuse(w, r, export(res, layers))
			return false
		}
	}
	l.noteFailedOpen(res) // served: logged only now
	return true
}

// Decide decides r under every layer and charges it when all applied layers
// admit it, in one atomic store call. It writes nothing, calls no handler and
// does not wait; the Result says what to do (see [Limiter.Admit] for the
// composed flow). It allocates the Result's Layers; Admit does not. With
// concurrency layers, a Result that proceeds holds their slots until
// [Result.Release] is called; when their slot store failed, the Result
// proceeds on the rate layers alone. A Result that proceeds past a failed
// store (fail-open, see [WithFailClosed]) or slot store is logged once (see
// [WithLogger]) by Decide, whether or not the caller then serves the
// request.
func (l *Limiter) Decide(r *http.Request) Result {
	res := l.decideResult(r, false)
	l.noteFailedOpen(&res) // the caller serves it: logged now
	return res
}

// decideResult is Decide, with reserve as for decide.
func (l *Limiter) decideResult(r *http.Request, reserve bool) Result {
	return l.decideResultWith(r, reserve, nil)
}

// decideResultWith is decideResult with the layers' keys and costs already
// read into pre (nil: read them).
func (l *Limiter) decideResultWith(r *http.Request, reserve bool, pre []preparedLayer) Result {
	var (
		res  Result
		reqs [core.MaxBatch]core.Request
		out  [core.MaxBatch]core.Decision
	)
	n := len(l.layers)
	buf := make([]LayerResult, n+1) // and the claim cell, out of any copy's Layers
	res.claim = &buf[n].claim
	if n := l.decideOrPeek(l.routeRequest(r), &res, buf[:n], reqs[:], out[:], reserve, false, pre); n > 0 {
		res.Layers = buf[:n:n] // an append to them never reaches the claim
	}
	return res
}

// decide fills res, except its Layers: it returns n, the number of applied
// layers whose results are in buf[:n] (0 after an error or a skip). buf,
// reqs and out hold at least len(l.layers) elements, buf's all zero. With
// reserve, a request meeting a shaping layer takes a waiting-room slot
// before anything is charged (see [WithMaxWaiting]); the slot stays with
// res when it must wait.
func (l *Limiter) decide(r *http.Request, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision, reserve bool) int {
	return l.decideOrPeek(r, res, buf, reqs, out, reserve, false, nil)
}

// decideOrPeek is decide, or with peek, its dry form for [Limiter.Peek].
func (l *Limiter) decideOrPeek(r *http.Request, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision, reserve, peek bool, pre []preparedLayer) int {
	rs := l.rules.Load()
	if l.slots != nil || reserve && !l.cfg.dryRun && (rs.maxDelay > 0 || l.resolvers) {
		// The decision may take in-flight slots or a waiting-room slot.
		return l.decideHolding(rs, r, res, buf, reqs, out, reserve, peek, pre)
	}
	// It takes neither: nothing to give back on a panic, and no deferred
	// call on the common path.
	return l.decideLayers(rs, r, res, buf, reqs, out, reserve, peek, pre, nil)
}

// decideHolding is decideLayers for a decision that may take in-flight
// slots or a waiting-room slot: a store, slot store or Observer that
// panics once they are taken must not keep them for good, and a decision
// that took in-flight slots is settled.
func (l *Limiter) decideHolding(rs *ruleSet, r *http.Request, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision, reserve, peek bool, pre []preparedLayer) int {
	var s settlement
	defer l.releaseOnPanic(res)
	defer func() {
		if s.due {
			l.settle(res, buf[:s.n])
		}
	}()
	return l.decideLayers(rs, r, res, buf, reqs, out, reserve, peek, pre, &s)
}

// settlement is where decideLayers asks decideHolding to settle the
// layers buf[:n] once it returns (see Limiter.settle).
type settlement struct {
	n   int
	due bool
}

// decideLayers is decideOrPeek under the rule set rs. It defers nothing: a
// decision that may take slots comes through decideHolding, with s, which
// settles them.
func (l *Limiter) decideLayers(rs *ruleSet, r *http.Request, res *Result, buf []LayerResult, reqs []core.Request, out []core.Decision, reserve, peek bool, pre []preparedLayer, s *settlement) int {
	res.DryRun = l.cfg.dryRun
	res.rs = rs
	if l.skip(r) {
		res.Skipped, res.Proceed = true, true
		return 0
	}
	// The MemoryStore takes no context: without Resolvers or concurrency
	// layers the request's context is not read (a load from a cache line
	// of its own) unless the decision fails.
	ctx := context.Background()
	if l.useCtx {
		ctx = r.Context()
	}
	var (
		n        int
		defCost  int64
		haveCost bool
		rc       routeOnce
		shaped   bool
		maxDelay time.Duration // the longest MaxDelay of this request's policies
	)
	for i := range l.layers {
		ly := &l.layers[i]
		if ly.routes != nil {
			route, routeErr := rc.get(r)
			if routeErr != nil {
				if errors.Is(routeErr, ErrNoKey) {
					continue // no route matched: the router answers it
				}
				l.configError(res, ly, routeErr)
				return 0
			}
			if !containsString(ly.routes, route) {
				l.noteRoute(i, false, route)
				continue
			}
			l.noteRoute(i, true, route)
		}
		var (
			key string
			err error
		)
		if pre != nil && pre[i].read {
			key, err = pre[i].key, pre[i].err
		} else {
			key, err = ly.key(r)
		}
		if err != nil {
			if errors.Is(err, ErrNoRoute) || errors.Is(err, ErrConfig) {
				l.configError(res, ly, err)
				return 0
			}
			if errors.Is(err, ErrNoKey) {
				if ly.ifNoKey == NoKeyRefuse {
					l.failed(res, outcomeMissingKey, fmt.Errorf("%w: layer %s", ErrMissingKey, ly.desc))
					return 0
				}
				// Only a skipping layer can limit nothing: one that refuses
				// a request without its key is never noted as absent.
				l.noteKey(i, false)
				continue
			}
			l.failed(res, outcomeBadRequest, prefixed("layer "+ly.desc, err))
			return 0
		}
		if key == "" {
			l.failed(res, outcomeBadRequest, prefixed("layer "+ly.desc, ErrEmptyKey))
			return 0
		}
		l.noteKey(i, true)
		p := rs.rules[i].policy
		if ly.resolver != nil {
			rp, err := ly.resolver.Resolve(ctx, key)
			if err != nil {
				if l.goneWith(res, ctx, err) {
					return 0 // the request ended, and so the lookup
				}
				err = wrap(ErrStoreFailure, "layer "+ly.desc+": resolving the policy", err)
				if !peek {
					// Reported as a store failure is (and, as a store
					// failure, not for a Peek): the fail policy answers it.
					l.observeError(reqs[:n], p, err)
				}
				l.failed(res, outcomeStore, err)
				return 0
			}
			if rp != nil {
				if rp.Identity() == "" { // a zero Policy, not built by core.NewPolicy
					l.configError(res, ly, errors.New("the Resolver returned a Policy not built by core.NewPolicy"))
					return 0
				}
				if err := l.clashes(i, rp, reqs[:n]); err != nil {
					// Reported as the store reports the policies it
					// cannot decide (and so, as core reports them, not
					// for a Peek): the request is answered 500.
					if !peek {
						l.observeError(reqs[:n], rp, err)
					}
					l.configError(res, ly, err)
					return 0
				}
				p = rp
			}
		}
		var cost int64
		if pre != nil && pre[i].costRead {
			cost = pre[i].cost
		} else {
			cost = l.layerCost(ly, r, &defCost, &haveCost)
		}
		if cost < 1 {
			l.failed(res, outcomeBadRequest, fmt.Errorf("ratelimit: layer %s: cost %d: %w", ly.desc, cost, errInvalidCost))
			return 0
		}
		if d := p.MaxDelay(); d > 0 {
			shaped, maxDelay = true, max(maxDelay, d)
		}
		reqs[n] = core.Request{Policy: p, Key: key, Cost: cost}
		lr := &buf[n] // zero: its other fields are written once decided
		lr.Key, lr.Cost, lr.index, lr.resets = key, cost, i, l.resetCount(l.layers[i].name, key)
		n++
	}
	if n == 0 {
		res.Proceed = true
		return 0
	}
	res.at = l.cl.NowUnixNano()
	if l.cfg.logger != nil && !l.logs.done[logForwarded].Load() && l.sampleForwarded(res.at) {
		l.checkForwarded(r, reqs[:n])
	}
	// A rate layer's cost above its capacity can never be admitted: the
	// store refuses it (413), charging nothing, and neither a full waiting
	// room nor a concurrency layer's busy slots may answer it with a
	// Retry-After first.
	var tooCostly error // the refusal of a cost above a rate layer's capacity
	for j := range reqs[:n] {
		if p := reqs[j].Policy; l.layers[buf[j].index].inFlight == 0 && reqs[j].Cost > p.Capacity() {
			tooCostly = fmt.Errorf("%w: %q capacity %d, cost %d", core.ErrCostExceedsCapacity, p.Name(), p.Capacity(), reqs[j].Cost)
			break
		}
	}
	if shaped && reserve && !l.cfg.dryRun && tooCostly == nil {
		// Take a waiting-room slot before charging, so that a request
		// refused for a full room is charged nothing.
		if l.waiting.Add(1) > int64(l.cfg.maxWaiting) {
			l.waiting.Add(-1)
			// Retry when every request waiting now has been served: by
			// waitEnd, and no sooner than the longest delay of the shaping
			// policies known, this request's own included (a Resolver that
			// lists none may pick one), for the requests taking a slot now.
			res.Err, res.kind, res.Delay = ErrTooManyWaiting, outcomeQueueFull, max(rs.maxDelay, maxDelay)
			if end := l.waitEnd.Load(); end > res.at {
				res.Delay = max(res.Delay, untilNanos(end, res.at))
			}
			if l.cfg.observer != nil {
				var ps []*core.Policy
				for j := range reqs[:n] {
					if reqs[j].Policy.MaxDelay() > 0 {
						ps = append(ps, reqs[j].Policy)
					}
				}
				l.observeRoomFull(ps)
			}
			return 0
		}
		res.reserved = true // given back by decideHolding on a panic
		l.noteWaitEnd(addNanos(res.at, max(rs.maxDelay, maxDelay)))
	}
	m := n
	if (peek || tooCostly != nil) && l.slots != nil {
		// Peek, and a request too costly for a rate layer, ask the rate
		// layers only: a concurrency layer's slots are not taken, and the
		// layer is left out of the Result.
		m = 0
		for j := 0; j < n; j++ {
			if l.layers[buf[j].index].inFlight == 0 {
				buf[m], reqs[m] = buf[j], reqs[j]
				m++
			}
		}
		if n = m; n == 0 {
			res.Proceed = true
			return 0
		}
	}
	if l.slots != nil && !peek && tooCostly == nil {
		var stop bool
		if m, stop = l.acquire(ctx, res, buf[:n], reqs[:n], out[:n]); stop {
			l.release(res)
			return m
		}
		if res.slotsFailed {
			n = m // the concurrency layers failed open: the rate layers decide
		}
		if _, local := l.slots.(*core.SlotTable); !local && m > 0 {
			// A remote slot store took a round trip: the rate layers are
			// decided, and their latency measured, from now.
			res.at = l.cl.NowUnixNano()
		}
		s.n, s.due = n, true // settled by decideHolding
	}
	ok, err := true, error(nil)
	switch {
	case m > 0 && peek:
		ok, err = l.cl.PeekAt(ctx, time.Unix(0, res.at), reqs[:m], out[:m]) // charges nothing
	case m == 1 && n == 1 && l.slots == nil:
		// One layer: the store writes its decision in place.
		out = unsafe.Slice(&buf[0].Decision, 1)
		ok, err = l.cl.TakeAtUnixNano(ctx, res.at, reqs[:1], out)
	case m > 0:
		ok, err = l.cl.TakeAtUnixNano(ctx, res.at, reqs[:m], out[:m])
	}
	if err != nil && !errors.Is(err, core.ErrCostExceedsCapacity) {
		l.release(res)
		switch {
		case l.goneWith(res, r.Context(), err):
		case errors.Is(err, core.ErrDuplicateRequest), errors.Is(err, core.ErrUnsupportedPolicy):
			// A policy the store cannot decide (one a Resolver picked
			// without listing it): a configuration error, never served
			// fail-open.
			l.configError(res, nil, err)
		case tooCostly != nil:
			// The store failed, but the request can never be admitted
			// (and holds no concurrency slot): refused as too costly,
			// never served by the fail policy; the error handler still
			// sees the store's failure.
			l.failed(res, outcomeTooCostly, tooCostly)
			res.storeErr = wrap(ErrStoreFailure, "", err)
		case errors.Is(err, core.ErrStoreFull):
			// Fail-open would serve exactly the keys KeepActive exists
			// to refuse: refuse them, whatever the fail policy.
			var ra time.Duration
			for j := 0; j < n; j++ {
				ra = max(ra, out[j].RetryAfter)
			}
			if ra <= 0 {
				// No retry time: the request's keys can never fit (a
				// store whose capacity is below one request's layers).
				l.configError(res, nil, fmt.Errorf("the store's capacity is too small for one request's layers: %w", err))
				break
			}
			l.failed(res, outcomeStoreFull, prefixed("refused", err))
			res.Delay = ra
		default:
			l.failed(res, outcomeStore, wrap(ErrStoreFailure, "", err))
		}
		return 0
	}
	for j := 0; j < n; j++ {
		if &buf[j].Decision != &out[j] { // not written in place
			buf[j].Decision = out[j]
		}
		buf[j].Refused = !out[j].Allowed
		res.Delay = max(res.Delay, out[j].Delay)
	}
	if m > 0 && out[0].Fallback && !peek {
		// The store's backend is down and its Fallback decides (a batch
		// falls back whole): each instance limits on its own state.
		l.logOnce(logFallback, msgFallback)
	}
	switch {
	case err != nil:
		res.Err, res.kind = err, outcomeTooCostly
		res.Delay = 0
	case !ok:
		res.kind = outcomeRefused
		res.Delay = 0
	}
	res.Proceed = ok || l.cfg.dryRun
	if res.Delay == 0 || !res.Proceed || res.DryRun {
		l.release(res)
	}
	return n
}

// routeOnce reads a request's route key (see [Route]) once, for the layers
// with Routes.
type routeOnce struct {
	route string
	err   error
	done  bool
}

func (o *routeOnce) get(r *http.Request) (string, error) {
	if !o.done {
		o.route, o.err = routeKey(r)
		o.done = true
	}
	return o.route, o.err
}

// layerCost returns what layer ly charges r: 1 for a concurrency layer, else
// what its Cost function says, else what WithCost's function says (called
// once per request: def and have keep its answer), else 1.
func (l *Limiter) layerCost(ly *layer, r *http.Request, def *int64, have *bool) int64 {
	switch {
	case ly.inFlight > 0:
		return 1
	case ly.cost != nil:
		return ly.cost(r)
	case l.cfg.cost != nil:
		if !*have {
			*def, *have = l.cfg.cost(r), true
		}
		return *def
	}
	return 1
}

// errInvalidCost is core.ErrInvalidCost without its own prefix, for
// messages that already carry one.
var errInvalidCost = &prefixedError{msg: strings.TrimPrefix(core.ErrInvalidCost.Error(), "ratelimit: "), err: core.ErrInvalidCost}

// releaseOnPanic, deferred, gives back the waiting-room slot and the
// in-flight slots res holds when a panic unwinds (a store, slot store,
// Observer or error handler that panics must not keep them for good), and
// panics on.
func (l *Limiter) releaseOnPanic(res *Result) {
	if p := recover(); p != nil {
		l.release(res)
		if res.held != nil {
			res.held()
			res.held = nil
		}
		panic(p)
	}
}

// observeError reports err to the Observer, if any, under the policies of
// reqs, the layers prepared so far, and p, the layer's that met it.
func (l *Limiter) observeError(reqs []core.Request, p *core.Policy, err error) {
	if l.cfg.observer == nil {
		return
	}
	ps := make([]*core.Policy, 0, len(reqs)+1)
	for j := range reqs {
		ps = append(ps, reqs[j].Policy)
	}
	l.cfg.observer.ObserveError(core.ErrorEvent{Policies: append(ps, p), Err: err})
}

// noteFailedOpen logs, once, a request that proceeds past a failed store
// (outside dry-run): the rate store's failure on its line, and the slot
// store's (the rate layers decided without the concurrency layers, or
// none applied) on a line of its own, so that a rate store failing later,
// which limits nothing at all, is logged too.
func (l *Limiter) noteFailedOpen(res *Result) {
	if !res.Proceed || res.DryRun {
		return
	}
	if res.kind == outcomeStore {
		if res.slotsFailed && res.slotErr == nil {
			// The slot store failed, and no rate layer applied to decide.
			l.logOnce(logSlotFailOpen, msgSlotFailOpen, "error", res.Err.Error())
		} else {
			l.logOnce(logFailOpen, msgFailOpen, "error", res.Err.Error())
		}
	}
	if res.slotErr != nil {
		l.logOnce(logSlotFailOpen, msgSlotFailOpen, "error", res.slotErr.Error())
	}
}

// release gives back the waiting-room slot res holds, if any.
func (l *Limiter) release(res *Result) {
	if res.reserved {
		res.reserved = false
		l.waiting.Add(-1)
	}
}

// gone reports whether the request itself ended (its client went away, or
// its deadline passed) by the time its store or Resolver failed,
// rather than that the store failed; if so it records that in res. Only
// the request's own context says so: a context.Canceled from a store or
// Resolver whose request is still live (a lookup shared with another
// request that was cancelled, say) is a store failure, answered by the
// fail policy.
func (l *Limiter) gone(res *Result, ctx context.Context) bool {
	cerr := ctx.Err()
	if cerr == nil {
		return false
	}
	res.Err, res.kind, res.Proceed = fmt.Errorf("ratelimit: request ended before it was decided: %w", cerr), outcomeGone, false
	return true
}

// goneWith is gone for an error err of the store: the request ended
// before it was decided only when err comes from its context's end, as
// the Observer reads it; an error of the store's own, met after the client
// went away (a full KeepActive store, say), is still the store's, reported
// and answered as such.
func (l *Limiter) goneWith(res *Result, ctx context.Context, err error) bool {
	if cerr := ctx.Err(); cerr == nil || !errors.Is(err, cerr) {
		return false
	}
	return l.gone(res, ctx)
}

// configError records a configuration error met at request time and logs it
// once. ly is the layer concerned, nil for the batch.
func (l *Limiter) configError(res *Result, ly *layer, err error) {
	where := "the layers' policies"
	if ly != nil {
		where = "layer " + ly.desc
	}
	l.failed(res, outcomeConfig, wrap(ErrConfig, where, err))
	if errors.Is(err, ErrNoRoute) {
		l.logOnce(logNoRoute, msgNoRoute, "layer", ly.desc)
		return
	}
	l.logConfigError(res.Err)
}

// clashes returns the configuration error of a policy rp that layer i's
// Resolver returned under the name of another layer (or of a policy
// another layer's Resolver lists), or under the name of a policy another
// layer decides the same request under (taken, the requests of the layers
// before i): it would share that layer's state in the store. It returns
// nil otherwise.
func (l *Limiter) clashes(i int, rp *core.Policy, taken []core.Request) error {
	name := rp.Name()
	if o, ok := l.owners[name]; ok {
		if o == i {
			return nil // the layer's own rule or one of its listed policies
		}
		return fmt.Errorf("the Resolver returned a policy named %q, as layer %s: layer and policy names must be unique within a Limiter", name, l.layers[o].desc)
	}
	for j := range taken {
		if taken[j].Policy.Name() == name {
			return fmt.Errorf("%w: the Resolver returned a policy named %q, as the policy of another layer of the same request: layer and policy names must be unique within a Limiter", core.ErrDuplicateRequest, name)
		}
	}
	return nil
}

// containsString reports whether list holds s.
func containsString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// failed records an error that left nothing decided.
func (l *Limiter) failed(res *Result, k outcome, err error) {
	res.Err, res.kind = err, k
	switch k {
	case outcomeStore:
		res.Proceed = !l.cfg.failClosed || l.cfg.dryRun
	default:
		res.Proceed = l.cfg.dryRun
	}
}

// skip reports whether r matches a skip predicate or an allowlist.
func (l *Limiter) skip(r *http.Request) bool {
	for _, f := range l.cfg.skips {
		if f(r) {
			return true
		}
	}
	for i := range l.cfg.allow {
		if l.cfg.allow[i].match(r) {
			if l.cfg.allow[i].ip == nil {
				l.checkSkipForwarded(r)
			}
			return true
		}
	}
	return false
}

// match reports whether the client of r lies wholly inside the list.
func (a *allowList) match(r *http.Request) bool {
	var client netip.Prefix
	if a.ip == nil {
		addr, ok := parseIPEntry(r.RemoteAddr)
		if !ok {
			return false
		}
		client = netip.PrefixFrom(addr, addr.BitLen())
	} else {
		key, err := a.ip(r)
		if err != nil {
			return false
		}
		var ok bool
		if client, ok = keyPrefix(key); !ok {
			return false
		}
	}
	for _, p := range a.prefixes {
		if p.Bits() <= client.Bits() && p.Contains(client.Addr()) {
			return true
		}
	}
	return false
}

// keyPrefix parses a ClientIP key: an address or a network.
func keyPrefix(key string) (netip.Prefix, bool) {
	if a, err := netip.ParseAddr(key); err == nil {
		a = a.WithZone("").Unmap()
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	p, err := netip.ParsePrefix(key)
	if err != nil {
		return netip.Prefix{}, false
	}
	return prefixAsRead(p.Masked()), true
}

// Wait holds an admitted request for res.Delay, its shaping delay (see
// core.Rule.MaxDelay): a request that overflowed a LeakyBucket layer with
// MaxDelay was admitted and charged on condition that it is served no sooner
// than Delay from now. Wait returns nil at once for a zero Delay or a dry-run
// Result, nil after the delay, the context's error if ctx ends first, and
// ErrTooManyWaiting without waiting when [WithMaxWaiting] requests are
// already waiting. (Admit and Handler take the waiting slot before charging,
// so their full-room refusals charge nothing; after Decide, Wait can only
// count the waiters afterwards.) In the last two cases the charge stays,
// the in-flight slots res holds are given back (see [Result.Release]: a
// refusal holds none; the Observer, told of the concurrency layers when
// they were decided, still counts them admitted), and Wait turns res into
// a refusal for
// [Limiter.Refuse]: Proceed false,
// Err set, and for ErrTooManyWaiting the delaying layers marked Refused and
// the refusal reported to the Observer (Refuse then answers 429 with
// Retry-After set to the delay, or to when the requests waiting are served
// if that is later; 503 for an ended context).
//
// The delay is waited on a real timer, whatever the Limiter's clock.
func (l *Limiter) Wait(ctx context.Context, res *Result) error {
	err := l.wait(ctx, res, res.Layers)
	if err != nil && res.held != nil {
		res.held() // a refusal holds no slot; Release on any copy is then a no-op
	}
	return err
}

// wait is Wait with the layers passed apart (see Limiter.Admit).
func (l *Limiter) wait(ctx context.Context, res *Result, layers []LayerResult) error {
	d := res.Delay
	if d <= 0 || res.DryRun || !res.Proceed {
		l.release(res)
		return nil
	}
	err := ctx.Err()
	switch {
	case res.reserved: // Admit took the slot before charging
		if err == nil {
			err = l.sleep(ctx, d)
		}
		l.release(res)
	case err == nil:
		now := l.cl.NowUnixNano()
		if l.waiting.Add(1) > int64(l.cfg.maxWaiting) {
			err = ErrTooManyWaiting
			if end := l.waitEnd.Load(); end > now {
				// Not before the requests waiting now are served.
				res.Delay = max(res.Delay, untilNanos(end, now))
			}
		} else {
			l.noteWaitEnd(addNanos(now, d))
			err = l.sleep(ctx, d)
		}
		l.waiting.Add(-1)
	}
	if err != nil {
		res.Proceed, res.Err = false, err
		res.kind = outcomeCancelled
		if errors.Is(err, ErrTooManyWaiting) {
			res.kind = outcomeQueueFull
			var ps []*core.Policy
			for i := range layers {
				if layers[i].Decision.Delay > 0 {
					layers[i].Refused = true
					if l.cfg.observer != nil {
						ps = append(ps, layers[i].Decision.Policy)
					}
				}
			}
			l.observeRoomFull(ps)
		}
	}
	return err
}

// noteWaitEnd raises waitEnd to end, the Unix nanosecond by which a
// request taking a waiting-room slot has been served.
func (l *Limiter) noteWaitEnd(end int64) {
	for {
		if cur := l.waitEnd.Load(); cur >= end || l.waitEnd.CompareAndSwap(cur, end) {
			return
		}
	}
}

// waitTimer waits for d or until ctx ends.
func waitTimer(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Refuse writes the response for a Result that must not be served
// (Proceed false); headers should already be set by [Limiter.WriteHeaders].
//
// A refusal (Err nil, a cost above capacity, or ErrTooManyWaiting) goes to
// the denied handler (see [WithDeniedHandler]); by default it is answered
// 429 Too Many Requests, or 413 Content Too Large for a cost above a layer's
// capacity (such a request can never be admitted, so no Retry-After is
// promised), as short text or problem details ([WithProblemDetails]). For
// ErrTooManyWaiting, Refuse sets Retry-After itself (the refusal arose after
// the headers were written). A cost above capacity met while the store
// failed (refused all the same, nothing decided) first shows the store's
// failure to the error handler, which may write the response instead.
//
// An error goes to the error handler (see [WithErrorHandler]); unless it
// writes a response, a request error (key, cost) is answered 400 Bad Request
// and a store failure 503 Service Unavailable, with short text bodies. A
// request whose context ended during its shaping delay is answered 503.
//
// A Result built by hand from its exported fields is read from them, by
// Refuse, [Limiter.WriteHeaders] and [Result.RetryAfter] alike: Proceed
// false, Err nil and a layer Refused is a refusal (429, with the Retry-After
// of its refusing layers); Err wrapping core.ErrCostExceedsCapacity is a
// cost above capacity (413); anything else that does not proceed gets the
// denied response without a retry time.
func (l *Limiter) Refuse(w http.ResponseWriter, r *http.Request, res *Result) {
	kind := outcomeOf(res, res.Layers)
	switch kind {
	case outcomeGone:
		return
	case outcomeBadRequest, outcomeStore, outcomeConfig, outcomeMissingKey, outcomeStoreFull:
		if kind == outcomeStoreFull {
			w.Header()[canonRetry] = []string{itoa(ceilSeconds(res.RetryAfter()))}
		}
		if l.cfg.errHandler != nil && res.Err != nil && l.callErrorHandler(w, r, res.Err) {
			return
		}
		switch kind {
		case outcomeStore:
			writeText(w, http.StatusServiceUnavailable, "Service Unavailable: rate limiter unavailable\n")
		case outcomeConfig:
			writeText(w, http.StatusInternalServerError, "Internal Server Error: rate limiter misconfigured\n")
		case outcomeMissingKey:
			writeText(w, http.StatusUnauthorized, "Unauthorized\n")
		case outcomeStoreFull:
			if l.cfg.problem {
				writeProblem(w, problemStoreFull(res))
				return
			}
			writeText(w, http.StatusTooManyRequests, "Too Many Requests\n")
		default:
			writeText(w, http.StatusBadRequest, "Bad Request\n")
		}
		return
	case outcomeCancelled:
		writeText(w, http.StatusServiceUnavailable, "Service Unavailable: request cancelled while delayed\n")
		return
	case outcomeQueueFull:
		w.Header()[canonRetry] = []string{itoa(max(ceilSeconds(res.Delay), 1))}
	case outcomeTooCostly:
		// Refused as too costly though the store failed: the error
		// handler, which sees every store failure, sees it first.
		if res.storeErr != nil && l.cfg.errHandler != nil && l.callErrorHandler(w, r, res.storeErr) {
			return
		}
	}
	if l.cfg.denied != nil {
		l.cfg.denied(w, r, res)
		return
	}
	if kind == outcomeTooCostly {
		if l.cfg.problem {
			writeProblem(w, problemTooCostly(res))
		} else {
			writeText(w, http.StatusRequestEntityTooLarge, "Content Too Large: request cost exceeds the rate limit's capacity\n")
		}
		return
	}
	if l.cfg.problem {
		writeProblem(w, problemQuotaExceeded(res))
		return
	}
	writeText(w, http.StatusTooManyRequests, "Too Many Requests\n")
}

// callErrorHandler calls the error handler and reports whether it wrote a
// response.
func (l *Limiter) callErrorHandler(w http.ResponseWriter, r *http.Request, err error) bool {
	ww := &watchWriter{ResponseWriter: w}
	l.cfg.errHandler(ww, r, err)
	return ww.wrote
}

// watchWriter records whether a response was started.
type watchWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *watchWriter) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *watchWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *watchWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeText writes a short plain-text response.
func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	h["Cache-Control"] = []string{"no-store"} // RFC 6585: a 429 must not be stored
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
