package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// This file holds the client-IP machinery: the ClientIP key function and its
// options, the right-to-left forwarded-header walker and address parsing.

var (
	// ErrInvalidClientIP is returned (wrapped) by a [ClientIP] key function
	// when the client address cannot be determined safely: an unparseable
	// RemoteAddr, a garbage entry in the trusted part of a forwarded
	// header, a chain shorter than the configured hop count, or a header
	// too long to walk within the examination limits. It never falls back
	// to another address.
	ErrInvalidClientIP = errors.New("ratelimit: cannot determine client IP")

	// ErrInvalidKeyConfig is returned (wrapped) by [ClientIP] when its
	// options are invalid; [MustClientIP] panics with it.
	ErrInvalidKeyConfig = errors.New("ratelimit: invalid key function configuration")
)

// Limits on the work done for one request on a hostile forwarded header.
const (
	// MaxForwardedEntries is the largest number of non-empty entries of a
	// forwarded header (X-Forwarded-For elements or Forwarded elements,
	// all header lines merged) that [ClientIP] examines, counting from the
	// right. It is also the largest accepted [TrustedHops] count.
	MaxForwardedEntries = 32

	// MaxForwardedBytes is the largest number of bytes of a forwarded
	// header (all lines merged, counting from the right) that [ClientIP]
	// examines. A walk that cannot find the client within these limits
	// fails closed with [ErrInvalidClientIP].
	MaxForwardedBytes = 4096
)

// Request-time errors carry context without allocating, and never echo the
// hostile value itself.
var (
	errBadRemoteAddr    = fmt.Errorf("%w: unparseable RemoteAddr (behind a proxy on a unix socket, use ratelimit.TrustUnixSocketPeer)", ErrInvalidClientIP)
	errUnixNoHeader     = fmt.Errorf("%w: unix socket peer sent no forwarded header", ErrInvalidClientIP)
	errGarbageEntry     = fmt.Errorf("%w: unparseable entry in forwarded header", ErrInvalidClientIP)
	errForwardedTooLong = fmt.Errorf("%w: forwarded header exceeds examination limit", ErrInvalidClientIP)
	errTooFewHops       = fmt.Errorf("%w: forwarded header has fewer entries than trusted hops", ErrInvalidClientIP)
)

// ipHeaderKind says how the configured header is parsed.
type ipHeaderKind uint8

const (
	ipHeaderXFF       ipHeaderKind = iota // X-Forwarded-For: comma-separated addresses
	ipHeaderForwarded                     // RFC 7239 Forwarded: for= parameters
	ipHeaderSingle                        // one address, e.g. X-Real-IP
)

// ipConfig is the parsed configuration of a ClientIP key function.
type ipConfig struct {
	trusted4   []netip.Prefix // trusted IPv4 prefixes (v4-mapped ones converted)
	trusted6   []netip.Prefix // trusted IPv6 prefixes
	hasTrusted bool           // TrustedProxies/TrustedProxyCIDRs was given
	hops       int            // TrustedHops; 0 means not set
	unixPeer   bool           // TrustUnixSocketPeer was given
	trustAll   bool           // AllowTrustAll was given
	header     string         // canonical header name; "" means not set
	kind       ipHeaderKind
	v4Bits     int
	v6Bits     int
}

// IPOption configures [ClientIP].
type IPOption func(*ipConfig) error

// TrustedProxies declares the networks of the reverse proxies and load
// balancers in front of the server. A forwarded header is consulted only when
// the connecting peer (r.RemoteAddr) is inside one of them, and the header is
// walked right to left past every address inside them. IPv4-mapped and
// NAT64 IPv6 prefixes (::ffff:10.0.0.0/104, 64:ff9b::10.0.0.0/104) are
// treated as the IPv4 prefixes they hold.
// Several calls accumulate. An invalid prefix, or one with host bits set
// (10.1.2.3/8), is a configuration error; so are prefixes that together
// cover every address of a family, unless [AllowTrustAll] is given.
func TrustedProxies(prefixes ...netip.Prefix) IPOption {
	return func(c *ipConfig) error {
		for _, p := range prefixes {
			if !p.IsValid() {
				return fmt.Errorf("%w: invalid trusted proxy prefix %v", ErrInvalidKeyConfig, p)
			}
			if err := canonicalPrefix(p); err != nil {
				return fmt.Errorf("%w: trusted proxy %v: %v", ErrInvalidKeyConfig, p, err)
			}
			c.addTrusted(p)
		}
		c.hasTrusted = true
		return nil
	}
}

