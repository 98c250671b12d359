package core_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in     string
		limit  int64
		window time.Duration
	}{
		{"10/s", 10, time.Second},
		{"10/sec", 10, time.Second},
		{"10/second", 10, time.Second},
		{"100/m", 100, time.Minute},
		{"100/min", 100, time.Minute},
		{"100/minute", 100, time.Minute},
		{"5000/h", 5000, time.Hour},
		{"5000/hr", 5000, time.Hour},
		{"5000/hour", 5000, time.Hour},
		{"1000/d", 1000, 24 * time.Hour},
		{"1000/day", 1000, 24 * time.Hour},
		{"3/ms", 3, time.Millisecond},
		{"5/10m", 5, 10 * time.Minute},
		{"100/1h30m", 100, 90 * time.Minute},
		{"3/500ms", 3, 500 * time.Millisecond},
		{"2/1.5s", 2, 1500 * time.Millisecond},
		{"2/0.000000001s", 2, time.Nanosecond},
		{"2/0.00000000005m", 2, 3 * time.Nanosecond},
		{"2/1.250us", 2, 1250 * time.Nanosecond},
		{"2/1.5s", 2, 1500 * time.Millisecond},
		{"10/.5s", 10, 500 * time.Millisecond},
		{"10000/7d", 10000, 7 * 24 * time.Hour},
		{"1000-H", 1000, time.Hour},
		{"10-S", 10, time.Second},
		{"100-M", 100, time.Minute},
		{"1000-D", 1000, 24 * time.Hour},
		{"1000-h", 1000, time.Hour},
		{"  100 / min  ", 100, time.Minute},
		{"007/s", 7, time.Second},
		{"1125899906842624/s", core.MaxLimit, time.Second},
		{"1/18250d", 1, core.MaxWindow},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := core.ParseRate(tt.in)
			if err != nil {
				t.Fatalf("ParseRate(%q): %v", tt.in, err)
			}
			want := core.Rule{Limit: tt.limit, Window: tt.window}
			if r != want {
				t.Fatalf("ParseRate(%q) = %+v, want %+v", tt.in, r, want)
			}
			if err := r.Validate(); err != nil {
				t.Fatalf("ParseRate(%q) gave an invalid rule: %v", tt.in, err)
			}
		})
	}
}

