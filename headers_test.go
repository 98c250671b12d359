package ratelimit_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// sfParam is one parameter of a Structured Field item: an Integer or a Byte
// Sequence (the only kinds the IETF RateLimit fields use here).
type sfParam struct {
	key   string
	isInt bool
	n     int64
	bytes []byte
}

// sfItem is one member of a Structured Field List whose items are Strings.
type sfItem struct {
	name   string
	params []sfParam
}

func (it sfItem) param(key string) (sfParam, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p, true
		}
	}
	return sfParam{}, false
}

// sfParseList is a strict RFC 9651 List parser for lists of String items
// with Integer or Byte Sequence parameters. It rejects every other member
// kind, inner lists, duplicate parameter keys and trailing garbage.
func sfParseList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var items []sfItem
	if p.eof() {
		return nil, fmt.Errorf("empty list")
	}
	for {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skipOWS()
		if p.eof() {
			return items, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return nil, fmt.Errorf("trailing comma")
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool { return p.i >= len(p.s) }

func (p *sfParser) skipSP() {
	for !p.eof() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	var it sfItem
	if p.eof() || p.s[p.i] != '"' {
		return it, fmt.Errorf("at %d: item is not a String", p.i)
	}
	p.i++
	var b strings.Builder
	for {
		if p.eof() {
			return it, fmt.Errorf("unterminated string")
		}
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.eof() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return it, fmt.Errorf("bad escape")
			}
			b.WriteByte(p.s[p.i])
			p.i++
			continue
		case c == '"':
			it.name = b.String()
		case c < 0x20 || c > 0x7e:
			return it, fmt.Errorf("non-printable byte %#x in string", c)
		default:
			b.WriteByte(c)
			continue
		}
		break
	}
	seen := map[string]bool{}
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return it, err
		}
		if seen[key] {
			return it, fmt.Errorf("duplicate parameter %q", key)
		}
		seen[key] = true
		if p.eof() || p.s[p.i] != '=' {
			return it, fmt.Errorf("parameter %q without value", key)
		}
		p.i++
		prm, err := p.bareIntOrBytes()
		if err != nil {
			return it, fmt.Errorf("parameter %q: %v", key, err)
		}
		prm.key = key
		it.params = append(it.params, prm)
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.eof() || !(p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: bad key start", p.i)
	}
	for !p.eof() {
		c := p.s[p.i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*' {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareIntOrBytes() (sfParam, error) {
	if p.eof() {
		return sfParam{}, fmt.Errorf("missing value")
	}
	if p.s[p.i] == ':' {
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return sfParam{}, fmt.Errorf("unterminated byte sequence")
		}
		enc := p.s[p.i+1 : p.i+1+end]
		b, err := base64.StdEncoding.Strict().DecodeString(enc)
		if err != nil {
			return sfParam{}, err
		}
		p.i += end + 2
		return sfParam{bytes: b}, nil
	}
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := 0
	for !p.eof() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
		digits++
	}
	if digits == 0 || digits > 15 {
		return sfParam{}, fmt.Errorf("integer with %d digits", digits)
	}
	if !p.eof() && p.s[p.i] == '.' {
		return sfParam{}, fmt.Errorf("decimal, want integer")
	}
	n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
	if err != nil {
		return sfParam{}, err
	}
	return sfParam{isInt: true, n: n}, nil
}

// sfSerialize writes items back in the canonical form the middleware uses.
func sfSerialize(items []sfItem) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(it.name))
		for _, p := range it.params {
			b.WriteString(";" + p.key + "=")
			if p.isInt {
				b.WriteString(strconv.FormatInt(p.n, 10))
			} else {
				b.WriteString(":" + base64.StdEncoding.EncodeToString(p.bytes) + ":")
			}
		}
	}
	return b.String()
}

// mustParseSF parses a header value and checks that it round-trips.
func mustParseSF(t testing.TB, v string) []sfItem {
	t.Helper()
	items, err := sfParseList(v)
	if err != nil {
		t.Fatalf("parse %q: %v", v, err)
	}
	if back := sfSerialize(items); back != v {
		t.Fatalf("round trip: got %q, want %q", back, v)
	}
	return items
}

