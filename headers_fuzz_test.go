package ratelimit_test

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// FuzzIETFHeaders builds a two-layer Limiter from random rule names, limits,
// windows and bursts, makes a few requests, and checks that the IETF fields
// parse as strict RFC 9651 Lists, round-trip, and say what the rules and
// decisions say.
func FuzzIETFHeaders(f *testing.F) {
	f.Add("per-ip", "per-user", int64(10), int64(60_000), int64(0), uint8(1), false)
	f.Add("a", "b", int64(1), int64(1), int64(3), uint8(3), true)
	f.Add("default", "x y!#$%&'()*+,-./:;<=>?@[]^_`{|}~", int64(core.MaxLimit), int64(time.Hour/time.Millisecond), int64(0), uint8(2), true)
	f.Add("same", "same", int64(5), int64(1000), int64(0), uint8(1), false)
	f.Add(`bad"name`, "ok", int64(5), int64(1000), int64(0), uint8(1), false)
	f.Add("ok", `back\slash`, int64(5), int64(1000), int64(0), uint8(1), false)
	f.Add("", "zero-limit", int64(0), int64(1000), int64(0), uint8(1), false)
	f.Add("w", "neg-window", int64(7), int64(-5), int64(0), uint8(9), false)
	f.Add("frac", "window", int64(7), int64(1500), int64(2), uint8(9), true)
	f.Fuzz(func(t *testing.T, name1, name2 string, limit, windowMs, burst int64, n uint8, pk bool) {
		window := time.Duration(windowMs) * time.Millisecond
		if windowMs > int64(core.MaxWindow/time.Millisecond) || windowMs < -int64(core.MaxWindow/time.Millisecond) {
			window = core.MaxWindow + time.Millisecond // invalid, without overflow
		}
		rules := []core.Rule{
			{Name: name1, Limit: limit, Window: window, Burst: burst},
			{Name: name2, Limit: max(limit/2, 1), Window: 2 * window},
		}
		opts := []ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders), ratelimit.WithClock(core.NewFakeClock(mwT0)),
			ratelimit.WithStore(core.MustMemoryStore(&core.MemoryConfig{Capacity: 64}))}
		if pk {
			opts = append(opts, ratelimit.WithPartitionKey())
		}
		l, err := ratelimit.New([]ratelimit.Layer{
			{Key: ratelimit.MustClientIP(), Rule: rules[0]},
			{Key: ratelimit.Global("everyone"), Rule: rules[1]},
		}, opts...)
		if err != nil {
			// Only invalid rules or duplicate names may fail.
			n1, n2 := name1, name2
			if n1 == "" {
				n1 = core.DefaultName
			}
			if n2 == "" {
				n2 = core.DefaultName
			}
			if !errors.Is(err, core.ErrInvalidRule) && n1 != n2 {
				t.Fatalf("New: %v", err)
			}
			return
		}
		var policies [2]*core.Policy
		for i, r := range rules {
			p, err := core.NewPolicy(r)
			if err != nil {
				t.Fatalf("New accepted a rule NewPolicy refuses: %v", err)
			}
			policies[i] = p
		}
		h := l.Handler(mwOK)
		for i := 0; i <= int(n%8); i++ {
			w := &mwWriter{h: make(map[string][]string)}
			h.ServeHTTP(w, mwReq("192.0.2.1:1"))
			hdr := w.h
			pol := mustParseSF(t, hdr.Get(ratelimit.HeaderRateLimitPolicy))
			st := mustParseSF(t, hdr.Get(ratelimit.HeaderRateLimit))
			if len(pol) != 2 || len(st) != 2 {
				t.Fatalf("items: %d policies, %d states", len(pol), len(st))
			}
			keys := []string{"192.0.2.1", "everyone"}
			for j, p := range policies {
				if pol[j].name != p.Name() || st[j].name != p.Name() {
					t.Errorf("names %q %q, want %q", pol[j].name, st[j].name, p.Name())
				}
				q, okq := pol[j].param("q")
				wp, okw := pol[j].param("w")
				wantW := min(max(int64((p.Window()+time.Second-1)/time.Second), 1), 999_999_999_999_999)
				if !okq || !okw || q.n != min(p.Limit(), 999_999_999_999_999) || wp.n != wantW {
					t.Errorf("policy %q: q=%d w=%d, want %d %d", p.Name(), q.n, wp.n, p.Limit(), wantW)
				}
				r, okr := st[j].param("r")
				tt, okt := st[j].param("t")
				if !okr || !okt || r.n < 0 || r.n > min(p.Capacity(), 999_999_999_999_999) || tt.n < 0 {
					t.Errorf("state %q: r=%d t=%d (capacity %d)", p.Name(), r.n, tt.n, p.Capacity())
				}
				wantParams := 2
				if pk {
					wantParams = 3
					sum := sha256Sum(keys[j])
					for _, it := range []sfItem{pol[j], st[j]} {
						v, ok := it.param("pk")
						if !ok || !bytes.Equal(v.bytes, sum[:12]) {
							t.Errorf("pk of %q = %x, want %x", it.name, v.bytes, sum[:12])
						}
					}
				}
				if len(pol[j].params) != wantParams || len(st[j].params) != wantParams {
					t.Errorf("params: %+v %+v", pol[j].params, st[j].params)
				}
			}
			// The X- headers agree with one of the layers.
			rem := hdr.Get(ratelimit.HeaderRateLimitRemaining)
			r0, _ := st[0].param("r")
			r1, _ := st[1].param("r")
			if rem != strconv.FormatInt(r0.n, 10) && rem != strconv.FormatInt(r1.n, 10) {
				if r0.n < 999_999_999_999_999 && r1.n < 999_999_999_999_999 {
					t.Errorf("X-RateLimit-Remaining %s matches no layer (%d, %d)", rem, r0.n, r1.n)
				}
			}
			if w.code == 429 {
				if ra, err := strconv.Atoi(hdr.Get(ratelimit.HeaderRetryAfter)); err != nil || ra < 1 {
					t.Errorf("429 with Retry-After %q", hdr.Get(ratelimit.HeaderRetryAfter))
				}
			}
		}
	})
}