// TrustUnixSocketPeer trusts a peer connected over a unix socket (a
// RemoteAddr that is empty, "@", or a socket path, as net/http reports it
// for a unix listener) as a proxy: the client is then taken from the
// forwarded header it sends, walked as with [TrustedProxies] (or
// [TrustedHops]). A unix socket is reachable only by local processes, so
// this is the setup for a reverse proxy such as nginx on the same host. A
// request from a unix peer without the header is a key error. Peers with an
// IP address are trusted only if [TrustedProxies] says so.
func TrustUnixSocketPeer() IPOption {
	return func(c *ipConfig) error {
		c.unixPeer = true
		return nil
	}
}

// AllowTrustAll permits trusted proxy prefixes that together cover every
// IPv4 or every IPv6 address (0.0.0.0/0, ::/0, or halves that add up to it),
// which [ClientIP] otherwise refuses: trusting every peer lets every client
// choose its own key with a forged header. Use it only when the server
// cannot be reached except through proxies that overwrite the header.
func AllowTrustAll() IPOption {
	return func(c *ipConfig) error {
		c.trustAll = true
		return nil
	}
}

// TrustedProxyCIDRs is [TrustedProxies] with prefixes in CIDR notation
// ("10.0.0.0/8", "2001:db8::/32"). A bare address ("192.0.2.1") means that
// single host. An unparseable entry, or one with host bits set, is a
// configuration error.
func TrustedProxyCIDRs(cidrs ...string) IPOption {
	return func(c *ipConfig) error {
		for _, s := range cidrs {
			p, err := parseTrustedCIDR(s)
			if err == nil {
				err = canonicalPrefix(p)
			}
			if err != nil {
				return fmt.Errorf("%w: trusted proxy %q: %v", ErrInvalidKeyConfig, s, err)
			}
			c.addTrusted(p)
		}
		c.hasTrusted = true
		return nil
	}
}

// TrustedHops selects the hop-count strategy: exactly n reverse proxies stand
// in front of the server, each appending the address of its own peer to the
// forwarded header, so the client is the n-th entry from the right (n == 1:
// the rightmost). n must be between 1 and [MaxForwardedEntries]. A chain with
// fewer than n entries, or a garbage entry among the last n, is a key error.
//
// Without [TrustedProxies] every peer is assumed to be the first of those
// proxies: use it only when the server cannot be reached except through
// them. With TrustedProxies as well, the header is consulted only when the
// peer is inside one of the prefixes (the prefixes are not used to walk the
// header), which is the safer setup. With [TrustUnixSocketPeer] (and no
// TrustedProxies), only a unix socket peer is a proxy: a peer with an IP
// address is the client.
func TrustedHops(n int) IPOption {
	return func(c *ipConfig) error {
		if n < 1 || n > MaxForwardedEntries {
			return fmt.Errorf("%w: TrustedHops %d out of range 1..%d", ErrInvalidKeyConfig, n, MaxForwardedEntries)
		}
		c.hops = n
		return nil
	}
}

// FromHeader chooses the header a trusted peer supplies the client address
// in. "X-Forwarded-For" (the default) and "Forwarded" (RFC 7239, its for=
// parameters) are lists walked right to left; any other name is a single-IP
// header such as "X-Real-IP", "CF-Connecting-IP" or "True-Client-IP", whose
// last line is used (a proxy that appends its line after a forged one wins);
// a value that is not one address is a key error, and a missing header means
// the trusted peer itself is the client. In a Forwarded element, a
// quoted-pair (a backslash) or a comma inside a quoted-string (a host= value
// the client chose, say) is a key error too: the element cannot be read
// without trusting text the client wrote. FromHeader requires [TrustedProxies], [TrustedHops] or [TrustUnixSocketPeer];
// with TrustedHops a single-IP header allows only TrustedHops(1). A name that
// is empty or not a valid header name (RFC 9110's token) is an error.
func FromHeader(name string) IPOption {
	return func(c *ipConfig) error {
		name = strings.TrimSpace(name)
		if name == "" {
			return fmt.Errorf("%w: FromHeader name is empty", ErrInvalidKeyConfig)
		}
		if !validHeaderName(name) {
			// No request could carry it: every client would be keyed as
			// its proxy.
			return fmt.Errorf("%w: FromHeader: %q is not a valid header name", ErrInvalidKeyConfig, name)
		}
		c.header = http.CanonicalHeaderKey(name)
		if serverMoved(c.header) {
			return fmt.Errorf("%w: FromHeader: net/http's server takes %q out of r.Header, so no request would carry it there", ErrInvalidKeyConfig, c.header)
		}
		switch c.header {
		case "X-Forwarded-For":
			c.kind = ipHeaderXFF
		case "Forwarded":
			c.kind = ipHeaderForwarded
		default:
			c.kind = ipHeaderSingle
		}
		return nil
	}
}