func TestParseRateErrors(t *testing.T) {
	tests := []struct {
		name, in string
		rule     bool   // the error also wraps ErrInvalidRule
		msg      string // a fragment of the message
	}{
		{"empty", "", false, "empty"},
		{"blank", "   ", false, "empty"},
		{"no separator", "100", false, "want <count>/"},
		{"garbage", "lots", false, "want <count>/"},
		{"no count", "/s", false, "missing count"},
		{"no unit", "10/", false, "missing unit"},
		{"zero count", "0/s", false, "count must be positive"},
		{"zero count ulule", "0-S", false, "count must be positive"},
		{"negative count", "-5/s", false, "not a positive decimal integer"},
		{"signed count", "+5/s", false, "not a positive decimal integer"},
		{"fractional count", "1.5/s", false, "not a positive decimal integer"},
		{"hex count", "0x10/s", false, "not a positive decimal integer"},
		{"count overflows int64", "99999999999999999999/s", true, "count 99999999999999999999 exceeds MaxLimit"},
		{"count above MaxLimit", "1125899906842625/s", true, "count 1125899906842625 exceeds MaxLimit"},
		{"unknown unit", "10/fortnight", false, "unknown unit"},
		{"unit case", "10/MIN", false, "unknown unit"},
		{"negative duration", "10/-1m", false, "is signed"},
		{"signed duration", "10/+5s", false, "is signed"},
		{"zero duration", "10/0s", false, "must be positive"},
		{"zero days", "10/0d", false, "must be positive"},
		{"tiny duration", "10/0.1ns", false, "must be positive"},
		{"fraction of a nanosecond", "3/1.5ns", false, "not a whole number of nanoseconds"},
		{"fraction of a nanosecond in seconds", "10/1.0000000005s", false, "not a whole number of nanoseconds"},
		{"fraction of a nanosecond in minutes", "10/0.00000000011m", false, "not a whole number of nanoseconds"},
		{"fraction of a nanosecond in a sum", "10/1h0.5ns", false, "not a whole number of nanoseconds"},
		{"bad duration", "10/5x", false, "not a whole number of days"},
		{"fractional days", "10/1.5d", false, "not a whole number of days"},
		{"duration overflow", "10/9999999999h", true, `window "9999999999h" exceeds MaxWindow`},
		{"duration overflow in minutes", "1/200000000m", true, `window "200000000m" exceeds MaxWindow`},
		{"duration overflow in parts", "1/2562047h47m16.854775808s", true, "exceeds MaxWindow"},
		{"duration overflow, fraction", "1/9999999999.5h", true, "exceeds MaxWindow"},
		{"bad duration, no unit", "10/5", false, "not a whole number of days"},
		{"bad duration, dot alone", "10/.h", false, "not a whole number of days"},
		{"bad duration, unit first", "10/5hh", false, "not a whole number of days"},
		{"days overflow", "10/99999999999999999999d", true, "exceeds MaxWindow"},
		{"days above MaxWindow", "10/18251d", true, `window "18251d" exceeds MaxWindow`},
		{"window above MaxWindow", "10/500000h", true, "window 500000h0m0s exceeds MaxWindow"},
		{"unknown ulule period", "100-W", false, "unknown period"},
		{"ulule long period", "100-Hour", false, "unknown period"},
		{"two separators", "1/2/3", false, "not a whole number of days"},
		{"huge", strings.Repeat("9", 100000) + "/s", false, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := core.ParseRate(tt.in)
			if err == nil {
				t.Fatalf("ParseRate(%.40q) = %+v, want an error", tt.in, r)
			}
			if !errors.Is(err, core.ErrInvalidRate) {
				t.Errorf("error %v does not wrap ErrInvalidRate", err)
			}
			if got := errors.Is(err, core.ErrInvalidRule); got != tt.rule {
				t.Errorf("errors.Is(%v, ErrInvalidRule) = %v, want %v", err, got, tt.rule)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Errorf("error %q lacks the ratelimit: prefix", err)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long: it must not echo a huge input", len(err.Error()))
			}
			if r != (core.Rule{}) {
				t.Errorf("ParseRate returned %+v with its error, want the zero Rule", r)
			}
		})
	}
}

func TestMustParseRate(t *testing.T) {
	if r := core.MustParseRate("100/min"); r != core.PerMinute(100) {
		t.Fatalf("MustParseRate(100/min) = %+v", r)
	}
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, core.ErrInvalidRate) {
			t.Fatalf("MustParseRate(0/s) panicked with %v, want an error wrapping ErrInvalidRate", err)
		}
	}()
	core.MustParseRate("0/s")
}

func TestPerDay(t *testing.T) {
	r := core.PerDay(1000)
	if r.Limit != 1000 || r.Window != 24*time.Hour || r.Algorithm != nil || r.Burst != 0 || r.Name != "" {
		t.Fatalf("PerDay(1000) = %+v", r)
	}
	p := core.MustPolicy(r)
	if p.Capacity() != 1000 || p.Algorithm() != core.TokenBucket {
		t.Fatalf("PerDay policy: %v", p)
	}
	if got := core.MustParseRate("1000/day"); got != r {
		t.Fatalf("ParseRate(1000/day) = %+v, want PerDay(1000) = %+v", got, r)
	}
}

// FuzzParseRate: ParseRate never panics; it returns either a Rule that
// validates, with a positive Limit and Window, or an error wrapping
// ErrInvalidRate and no Rule.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{
		"100/min", "5000/h", "10/s", "5/10m", "100/1h30m", "1000-H", "10-S", "100-M", "1000-D",
		"0/s", "-1/s", "10/-1s", "1/18250d", "1/18251d", "1125899906842625/s", "1/0.5ns", "x", "",
		"10/1e3s", "1-", "-", "/", "9223372036854775807/9223372036854775807ns",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := core.ParseRate(s)
		if err != nil {
			if !errors.Is(err, core.ErrInvalidRate) {
				t.Fatalf("ParseRate(%q): error %v does not wrap ErrInvalidRate", s, err)
			}
			if r != (core.Rule{}) {
				t.Fatalf("ParseRate(%q) returned %+v with an error", s, r)
			}
			return
		}
		if r.Limit <= 0 || r.Window <= 0 {
			t.Fatalf("ParseRate(%q) = %+v: non-positive field", s, r)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("ParseRate(%q) = %+v, which does not validate: %v", s, r, err)
		}
	})
}