func TestSFParserRejects(t *testing.T) {
	bad := []string{
		``, `per-ip;q=1`, `"a";q=1.5`, `"a";q=1234567890123456`, `"a";q`, `"a";Q=1`,
		`"a";q=1,`, `"a" "b"`, `"a";pk=:abc:`, `("a")`, `"a";q=1;q=2`, "\"a\x01\"",
	}
	for _, v := range bad {
		if _, err := sfParseList(v); err == nil {
			t.Errorf("sfParseList(%q) succeeded", v)
		}
	}
	items, err := sfParseList(`"a";q=1;w=2, "b\"c";r=0;pk=:AAEC:`)
	if err != nil || len(items) != 2 || items[1].name != `b"c` {
		t.Fatalf("got %+v, %v", items, err)
	}
}

// TestHeaderValues checks every header of every set and option on the first
// request of a fresh key, and on a refused request.
func TestHeaderValues(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 500_000_000, time.UTC) // half a second past
	epoch := t0.Unix()                                          // 1767225600
	rule := core.PerMinute(10).Named("per-ip")                  // a token every 6s
	type want map[string]string                                 // "" = absent
	cases := []struct {
		name string
		opts []ratelimit.Option
		n    int // requests before the checked one
		code int
		want want
	}{
		{"default", nil, 0, 200, want{
			ratelimit.HeaderRateLimitLimit:     "10",
			ratelimit.HeaderRateLimitRemaining: "9",
			ratelimit.HeaderRateLimitReset:     strconv.FormatInt(epoch+7, 10), // 0.5 + 6 rounded up
			ratelimit.HeaderRateLimitPolicy:    "",
			ratelimit.HeaderRateLimit:          "",
			ratelimit.HeaderRetryAfter:         "",
		}},
		{"reset-delta", []ratelimit.Option{ratelimit.WithResetDelta()}, 0, 200, want{
			ratelimit.HeaderRateLimitReset: "6",
		}},
		{"ietf", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.IETFHeaders)}, 0, 200, want{
			ratelimit.HeaderRateLimitLimit:  "",
			ratelimit.HeaderRateLimitPolicy: `"per-ip";q=10;w=60`,
			ratelimit.HeaderRateLimit:       `"per-ip";r=9;t=6`,
		}},
		{"all", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders)}, 3, 200, want{
			ratelimit.HeaderRateLimitLimit:     "10",
			ratelimit.HeaderRateLimitRemaining: "6",
			ratelimit.HeaderRateLimitReset:     strconv.FormatInt(epoch+25, 10), // 0.5 + 24
			ratelimit.HeaderRateLimitPolicy:    `"per-ip";q=10;w=60`,
			ratelimit.HeaderRateLimit:          `"per-ip";r=6;t=24`,
		}},
		{"none", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.NoHeaders)}, 0, 200, want{
			ratelimit.HeaderRateLimitLimit:  "",
			ratelimit.HeaderRateLimitPolicy: "",
			ratelimit.HeaderRetryAfter:      "",
		}},
		{"refused-all", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders)}, 10, 429, want{
			ratelimit.HeaderRateLimitLimit:     "10",
			ratelimit.HeaderRateLimitRemaining: "0",
			ratelimit.HeaderRateLimitReset:     strconv.FormatInt(epoch+61, 10),
			ratelimit.HeaderRateLimitPolicy:    `"per-ip";q=10;w=60`,
			ratelimit.HeaderRateLimit:          `"per-ip";r=0;t=6`, // t = RetryAfter of the refusing layer
			ratelimit.HeaderRetryAfter:         "6",
		}},
		{"refused-none", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.NoHeaders)}, 10, 429, want{
			ratelimit.HeaderRateLimitRemaining: "",
			ratelimit.HeaderRateLimit:          "",
			ratelimit.HeaderRetryAfter:         "6",
		}},
		{"partition-key", []ratelimit.Option{ratelimit.WithHeaders(ratelimit.IETFHeaders), ratelimit.WithPartitionKey()}, 0, 200, want{
			ratelimit.HeaderRateLimitPolicy: `"per-ip";q=10;w=60;pk=` + mwPK("192.0.2.1"),
			ratelimit.HeaderRateLimit:       `"per-ip";r=9;t=6;pk=` + mwPK("192.0.2.1"),
		}},
		{"partition-key-off-without-ietf", []ratelimit.Option{ratelimit.WithPartitionKey()}, 0, 200, want{
			ratelimit.HeaderRateLimitPolicy:    "",
			ratelimit.HeaderRateLimitRemaining: "9",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: rule}}, tc.opts...)
			e.clk.Set(t0)
			for range tc.n {
				e.do(t, mwReq("192.0.2.1:1234"))
			}
			rec := e.do(t, mwReq("192.0.2.1:1234"))
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d", rec.Code, tc.code)
			}
			for name, v := range tc.want {
				got := rec.Header().Values(name)
				switch {
				case v == "" && len(got) != 0:
					t.Errorf("%s = %q, want absent", name, got)
				case v != "" && (len(got) != 1 || got[0] != v):
					t.Errorf("%s = %q, want [%q]", name, got, v)
				}
			}
			for _, name := range []string{ratelimit.HeaderRateLimitPolicy, ratelimit.HeaderRateLimit} {
				if v := rec.Header().Get(name); v != "" {
					mustParseSF(t, v)
				}
			}
		})
	}
}