// IPv6Prefix sets the length of the network an IPv6 client is keyed by: a
// subscriber usually holds a /64 or more, so keying by address would let a
// client rotate addresses and escape its quota. The default is 64; bits must
// be between 1 and 128 (128 keys by address).
func IPv6Prefix(bits int) IPOption {
	return func(c *ipConfig) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("%w: IPv6Prefix %d out of range 1..128", ErrInvalidKeyConfig, bits)
		}
		c.v6Bits = bits
		return nil
	}
}

// IPv4Prefix sets the length of the network an IPv4 client is keyed by. The
// default is 32 (keyed by address); bits must be between 1 and 32.
func IPv4Prefix(bits int) IPOption {
	return func(c *ipConfig) error {
		if bits < 1 || bits > 32 {
			return fmt.Errorf("%w: IPv4Prefix %d out of range 1..32", ErrInvalidKeyConfig, bits)
		}
		c.v4Bits = bits
		return nil
	}
}

// ClientIP returns a KeyFunc that keys a request by its client's network.
//
// By default the client is the connecting peer, taken from r.RemoteAddr, and
// no header is read. Forwarded headers are consulted only when the peer is a
// trusted proxy ([TrustedProxies], [TrustedProxyCIDRs]) or in hop-count mode
// ([TrustedHops]). The header ([FromHeader]; X-Forwarded-For by default) is
// then read as one list, all its lines merged in order, and walked right to
// left: entries inside a trusted prefix are skipped and the first untrusted
// entry is the client. If every entry is trusted, the leftmost is the client;
// with no header at all, the trusted peer itself is. (With [TrustedHops] the
// client is instead the n-th entry from the right.) An unparseable entry met
// before the client is found (including RFC 7239 obfuscated identifiers such
// as "unknown" or "_hidden") fails closed with [ErrInvalidClientIP]: the key
// function never falls back to the leftmost entry, the peer, or "". Empty
// list elements are ignored, as RFC 9110 requires.
//
// Addresses may carry a port ("192.0.2.1:5678", "[2001:db8::1]:443"); zones
// ("fe80::1%eth0") are dropped and IPv4-mapped IPv6 addresses
// ("::ffff:192.0.2.1") are treated as the IPv4 addresses they are. The key is
// canonical: an IPv4 client is keyed by its address ("192.0.2.1"), or by its
// network when [IPv4Prefix] is below 32 ("192.0.2.0/24"); an IPv6 client by
// its network, /64 by default ("2001:db8:1:2::/64", see [IPv6Prefix]), or its
// address at /128. An IPv4 client shares no bucket with IPv6 clients,
// whether it connects over IPv4, as an IPv4-mapped address, or through a
// stateless IPv4/IPv6 translator using the well-known prefix 64:ff9b::/96
// (RFC 6052): an address there is read as the IPv4 address it embeds, as
// that peer would be over IPv4, for its key and for trust (a trusted
// prefix written in the 64:ff9b:: form is read as the IPv4 prefix it
// holds). A translator using a network-specific prefix is the exception:
// its addresses are keyed as an IPv6 network like any other, so all its
// IPv4 clients share one bucket unless [IPv6Prefix] is 128 (or a key
// function of your own maps them).
//
// The work per request is bounded: at most [MaxForwardedEntries] entries and
// [MaxForwardedBytes] bytes of the header are examined, from the right; if the
// client cannot be found within them the key function fails closed. A
// successful call typically allocates only the key string.
//
// # Verify before going live
//
// Every header a client sends can be forged. Never trust X-Forwarded-For,
// Forwarded, X-Real-IP or any other client-IP header unless the peer that
// sent it is a proxy you control or pay for: a server reachable directly from
// the internet must use the default (RemoteAddr only). Behind a load
// balancer, pass its network to [TrustedProxies] (e.g. the VPC range of an AWS
// ALB, "10.0.0.0/8"); behind a CDN, pass the CDN's published ranges as well,
// or use its single-IP header (FromHeader("CF-Connecting-IP") for Cloudflare)
// with the CDN's ranges as the trusted proxies, and make sure the origin
// rejects connections that do not come from the CDN. Some CDNs pass through a
// client-supplied True-Client-IP or Fastly-Client-IP unless configured not to.
// Then check in staging: log the key for requests from a known address,
// directly and through every proxy path, and see that it is your address, not
// a proxy's (which would put all clients in one bucket) and not a value you
// put in a forged header.
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c := &ipConfig{v4Bits: 32, v6Bits: 64}
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: IPOption %d is nil", ErrInvalidKeyConfig, i)
		}
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	if c.header != "" && !c.hasTrusted && c.hops == 0 && !c.unixPeer {
		return nil, fmt.Errorf("%w: FromHeader(%q) requires TrustedProxies, TrustedHops or TrustUnixSocketPeer", ErrInvalidKeyConfig, c.header)
	}
	if c.kind == ipHeaderSingle && c.hops > 1 {
		return nil, fmt.Errorf("%w: single-IP header %q cannot be used with TrustedHops(%d)", ErrInvalidKeyConfig, c.header, c.hops)
	}
	if c.header == "" {
		c.header, c.kind = "X-Forwarded-For", ipHeaderXFF
	}
	if !c.trustAll {
		if coversAll(c.trusted4, 32) {
			return nil, fmt.Errorf("%w: the trusted proxies cover every IPv4 address, so any client could choose its key with a forged header; list your proxies' networks, or add AllowTrustAll if no client can reach the server directly", ErrInvalidKeyConfig)
		}
		if coversAll(c.trusted6, 128) {
			return nil, fmt.Errorf("%w: the trusted proxies cover every IPv6 address, so any client could choose its key with a forged header; list your proxies' networks, or add AllowTrustAll if no client can reach the server directly", ErrInvalidKeyConfig)
		}
	}
	if !c.hasTrusted && c.hops == 0 && !c.unixPeer {
		return c.keyPeerOnly, nil
	}
	return c.key, nil
}

