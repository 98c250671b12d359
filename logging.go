package ratelimit

import (
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/limitry/ratelimit/core"
)

// The one-time log lines. Each is logged at most once per Limiter, at level
// Warn, to the logger set by [WithLogger] (slog.Default() unless set). They
// never carry a request's key or a client's address in full: only what is
// needed to fix the setup. An "error" attribute is the store's error as it
// is, which can name the backend (a Redis server's address).
const (
	msgForwarded          = "ratelimit: forwarded headers arrive from a loopback or private peer but no proxy is trusted: every client behind that proxy shares its bucket; pass the proxy's network to ratelimit.TrustedProxies"
	msgNoRoute            = "ratelimit: a Route layer found no route pattern: the limiter runs before routing; use ratelimit.WithServeMux or the chilimit, echolimit or ginlimit adapter"
	msgAbsentKey          = "ratelimit: a layer's key was absent on every one of its first requests: the layer limits nothing; check its KeyFunc, or set IfNoKey to NoKeyRefuse or use FirstOf"
	msgNoRoutes           = "ratelimit: a layer's Routes matched none of its first routed requests: if those routes are served, the layer limits nothing; write each route as the Route key gives it (\"POST /login\" for a route of one method, \"/login\" for one of every method, the router's own parameter syntax)"
	msgFailOpen           = "ratelimit: store errors are being served fail-open: requests are not limited while the store fails"
	msgConfig             = "ratelimit: configuration error at request time: requests are answered 500"
	msgConfigDryRun       = "ratelimit: configuration error at request time: requests are served (dry-run); enforcing would answer them 500"
	msgFallback           = "ratelimit: the store's backend is unavailable and its Fallback decides: each instance limits on its own local state, so N instances admit up to N times the quota until the backend is back"
	msgTransportAbsentKey = "ratelimit: the Transport's Key found no key on every one of its first requests: they were sent unlimited; check TransportConfig.Key"
	msgSlotFailOpen       = "ratelimit: in-flight slot store errors are being served fail-open: concurrency limits are not applied while the slot store fails (rate limits still are); ratelimit.WithFailClosed refuses instead"
	msgSkipForwarded      = "ratelimit: WithSkipCIDRs exempted a peer that sends forwarded headers: if it is a proxy, every client behind it is exempt from every limit; use WithSkipCIDRsFrom with the layers' ClientIP key"
)

// logKind is one once-per-Limiter log line.
type logKind uint8

const (
	logForwarded logKind = iota
	logNoRoute
	logFailOpen
	logConfig
	logRefund
	logSlotFailOpen
	logFallback
	logSkipForwarded
	numLogKinds
)

// ForwardedCheckFirst is the number of a Limiter's first requests on which
// the forwarded-header warning (see [WithLogger]) examines every request.
// After them it examines about one request in 64, chosen by the low bits of
// the decision's time on the Limiter's clock (see [WithClock]): behind an
// untrusted proxy every request carries the header, so the warning still
// comes within a few dozen requests, and the others skip three header
// lookups. A clock that stands still or moves in coarse steps samples
// fewer requests, or none.
const ForwardedCheckFirst = 1024

// forwardedSampleMask selects the requests examined after the first
// ForwardedCheckFirst: those whose decision time, in units of 1,024 ns, is
// 0 modulo 64.
const forwardedSampleMask = 63

// logState remembers which lines a Limiter has logged.
type logState struct {
	done [numLogKinds]atomic.Bool
	keys []keyStat // per layer
	// forwardedSeen counts the requests the forwarded-header check has
	// examined, up to about ForwardedCheckFirst.
	forwardedSeen atomic.Int64
}

// keyStat counts, for one layer, the requests it found no key for, until
// it finds one or logs that it never did; and for a layer with Routes, the
// routed requests none of its Routes matched, likewise.
type keyStat struct {
	absent, unrouted missCount
}

// missCount counts misses until the first hit.
type missCount struct {
	n    atomic.Int64
	done atomic.Bool // a hit came, or the misses were reported
}

// note records a hit or a miss, and reports whether this miss is the
// after-th in a row from the start: the one to report, once.
func (m *missCount) note(hit bool, after int64) bool {
	if m.done.Load() {
		return false
	}
	if hit {
		m.done.Store(true)
		return false
	}
	return m.n.Add(1) == after && !m.done.Swap(true)
}