// TestXLimitIsCapacity checks that X-RateLimit-Limit is the layer's
// capacity (Policy.Capacity), not its Limit: Burst when set, else Limit for
// a token bucket and a window, 1 for a leaky bucket. RateLimit-Policy's q is
// the Limit in every case.
func TestXLimitIsCapacity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  core.Rule
		limit string
	}{
		{"token-bucket", core.Rule{Name: "tb", Limit: 10, Window: time.Minute}, "10"},
		{"token-bucket-burst", core.Rule{Name: "tb", Limit: 10, Window: time.Minute, Burst: 3}, "3"},
		{"leaky-bucket", core.Rule{Name: "lb", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Minute}, "1"},
		{"leaky-bucket-burst", core.Rule{Name: "lb", Algorithm: core.LeakyBucket, Limit: 10, Window: time.Minute, Burst: 4}, "4"},
		{"fixed-window", core.Rule{Name: "fw", Algorithm: core.FixedWindow, Limit: 10, Window: time.Minute}, "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mwNew(t, []ratelimit.Layer{{Key: ratelimit.Global("k"), Rule: tc.rule}}, ratelimit.WithHeaders(ratelimit.AllHeaders))
			rec := e.do(t, mwReq("192.0.2.1:1"))
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d, want 200", rec.Code)
			}
			if got := rec.Header().Get(ratelimit.HeaderRateLimitLimit); got != tc.limit {
				t.Errorf("X-RateLimit-Limit = %q, want %q", got, tc.limit)
			}
			if got, want := rec.Header().Get(ratelimit.HeaderRateLimitPolicy), mwPolicy(tc.rule); got != want {
				t.Errorf("RateLimit-Policy = %q, want %q", got, want)
			}
		})
	}
}

// mwPK is the expected partition key of a key.
func mwPK(key string) string {
	sum := sha256Sum(key)
	return ":" + base64.StdEncoding.EncodeToString(sum[:12]) + ":"
}

// TestHeadersAreSet checks that the middleware replaces rate-limit headers
// set earlier instead of adding to them.
func TestHeadersAreSet(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Global("g"), Rule: core.PerMinute(10)}},
		ratelimit.WithHeaders(ratelimit.AllHeaders))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, name := range []string{ratelimit.HeaderRateLimitLimit, ratelimit.HeaderRateLimitRemaining,
			ratelimit.HeaderRateLimitReset, ratelimit.HeaderRateLimit, ratelimit.HeaderRateLimitPolicy} {
			w.Header().Add(name, "stale")
		}
		l.Handler(mwOK).ServeHTTP(w, r)
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, mwReq("192.0.2.1:1"))
	for _, name := range []string{ratelimit.HeaderRateLimitLimit, ratelimit.HeaderRateLimitRemaining,
		ratelimit.HeaderRateLimitReset, ratelimit.HeaderRateLimit, ratelimit.HeaderRateLimitPolicy} {
		if got := rec.Header().Values(name); len(got) != 1 || got[0] == "stale" {
			t.Errorf("%s = %q, want one fresh value", name, got)
		}
	}
}