// canonicalPrefix reports a prefix with host bits set ("10.1.2.3/8"), which
// usually means a typo: the error says which network it stands for.
func canonicalPrefix(p netip.Prefix) error {
	if m := p.Masked(); m != p {
		return fmt.Errorf("host bits set: did you mean %v (or %v/%d for the single host)?", m, p.Addr(), p.Addr().BitLen())
	}
	return nil
}

// coversAll reports whether the union of ps (all of one family, masked)
// covers the whole address space of that family (bits 32 or 128).
func coversAll(ps []netip.Prefix, bits int) bool {
	if len(ps) == 0 {
		return false
	}
	var root netip.Prefix
	if bits == 32 {
		root = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	} else {
		root = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return covers(ps, root)
}

// covers reports whether the union of ps covers q. Its recursion descends
// only into halves that some prefix of ps lies strictly inside, so its work
// is bounded by len(ps) times the address length.
func covers(ps []netip.Prefix, q netip.Prefix) bool {
	inside := false
	for _, p := range ps {
		if p.Bits() <= q.Bits() && p.Contains(q.Addr()) {
			return true
		}
		if p.Bits() > q.Bits() && q.Contains(p.Addr()) {
			inside = true
		}
	}
	if !inside || q.Bits() == q.Addr().BitLen() {
		return false
	}
	lo := netip.PrefixFrom(q.Addr(), q.Bits()+1)
	hiAddr := q.Addr().AsSlice()
	bit := q.Bits()
	hiAddr[bit/8] |= 0x80 >> (bit % 8)
	hi, _ := netip.AddrFromSlice(hiAddr)
	return covers(ps, lo) && covers(ps, netip.PrefixFrom(hi, q.Bits()+1))
}

// isUnixRemote reports whether RemoteAddr is what net/http reports for a
// unix socket peer: empty, "@" (an unnamed or abstract socket) or a path.
func isUnixRemote(s string) bool {
	return s == "" || s[0] == '@' || s[0] == '/'
}

// MustClientIP is like [ClientIP] but panics if the options are invalid. It is
// meant for start-up code, where a bad configuration should stop the program.
func MustClientIP(opts ...IPOption) KeyFunc {
	fn, err := ClientIP(opts...)
	if err != nil {
		panic(err)
	}
	return fn
}

func (c *ipConfig) addTrusted(p netip.Prefix) {
	p = prefixAsRead(p.Masked())
	if p.Addr().Is4() {
		c.trusted4 = append(c.trusted4, p)
	} else {
		c.trusted6 = append(c.trusted6, p)
	}
}

// isTrusted reports whether a (unmapped, zone-free) is inside a trusted prefix.
func (c *ipConfig) isTrusted(a netip.Addr) bool {
	list := c.trusted6
	if a.Is4() {
		list = c.trusted4
	}
	for _, p := range list {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// nat64Embedded returns the IPv4 address embedded in a, when a is in the
// well-known prefix of IPv4/IPv6 translators, 64:ff9b::/96 (RFC 6052): an
// IPv4 peer of an IPv6-only server behind a stateless translator (RFC
// 7755) reaches it as 64:ff9b::192.0.2.1, and is read as 192.0.2.1, as it
// would be over IPv4, for trust as for keys, so that IPv4 clients never
// share the translator's /64 (and only the translator sends from there).
// Network-specific prefixes are not recognised.
func nat64Embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return a, false
	}
	b := a.As16()
	if b[0] != 0x00 || b[1] != 0x64 || b[2] != 0xff || b[3] != 0x9b || [8]byte(b[4:12]) != [8]byte{} {
		return a, false
	}
	return netip.AddrFrom4([4]byte(b[12:16])), true
}

// prefixAsRead returns p as the addresses it holds are read from requests
// (see parseIPEntryHost): an IPv4-mapped (::ffff:0:0/96) or NAT64
// (64:ff9b::/96) prefix of at least /96 as the IPv4 prefix it holds.
func prefixAsRead(p netip.Prefix) netip.Prefix {
	if p.Bits() < 96 {
		return p
	}
	a := p.Addr()
	if a.Is4In6() {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if v4, ok := nat64Embedded(a); ok {
		return netip.PrefixFrom(v4, p.Bits()-96)
	}
	return p
}

// keyOf returns the canonical key of a client address.
func (c *ipConfig) keyOf(a netip.Addr) string { return c.keyOfText(a, "") }

// keyOfText is keyOf for an address that appeared in a request as text:
// when the key is the whole address and text is already its canonical
// form, the key is text itself, and nothing is allocated.
func (c *ipConfig) keyOfText(a netip.Addr, text string) string {
	bits := c.v6Bits
	if a.Is4() {
		bits = c.v4Bits
	}
	if bits == a.BitLen() {
		if bits == 32 && text != "" && strings.IndexByte(text, ':') < 0 {
			// IPv4 text that netip parsed as IPv4 is canonical already:
			// four decimal octets without leading zeros.
			return text
		}
		var buf [64]byte
		b := a.AppendTo(buf[:0])
		if string(b) == text {
			return text
		}
		return string(b)
	}
	// Prefix cannot fail here: a is valid and zone-free, bits in range.
	p, _ := a.Prefix(bits)
	var buf [64]byte // longest: "ffff:…:ffff/128" is 43 bytes
	return string(p.AppendTo(buf[:0]))
}

// keyPeerOnly is key for a ClientIP that believes no forwarding header:
// the key of the peer's address.
func (c *ipConfig) keyPeerOnly(r *http.Request) (string, error) {
	s := r.RemoteAddr
	if a, n, ok := parseIPv4Port(s); ok {
		if c.v4Bits == 32 {
			// The form net/http gives an IPv4 peer: its text is the
			// canonical address, and the key is the whole address.
			return s[:n], nil
		}
		return c.keyOfText(a, s[:n]), nil
	}
	peer, host, ok := parseIPEntryHostFull(s)
	if !ok {
		return "", errBadRemoteAddr
	}
	return c.keyOfText(peer, host), nil
}

func (c *ipConfig) key(r *http.Request) (string, error) {
	peer, host, ok := parseIPEntryHost(r.RemoteAddr)
	if !ok {
		if !c.unixPeer || !isUnixRemote(r.RemoteAddr) {
			return "", errBadRemoteAddr
		}
		return c.keyUnix(r)
	}
	if c.hasTrusted && !c.isTrusted(peer) || !c.hasTrusted && (c.hops == 0 || c.unixPeer) {
		// The peer is the client; nothing it sent is believed.
		return c.keyOfText(peer, host), nil
	}
	lines := r.Header[c.header]
	var (
		client netip.Addr
		err    error
	)
	switch {
	case c.kind == ipHeaderSingle:
		client, err = peer, nil
		if n := len(lines); n > 0 && strings.TrimSpace(lines[n-1]) != "" {
			// A single-IP header is set by the trusted proxy; if the
			// client also sent one, the proxy's is the last line.
			a, ok := parseIPEntry(lines[n-1])
			if !ok {
				return "", errGarbageEntry
			}
			client = a
		}
	case c.hops > 0:
		client, err = c.walkHops(lines)
	default:
		client, err = c.walkTrusted(lines, peer)
	}
	if err != nil {
		return "", err
	}
	return c.keyOf(client), nil
}

// keyUnix is key for a trusted unix socket peer: the client is in the
// forwarded header, which must be present.
func (c *ipConfig) keyUnix(r *http.Request) (string, error) {
	lines := r.Header[c.header]
	var (
		client netip.Addr
		err    error
	)
	switch {
	case len(lines) == 0:
		return "", errUnixNoHeader
	case c.kind == ipHeaderSingle:
		a, ok := parseIPEntry(lines[len(lines)-1])
		if !ok {
			return "", errGarbageEntry
		}
		client = a
	case c.hops > 0:
		client, err = c.walkHops(lines)
	default:
		client, err = c.walkTrusted(lines, netip.Addr{})
		if err == nil && !client.IsValid() {
			err = errUnixNoHeader
		}
	}
	if err != nil {
		return "", err
	}
	return c.keyOf(client), nil
}

// walkTrusted walks the merged header list right to left, skipping trusted
// entries. peer is trusted and stands right of every entry.
func (c *ipConfig) walkTrusted(lines []string, peer netip.Addr) (netip.Addr, error) {
	w := entryWalker{lines: lines, li: len(lines), forwarded: c.kind == ipHeaderForwarded}
	leftmost := peer
	for {
		a, st := w.next()
		switch st {
		case walkDone:
			return leftmost, nil // every entry trusted
		case walkGarbage:
			return netip.Addr{}, errGarbageEntry
		case walkLimit:
			return netip.Addr{}, errForwardedTooLong
		}
		if !c.isTrusted(a) {
			return a, nil
		}
		leftmost = a
	}
}

// walkHops returns the c.hops-th entry from the right.
func (c *ipConfig) walkHops(lines []string) (netip.Addr, error) {
	w := entryWalker{lines: lines, li: len(lines), forwarded: c.kind == ipHeaderForwarded}
	for i := 1; ; i++ {
		a, st := w.next()
		switch st {
		case walkDone:
			return netip.Addr{}, errTooFewHops
		case walkGarbage:
			return netip.Addr{}, errGarbageEntry
		case walkLimit:
			return netip.Addr{}, errForwardedTooLong
		}
		if i == c.hops {
			return a, nil
		}
	}
}

type walkStatus uint8

const (
	walkOK      walkStatus = iota // an address was returned
	walkDone                      // no entries left
	walkGarbage                   // the next entry is not an address
	walkLimit                     // the examination limits were reached
)

// entryWalker yields the non-empty entries of a list header right to left,
// across all of its lines, within MaxForwardedEntries and MaxForwardedBytes.
//
// The parsing is written here rather than taken from
// github.com/realclientip/realclientip-go: that library splits and parses the
// whole header on every request (unbounded work and an allocation per entry on
// a hostile 1 MB header), reports "garbage", "all trusted" and "absent" alike
// as "", and returns strings that would have to be parsed again. Walking
// from the right with net/netip bounds the work, distinguishes the cases the
// fail-closed rules need, and allocates nothing.
//
// Entries are split at every comma, quoted or not. For X-Forwarded-For that is
// the grammar; for Forwarded it means a quoted-string cannot hide a comma, so a
// client's unbalanced quote can never swallow the elements a trusted proxy
// appended to its right (an address never contains a comma). A trusted proxy
// may itself quote a value the client chose (its Host, in host=), and a
// quoted-string may hold commas: a Forwarded element cut inside one is
// garbage (see parseForwardedElement), so the request fails closed rather
// than be keyed by an address the client wrote.
type entryWalker struct {
	lines     []string
	li        int    // index of the line being consumed, counting down
	cur       string // unconsumed left part of lines[li]
	started   bool   // cur holds lines[li]
	forwarded bool
	entries   int // non-empty entries examined
	bytes     int // bytes examined
}

func (w *entryWalker) next() (netip.Addr, walkStatus) {
	for {
		if !w.started {
			if w.li == 0 {
				return netip.Addr{}, walkDone
			}
			w.li--
			w.cur, w.started = w.lines[w.li], true
		}
		// Only the part within the byte budget may be examined: search for
		// the comma in the last budget+1 bytes only.
		budget := MaxForwardedBytes - w.bytes
		window := min(max(len(w.cur)-budget-1, 0), len(w.cur))
		var elem string
		i := strings.LastIndexByte(w.cur[window:], ',')
		if i >= 0 {
			i += window
		}
		if i < 0 {
			if len(w.cur) > budget {
				return netip.Addr{}, walkLimit
			}
			elem = w.cur
			w.bytes += len(w.cur) + 1 // the line boundary acts as a comma
			w.started = false
		} else {
			if len(w.cur)-i > budget {
				return netip.Addr{}, walkLimit
			}
			elem = w.cur[i+1:]
			w.bytes += len(w.cur) - i
			w.cur = w.cur[:i]
		}
		elem = trimListOWS(elem)
		if elem == "" {
			continue
		}
		if w.entries == MaxForwardedEntries {
			return netip.Addr{}, walkLimit
		}
		w.entries++
		var (
			a  netip.Addr
			ok bool
		)
		if w.forwarded {
			a, ok = parseForwardedElement(elem)
		} else {
			a, ok = parseIPEntry(elem)
		}
		if !ok {
			return netip.Addr{}, walkGarbage
		}
		return a, walkOK
	}
}

// parseForwardedElement returns the address in the for= parameter of one
// RFC 7239 forwarded-element ("for=192.0.2.60;proto=http;by=203.0.113.43").
// A missing or repeated for=, a quoted-pair, or a non-address node
// ("unknown", "_hidden") makes the element garbage, and so does an element
// with a backslash or an odd number of quotes: the walker splits at every
// comma, and an element cut inside a quoted-string (a host= value the
// client chose, holding ",for=6.6.6.6;") always has an odd number of quotes
// once quoted-pairs are refused. Parameters are split at semicolons outside
// quoted-strings, so a quoted value cannot hold a for= either.
func parseForwardedElement(elem string) (netip.Addr, bool) {
	if strings.IndexByte(elem, '\\') >= 0 || strings.Count(elem, `"`)%2 != 0 {
		return netip.Addr{}, false
	}
	val, ok := forwardedFor(elem)
	if !ok {
		return netip.Addr{}, false
	}
	return parseIPEntry(val)
}

// forwardedFor returns the value of the for= parameter of one RFC 7239
// forwarded-element, unquoted; false for a missing or repeated for=, or a
// quoted-pair. elem has balanced quotes and no backslash
// (parseForwardedElement): its parameters are split at the semicolons
// outside quoted-strings.
func forwardedFor(elem string) (string, bool) {
	var (
		val   string
		found bool
	)
	for elem != "" {
		pair := elem
		if i := semicolonOutsideQuotes(elem); i >= 0 {
			pair, elem = elem[:i], elem[i+1:]
		} else {
			elem = ""
		}
		pair = trimListOWS(pair)
		eq := strings.IndexByte(pair, '=')
		if eq < 0 || !strings.EqualFold(trimListOWS(pair[:eq]), "for") {
			continue
		}
		if found {
			return "", false
		}
		val, found = trimListOWS(pair[eq+1:]), true
	}
	if !found {
		return "", false
	}
	if len(val) > 0 && val[0] == '"' {
		if len(val) < 2 || val[len(val)-1] != '"' {
			return "", false
		}
		val = val[1 : len(val)-1]
		if strings.ContainsAny(val, "\\\"") {
			return "", false
		}
	}
	return val, true
}

// semicolonOutsideQuotes returns the index of the first ';' of s outside a
// quoted-string, or -1. s has no quoted-pairs.
func semicolonOutsideQuotes(s string) int {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case ';':
			if !quoted {
				return i
			}
		}
	}
	return -1
}