// logConfigError logs, once, a configuration error met at request time,
// saying what the request got: 500, or, in dry-run, served.
func (l *Limiter) logConfigError(err error) {
	msg := msgConfig
	if l.cfg.dryRun {
		msg = msgConfigDryRun
	}
	l.logOnce(logConfig, msg, "error", err.Error())
}

// checkSkipForwarded logs, once, a request exempted by its peer's address
// (WithSkipCIDRs) that carries a forwarded header: the peer is likely a
// proxy, and every client behind it is exempt.
func (l *Limiter) checkSkipForwarded(r *http.Request) {
	if l.cfg.logger == nil || l.logs.done[logSkipForwarded].Load() {
		return
	}
	for _, h := range forwardedHeaders {
		if len(r.Header[h]) > 0 {
			l.logOnce(logSkipForwarded, msgSkipForwarded, "header", h)
			return
		}
	}
}

// logOnce logs msg with args at level Warn, once per Limiter.
func (l *Limiter) logOnce(k logKind, msg string, args ...any) {
	lg := l.cfg.logger
	if lg == nil || l.logs.done[k].Load() || l.logs.done[k].Swap(true) {
		return
	}
	lg.Warn(msg, args...)
}

// noteKey records whether layer i found a key for a request.
func (l *Limiter) noteKey(i int, present bool) {
	if l.logs.keys[i].absent.note(present, AbsentKeyLogAfter) && l.cfg.logger != nil {
		l.cfg.logger.Warn(msgAbsentKey, "layer", l.layers[i].desc, "requests", AbsentKeyLogAfter)
	}
}

// noteRoute records whether one of layer i's Routes matched route, the
// route of a routed request.
func (l *Limiter) noteRoute(i int, matched bool, route string) {
	if l.logs.keys[i].unrouted.note(matched, UnmatchedRoutesLogAfter) && l.cfg.logger != nil {
		l.cfg.logger.Warn(msgNoRoutes, "layer", l.layers[i].desc, "routes", l.layers[i].routes, "requests", UnmatchedRoutesLogAfter, "last_route", route)
	}
}

// forwardedHeaders are the client-IP headers proxies commonly set.
var forwardedHeaders = [...]string{"X-Forwarded-For", "Forwarded", "X-Real-Ip"}

// sampleForwarded reports whether the forwarded-header check examines the
// request decided at at (Unix nanoseconds): each of the Limiter's first
// ForwardedCheckFirst requests, then those whose time falls in one slot of
// 64.
func (l *Limiter) sampleForwarded(at int64) bool {
	if l.logs.forwardedSeen.Load() < ForwardedCheckFirst {
		l.logs.forwardedSeen.Add(1)
		return true
	}
	return uint64(at)>>10&forwardedSampleMask == 0
}

// checkForwarded logs once when r carries a forwarded header from a loopback
// or private peer and one of the keys it is charged to is that peer's
// address: a proxy stands in front of the server and nothing trusts it, so
// every client behind it shares its bucket.
func (l *Limiter) checkForwarded(r *http.Request, reqs []core.Request) {
	var name string
	for _, h := range forwardedHeaders {
		if len(r.Header[h]) > 0 {
			name = h
			break
		}
	}
	if name == "" {
		return
	}
	peer, _, ok := parseIPEntryHost(r.RemoteAddr)
	if !ok {
		return
	}
	var kind string
	switch {
	case peer.IsLoopback():
		kind = "loopback"
	case peer.IsPrivate():
		kind = "private"
	default:
		return
	}
	var fwd forwardedSet
	fwd.read(r)
	for i := range reqs {
		budget := maxKeyLooks
		if keyHoldsPeer(reqs[i].Key, peer, &fwd, &budget, 0) {
			l.logOnce(logForwarded, msgForwarded, "header", name, "peer", kind)
			return
		}
	}
}

// maxKeyLooks bounds the pieces of one key the forwarded-header check
// examines, and maxKeyLooked the length of a key it looks into at all:
// hostile keys cost it bounded work.
const (
	maxKeyLooks  = 64
	maxKeyLooked = 512
)

// forwardedSet holds the addresses a request's forwarded headers name,
// read as ClientIP reads them: from the right, at most MaxForwardedEntries
// entries and MaxForwardedBytes bytes of each header.
type forwardedSet struct {
	n    int
	addr [len(forwardedHeaders) * MaxForwardedEntries]netip.Addr
}