// TestMostRestrictiveLayerSpeaks checks which layer the X- headers describe
// and that every applied layer appears in the IETF fields.
func TestMostRestrictiveLayerSpeaks(t *testing.T) {
	cases := []struct {
		name      string
		a, b      core.Rule
		n         int // requests before the checked one
		code      int
		limit     string
		remaining string
		reset     string
		retry     string
		state     string
	}{
		// a: 1 left after this one, resets in 40s; b: 8 left.
		{"least-remaining", core.PerMinute(3).Named("a"), core.PerMinute(10).Named("b"), 1, 200, "3", "1", "40", "",
			`"a";r=1;t=40, "b";r=8;t=12`},
		// Both have 2 left; b takes longer to reset (a: 1 per 10s; b: 1 per 30s).
		{"tie-longer-reset", core.Rule{Name: "a", Limit: 3, Window: 30 * time.Second}, core.Rule{Name: "b", Limit: 3, Window: 90 * time.Second}, 0, 200, "3", "2", "30", "",
			`"a";r=2;t=10, "b";r=2;t=30`},
		// Both refuse: b's RetryAfter (30s) is longer than a's (10s).
		{"refused-longest-retry", core.Rule{Name: "a", Limit: 1, Window: 10 * time.Second}, core.Rule{Name: "b", Limit: 1, Window: 30 * time.Second}, 1, 429, "1", "0", "30", "30",
			`"a";r=0;t=10, "b";r=0;t=30`},
		// Only a refuses, so a speaks; b was not charged by the refused request.
		{"refused-only-one", core.Rule{Name: "a", Limit: 1, Window: 10 * time.Second}, core.PerMinute(10).Named("b"), 1, 429, "1", "0", "10", "10",
			`"a";r=0;t=10, "b";r=9;t=6`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := mwNew(t, []ratelimit.Layer{
				{Key: ratelimit.Global("k"), Rule: tc.a},
				{Key: ratelimit.Global("k"), Rule: tc.b},
			}, ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithResetDelta())
			for range tc.n {
				e.do(t, mwReq("192.0.2.1:1"))
			}
			rec := e.do(t, mwReq("192.0.2.1:1"))
			h := rec.Header()
			got := fmt.Sprintf("%d limit=%s remaining=%s reset=%s retry=%s", rec.Code,
				h.Get(ratelimit.HeaderRateLimitLimit), h.Get(ratelimit.HeaderRateLimitRemaining),
				h.Get(ratelimit.HeaderRateLimitReset), h.Get(ratelimit.HeaderRetryAfter))
			want := fmt.Sprintf("%d limit=%s remaining=%s reset=%s retry=%s", tc.code, tc.limit, tc.remaining, tc.reset, tc.retry)
			if got != want {
				t.Errorf("got %s, want %s", got, want)
			}
			if got := h.Get(ratelimit.HeaderRateLimit); got != tc.state {
				t.Errorf("RateLimit = %q, want %q", got, tc.state)
			}
			if got, want := h.Get(ratelimit.HeaderRateLimitPolicy), mwPolicy(tc.a)+", "+mwPolicy(tc.b); got != want {
				t.Errorf("RateLimit-Policy = %q, want %q", got, want)
			}
			mustParseSF(t, h.Get(ratelimit.HeaderRateLimit))
		})
	}
}

func mwPolicy(r core.Rule) string {
	w := (r.Window + time.Second - 1) / time.Second
	return fmt.Sprintf("%q;q=%d;w=%d", r.Name, r.Limit, max(int64(w), 1))
}

// TestIETFWindowRounding checks w for sub-second and fractional windows and
// that integers are clamped to 15 digits.
func TestIETFWindowRounding(t *testing.T) {
	cases := []struct {
		rule   core.Rule
		policy string
	}{
		{core.Rule{Name: "ms", Limit: 5, Window: 100 * time.Millisecond}, `"ms";q=5;w=1`},
		{core.Rule{Name: "frac", Limit: 5, Window: 1500 * time.Millisecond}, `"frac";q=5;w=2`},
		{core.Rule{Name: "big", Limit: core.MaxLimit, Window: time.Hour}, `"big";q=999999999999999;w=3600`},
	}
	for _, tc := range cases {
		l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Global("k"), Rule: tc.rule}}, ratelimit.WithHeaders(ratelimit.IETFHeaders))
		rec := httptest.NewRecorder()
		l.Handler(mwOK).ServeHTTP(rec, mwReq("192.0.2.1:1"))
		if got := rec.Header().Get(ratelimit.HeaderRateLimitPolicy); got != tc.policy {
			t.Errorf("%s: RateLimit-Policy = %q, want %q", tc.rule.Name, got, tc.policy)
		}
		items := mustParseSF(t, rec.Header().Get(ratelimit.HeaderRateLimit))
		if r, _ := items[0].param("r"); r.n > 999_999_999_999_999 {
			t.Errorf("r not clamped: %d", r.n)
		}
	}
}