// maxIPEntryLen bounds the text parseIPEntry looks at: the longest address
// with brackets, port and a generous zone is well under it.
const maxIPEntryLen = 128

// parseIPEntry parses one address as found in RemoteAddr or a forwarded
// header: "192.0.2.1", "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]",
// "[2001:db8::1]:443", optionally with a zone. The result is unmapped and
// zone-free. The unspecified addresses (0.0.0.0, ::) are rejected: no proxy
// reports a peer at them.
func parseIPEntry(s string) (netip.Addr, bool) {
	a, _, ok := parseIPEntryHost(s)
	return a, ok
}

// parseIPEntryHost is parseIPEntry that also returns the address as it
// appeared in s (without brackets and port).
func parseIPEntryHost(s string) (netip.Addr, string, bool) {
	if a, n, ok := parseIPv4Port(s); ok {
		return a, s[:n], true
	}
	return parseIPEntryHostFull(s)
}

// parseIPv4Port parses, in one pass, the form net/http's server gives
// RemoteAddr for an IPv4 peer: an address in dotted decimal without
// leading zeros, optionally followed by a port that validNodePort accepts.
// It returns the address and the length of its text. ok is false for
// anything else, including forms parseIPEntryHostFull accepts (surrounding
// white space, IPv6), which it then parses; whatever parseIPv4Port
// accepts, parseIPEntryHostFull accepts with the same result.
func parseIPv4Port(s string) (a netip.Addr, n int, ok bool) {
	var ip [4]byte
	i := 0
	for f := range 4 {
		if f > 0 {
			if i == len(s) || s[i] != '.' {
				return netip.Addr{}, 0, false
			}
			i++
		}
		start, v := i, 0
		for i < len(s) && i-start < 3 && s[i]-'0' <= 9 {
			v = v*10 + int(s[i]-'0')
			i++
		}
		if i == start || v > 255 || s[start] == '0' && i-start > 1 {
			return netip.Addr{}, 0, false
		}
		ip[f] = byte(v)
	}
	if i < len(s) && !validNodePort(s[i:], false) {
		return netip.Addr{}, 0, false
	}
	a = netip.AddrFrom4(ip)
	if a.IsUnspecified() {
		return netip.Addr{}, 0, false
	}
	return a, i, true
}