// read fills s from r's forwarded headers, walked as ClientIP walks them
// (entryWalker), which allocates nothing: entries that are no address are
// passed over.
func (s *forwardedSet) read(r *http.Request) {
	for _, h := range forwardedHeaders {
		lines := r.Header[h]
		w := entryWalker{lines: lines, li: len(lines), forwarded: h == "Forwarded"}
		for {
			a, st := w.next()
			if st == walkOK {
				s.addr[s.n] = a
				s.n++
			} else if st != walkGarbage {
				break // done, or at the walk's bounds
			}
		}
	}
}

// holds reports whether p holds one of the addresses.
func (s *forwardedSet) holds(p netip.Prefix) bool {
	for _, a := range s.addr[:s.n] {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// keyHoldsPeer reports whether the key k is, or holds, a client-IP key of
// peer: its address, or a network containing it, but holding no address
// the forwarded headers name (a trusted proxy's client keyed by a network
// that holds the proxy too, or a request the proxy sent itself). It looks
// at k whole, past its first ':' (a namespace such as "user:", FirstOf's
// index), and at the parts of a Composite key ("len:part" in turn), at
// most 4 levels deep and budget pieces in all; a key longer than
// maxKeyLooked is not looked into. Keys of other shapes may hide the peer,
// and are not warned of.
func keyHoldsPeer(k string, peer netip.Addr, fwd *forwardedSet, budget *int, depth int) bool {
	if len(k) > maxKeyLooked || *budget <= 0 {
		return false
	}
	*budget--
	if keyIsPeer(k, peer, fwd) {
		return true
	}
	if depth == 4 {
		return false
	}
	if i := strings.IndexByte(k, ':'); i > 0 && keyHoldsPeer(k[i+1:], peer, fwd, budget, depth+1) {
		return true
	}
	for rest := k; rest != ""; {
		i := strings.IndexByte(rest, ':')
		if i <= 0 || i > 5 || !digits(rest[:i]) {
			return false
		}
		n, _ := strconv.Atoi(rest[:i]) // at most 5 digits: no error
		if n > len(rest)-i-1 {
			return false
		}
		if keyHoldsPeer(rest[i+1:i+1+n], peer, fwd, budget, depth+1) {
			return true
		}
		rest = rest[i+1+n:]
	}
	return false
}

// digits reports whether s is all decimal digits.
func digits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// keyIsPeer reports whether s is a client-IP key of peer (its address, or
// a network containing it) holding no address of fwd. Only text in the
// exact form of an address or network of peer's family is parsed, so
// nothing is allocated (a failed parse would allocate its error).
func keyIsPeer(s string, peer netip.Addr, fwd *forwardedSet) bool {
	if len(s) < 2 || len(s) > 43 { // "::" to "ffff:…:ffff/128"
		return false
	}
	text, bits := s, ""
	if i := strings.IndexByte(s, '/'); i >= 0 {
		text, bits = s[:i], s[i+1:]
		if !digits(bits) || len(bits) > 3 || len(bits) > 1 && bits[0] == '0' {
			return false
		}
		if n, _ := strconv.Atoi(bits); n > peer.BitLen() {
			return false
		}
	}
	if peer.Is4() && !v4Shaped(text) || peer.Is6() && !v6Shaped(text) {
		return false
	}
	var p netip.Prefix
	if bits == "" {
		a, err := netip.ParseAddr(text)
		if err != nil || a != peer {
			return false
		}
		p = netip.PrefixFrom(a, a.BitLen())
	} else {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil || !p.Contains(peer) {
			return false
		}
	}
	return !fwd.holds(p)
}

// WithLogger sets the logger the one-time warnings go to: forwarded headers
// from a loopback or private peer while no proxy is trusted, a [Route] layer
// that finds no route pattern, a layer whose key is absent on every one of
// its first [AbsentKeyLogAfter] requests, a layer whose Routes match none
// of its first [UnmatchedRoutesLogAfter] routed requests, store errors
// served fail-open (those of the in-flight slot store on a line of their
// own), decisions a store's Fallback made, configuration errors met at
// request time, and a failed refund. Each is logged at most once per
// Limiter, at level Warn, and never carries a key or an address in full.
// The default value is slog.Default(); WithLogger(nil) silences them. The
// forwarded-header check examines each of a Limiter's first
// [ForwardedCheckFirst] requests, then about one in 64.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) { c.logger = logger }
}