// TestRemainingSharedWithRateLimit checks X-RateLimit-Remaining for values
// beyond the small-number cache, where it shares the RateLimit field's
// digits, with one and with several layers.
func TestRemainingSharedWithRateLimit(t *testing.T) {
	big := core.Rule{Name: "big", Limit: 1 << 40, Window: time.Hour}
	small := core.Rule{Name: "s;r=7", Limit: 1 << 35, Window: time.Hour}
	for _, layers := range [][]ratelimit.Layer{
		{{Key: ratelimit.Global("g"), Rule: big}},
		{{Key: ratelimit.Global("g"), Rule: big}, {Key: ratelimit.Global("h"), Rule: small}},
	} {
		e := mwNew(t, layers, ratelimit.WithHeaders(ratelimit.AllHeaders))
		rec := e.do(t, mwReq("203.0.113.1:1"))
		want := strconv.FormatInt(layers[len(layers)-1].Rule.Limit-1, 10)
		if got := rec.Header().Get(ratelimit.HeaderRateLimitRemaining); got != want {
			t.Errorf("%d layers: X-RateLimit-Remaining %q, want %q (RateLimit: %s)", len(layers), got, want, rec.Header().Get(ratelimit.HeaderRateLimit))
		}
		if rl := rec.Header().Get(ratelimit.HeaderRateLimit); !strings.Contains(rl, ";r="+want+";") {
			t.Errorf("RateLimit %q lacks r=%s", rl, want)
		}
	}
}

// TestRemainingXOnly checks X-RateLimit-Remaining with the X-RateLimit set
// alone, where a value beyond the small-number cache is formatted into the
// block that holds the response's values: at the cache's edge, at 15
// digits, and for the speaking layer of several.
func TestRemainingXOnly(t *testing.T) {
	for _, tc := range []struct {
		limits []int64 // one layer each, per hour
		want   int64   // Remaining after the first request
	}{
		{[]int64{4097}, 4096}, // the cache's last value
		{[]int64{4098}, 4097}, // the first formatted
		{[]int64{1_000_000_000_000_000}, 999_999_999_999_999}, // 15 digits, the most the block holds
		{[]int64{core.MaxLimit}, core.MaxLimit - 1},           // 16: formatted apart
		{[]int64{1 << 40, 123_457}, 123_456},
		{[]int64{123_457, 1 << 40}, 123_456},
	} {
		var layers []ratelimit.Layer
		for i, n := range tc.limits {
			layers = append(layers, ratelimit.Layer{Key: ratelimit.Global(strconv.Itoa(i)), Rule: core.Rule{Name: "r" + strconv.Itoa(i), Limit: n, Window: time.Hour}})
		}
		e := mwNew(t, layers)
		for i := range int64(2) {
			want := strconv.FormatInt(tc.want-i, 10)
			rec := e.do(t, mwReq("203.0.113.1:1"))
			if got := rec.Header().Values(ratelimit.HeaderRateLimitRemaining); len(got) != 1 || got[0] != want {
				t.Errorf("limits %v, request %d: X-RateLimit-Remaining %q, want [%q]", tc.limits, i+1, got, want)
			}
			if got := rec.Header().Get(ratelimit.HeaderRateLimitLimit); len(tc.limits) == 1 && got != strconv.FormatInt(tc.limits[0], 10) {
				t.Errorf("limits %v: X-RateLimit-Limit %q", tc.limits, got)
			}
			if rec.Header().Get(ratelimit.HeaderRateLimitReset) == "" || rec.Header().Get(ratelimit.HeaderRateLimit) != "" {
				t.Errorf("limits %v: headers %v", tc.limits, rec.Header())
			}
		}
	}
}