// parseIPEntryHostFull is parseIPEntryHost for every form parseIPEntry
// accepts.
func parseIPEntryHostFull(s string) (netip.Addr, string, bool) {
	if len(s) > maxIPEntryLen {
		return netip.Addr{}, "", false
	}
	s = trimListOWS(s)
	if s == "" {
		return netip.Addr{}, "", false
	}
	var host string
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || !validNodePort(s[end+1:], true) {
			return netip.Addr{}, "", false
		}
		host = s[1:end]
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// Exactly one colon: IPv4 with a port.
		if !validNodePort(s[i:], false) {
			return netip.Addr{}, "", false
		}
		host = s[:i]
	} else {
		host = s // IPv4, or IPv6 without brackets (and so without a port)
	}
	addr := host
	if i := strings.IndexByte(host, '%'); i >= 0 {
		addr = host[:i] // the zone, which ParseAddr checks
	}
	if !v4Shaped(addr) && !v6Shaped(addr) {
		return netip.Addr{}, "", false // what ParseAddr would refuse, without its error's allocation
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, "", false
	}
	if s[0] == '[' && a.Is4() {
		return netip.Addr{}, "", false // brackets are for IPv6 only
	}
	a = a.WithZone("").Unmap()
	if v4, ok := nat64Embedded(a); ok {
		a = v4
	}
	if a.IsUnspecified() {
		return netip.Addr{}, "", false
	}
	return a, host, true
}