// TestHandBuiltResult: a Result built by hand from its exported fields is
// answered as the one Decide would give: a refusal gets Retry-After (from
// WriteHeaders, whatever the header set) and RetryAfter reports the
// refusing layer's; a cost above capacity is answered 413 without one.
func TestHandBuiltResult(t *testing.T) {
	rule := core.PerMinute(1).Named("a")
	p := core.MustPolicy(rule)
	refused := core.Decision{Limit: 1, ResetAfter: time.Minute, RetryAfter: 30 * time.Second, Policy: p}
	cases := []struct {
		name    string
		set     ratelimit.HeaderSet
		res     ratelimit.Result
		code    int
		retry   string
		retryIn time.Duration
	}{
		{"refused", ratelimit.AllHeaders, ratelimit.Result{
			Layers: []ratelimit.LayerResult{{Key: "k", Cost: 1, Refused: true, Decision: refused}},
		}, http.StatusTooManyRequests, "30", 30 * time.Second},
		{"refused, no headers", ratelimit.NoHeaders, ratelimit.Result{
			Layers: []ratelimit.LayerResult{{Key: "k", Cost: 1, Refused: true, Decision: refused}},
		}, http.StatusTooManyRequests, "30", 30 * time.Second},
		{"too costly", ratelimit.AllHeaders, ratelimit.Result{
			Err:    fmt.Errorf("%w: cost 2", core.ErrCostExceedsCapacity),
			Layers: []ratelimit.LayerResult{{Key: "k", Cost: 2, Refused: true, Decision: core.Decision{Limit: 1, Remaining: 1, Policy: p}}},
		}, http.StatusRequestEntityTooLarge, "", 0},
		// Layers without their policy have no IETF item (and with none
		// left, the IETF fields are not written), and do not panic.
		{"no policy", ratelimit.AllHeaders, ratelimit.Result{
			Layers: []ratelimit.LayerResult{{Key: "k", Cost: 1, Refused: true, Decision: core.Decision{Limit: 5, RetryAfter: 3 * time.Second}}},
		}, http.StatusTooManyRequests, "3", 3 * time.Second},
		{"one layer without its policy", ratelimit.AllHeaders, ratelimit.Result{
			Layers: []ratelimit.LayerResult{
				{Key: "k", Cost: 1, Refused: true, Decision: core.Decision{Limit: 5, RetryAfter: 3 * time.Second}},
				{Key: "k", Cost: 1, Refused: true, Decision: refused},
			},
		}, http.StatusTooManyRequests, "30", 30 * time.Second},
	}
	ietf := map[string][2]string{ // RateLimit-Policy and RateLimit
		"no policy":                    {"", ""},
		"one layer without its policy": {`"a";q=1;w=60`, `"a";r=0;t=30`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Global("k"), Rule: rule}}, ratelimit.WithHeaders(tc.set))
			res := tc.res
			if got := res.RetryAfter(); got != tc.retryIn {
				t.Errorf("RetryAfter() = %v, want %v", got, tc.retryIn)
			}
			rec := httptest.NewRecorder()
			l.WriteHeaders(rec.Header(), &res)
			l.Refuse(rec, httptest.NewRequest(http.MethodGet, "/", nil), &res)
			if rec.Code != tc.code {
				t.Errorf("status %d, want %d", rec.Code, tc.code)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retry {
				t.Errorf("Retry-After %q, want %q", got, tc.retry)
			}
			if want, ok := ietf[tc.name]; ok {
				if got := [2]string{rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit")}; got != want {
					t.Errorf("RateLimit-Policy, RateLimit %q, want %q", got, want)
				}
				if _, ok := rec.Header()["Ratelimit"]; ok && want[1] == "" {
					t.Error("RateLimit written with no item")
				}
			}
		})
	}
}

// TestHandBuiltManyLayersPartitionKey: WriteHeaders takes a Result built by
// hand, which may have more layers than a Limiter decides together
// (core.MaxBatch); with WithPartitionKey every one of them gets its item
// and its partition key.
func TestHandBuiltManyLayersPartitionKey(t *testing.T) {
	l := mwLimiter(t, []ratelimit.Layer{{Key: ratelimit.Global("k"), Rule: core.PerMinute(10).Named("a")}},
		ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithPartitionKey())
	var res ratelimit.Result
	n := core.MaxBatch + 2
	for i := range n {
		p := core.MustPolicy(core.PerMinute(10).Named(fmt.Sprintf("p%d", i)))
		res.Layers = append(res.Layers, ratelimit.LayerResult{Key: fmt.Sprint(i), Cost: 1,
			Decision: core.Decision{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: time.Second, Policy: p}})
	}
	res.Proceed = true
	h := http.Header{}
	l.WriteHeaders(h, &res)
	state := h.Get(ratelimit.HeaderRateLimit)
	if got := strings.Count(state, ";pk=:"); got != n {
		t.Fatalf("RateLimit has %d partition keys for %d layers: %q", got, n, state)
	}
	if got := strings.Count(h.Get(ratelimit.HeaderRateLimitPolicy), ";pk=:"); got != n {
		t.Fatalf("RateLimit-Policy has %d partition keys for %d layers", got, n)
	}
}