// validNodePort reports whether s is "" (if empty is allowed) or ":" followed by
// a decimal port of at most five digits or an RFC 7239 obfuscated port
// ("_" followed by ALPHA / DIGIT / "." / "_" / "-").
func validNodePort(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	if s[0] != ':' || len(s) < 2 || len(s) > 33 {
		return false
	}
	p := s[1:]
	if p[0] == '_' {
		for i := 1; i < len(p); i++ {
			ch := p[i]
			if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_' || ch == '-') {
				return false
			}
		}
		return len(p) > 1
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// parseTrustedCIDR parses "10.0.0.0/8" or a bare address (a single-host prefix).
func parseTrustedCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.IndexByte(s, '/') >= 0 {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errors.New("zones are not allowed")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// trimListOWS trims HTTP optional whitespace (spaces and tabs).
func trimListOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// v4Shaped reports whether s is a dotted-decimal IPv4 address as
// netip.ParseAddr reads it: four numbers of 0 to 255, without leading
// zeros.
func v4Shaped(s string) bool {
	parts, n, digitsIn := 0, 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if digitsIn == 0 || n > 255 || digitsIn > 1 && s[i-digitsIn] == '0' {
				return false
			}
			parts++
			n, digitsIn = 0, 0
			continue
		}
		c := s[i]
		if c < '0' || c > '9' || digitsIn == 3 {
			return false
		}
		n, digitsIn = n*10+int(c-'0'), digitsIn+1
	}
	return parts == 4
}

// v6Shaped reports whether s is an IPv6 address as netip.ParseAddr reads
// it (without a zone): groups of 1 to 4 hex digits, at most one "::", and
// an optional dotted IPv4 address for the last two groups.
func v6Shaped(s string) bool {
	dbl := strings.Index(s, "::")
	if dbl >= 0 && strings.Contains(s[dbl+1:], "::") {
		return false // two "::", or ":::"
	}
	if len(s) < 2 || s[0] == ':' && dbl != 0 || s[len(s)-1] == ':' && dbl != len(s)-2 {
		return false
	}
	groups, n := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ':':
			if n > 0 {
				groups++
			}
			n = 0
		case c == '.':
			j := strings.LastIndexByte(s[:i], ':')
			if !v4Shaped(s[j+1:]) {
				return false
			}
			groups += 2
			n = 0
			i = len(s)
		case '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F':
			if n++; n > 4 {
				return false
			}
		default:
			return false
		}
	}
	if n > 0 {
		groups++
	}
	if dbl >= 0 {
		return groups <= 7
	}
	return groups == 8
}
