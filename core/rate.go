package core

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidRate is wrapped by every error [ParseRate] returns. When the text
// is well formed but the rate it describes is not a valid Rule (a window
// longer than MaxWindow, a count above MaxLimit), the error wraps
// [ErrInvalidRule] as well.
var ErrInvalidRate = errors.New("ratelimit: invalid rate")

// MaxRateLen is the longest text [ParseRate] accepts, in bytes. Every valid
// rate is far shorter; a longer text is refused before it is examined.
const MaxRateLen = 64

// day is the window of PerDay and the "d" of ParseRate: 24 hours, without
// regard to calendar days or daylight saving time.
const day = 24 * time.Hour

// PerDay returns a token-bucket Rule admitting n units per day: 24 hours,
// without regard to calendar days or daylight saving time.
func PerDay(n int64) Rule { return Rule{Limit: n, Window: day} }

// rateUnits are the unit names ParseRate accepts after a '/'.
var rateUnits = map[string]time.Duration{
	"ms":     time.Millisecond,
	"s":      time.Second,
	"sec":    time.Second,
	"second": time.Second,
	"m":      time.Minute,
	"min":    time.Minute,
	"minute": time.Minute,
	"h":      time.Hour,
	"hr":     time.Hour,
	"hour":   time.Hour,
	"d":      day,
	"day":    day,
}

// ululeUnits are the period letters of the "<count>-<period>" form, as
// github.com/ulule/limiter reads them (case-insensitively).
var ululeUnits = map[string]time.Duration{
	"S": time.Second,
	"M": time.Minute,
	"H": time.Hour,
	"D": day,
}

// ParseRate parses a rate written in configuration, such as "100/min", and
// returns the token-bucket Rule it describes (Name empty, Burst 0, so the
// defaults apply; set them with [Rule.Named], [Rule.Using] and
// [Rule.WithBurst]). Three forms are accepted:
//
//   - "<count>/<unit>", with unit one of ms, s, sec, second, m, min, minute,
//     h, hr, hour, d, day: "10/s", "100/min", "5000/h", "1000/day".
//   - "<count>/<duration>", with a duration as [time.ParseDuration] reads it
//     (without a sign), or a whole number of days: "5/10m", "100/1h30m",
//     "3/500ms", "10/.5s", "10000/7d".
//   - "<count>-<period>", the form of github.com/ulule/limiter, with period
//     one of S, M, H, D (second, minute, hour, day; in either case): "10-S",
//     "100-M", "1000-H", "1000-D".
//
// count is a positive decimal integer without sign; spaces around the text
// and around the separator are ignored. A day is 24 hours.
//
// The error wraps [ErrInvalidRate] and says what is wrong: an empty or
// over-long text (more than [MaxRateLen] bytes), a missing separator, a count
// that is not a positive decimal integer (zero, negative, signed, fractional),
// an unknown unit, a zero, signed or unparseable duration. A well-formed rate that no
// Rule can hold (a count above MaxLimit, a window above MaxWindow) is
// refused with an error that also wraps [ErrInvalidRule]. Every Rule
// ParseRate returns passes [Rule.Validate].
func ParseRate(s string) (Rule, error) {
	if len(s) > MaxRateLen {
		return Rule{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalidRate, MaxRateLen)
	}
	text := strings.TrimSpace(s)
	if text == "" {
		return Rule{}, fmt.Errorf("%w: empty", ErrInvalidRate)
	}
	count, per, ok := strings.Cut(text, "/")
	ulule := false
	if !ok {
		if count, per, ok = strings.Cut(text, "-"); !ok {
			return Rule{}, fmt.Errorf("%w %q: want <count>/<unit or duration> (\"100/min\", \"5/10m\") or <count>-<S|M|H|D> (\"1000-H\")", ErrInvalidRate, text)
		}
		ulule = true
	}
	count, per = strings.TrimSpace(count), strings.TrimSpace(per)
	n, err := parseRateCount(count)
	if err == errCountTooLarge {
		return Rule{}, ruleRateError(text, fmt.Sprintf("count %s exceeds MaxLimit (%d)", count, int64(MaxLimit)))
	}
	if err != nil {
		return Rule{}, fmt.Errorf("%w %q: %v", ErrInvalidRate, text, err)
	}
	var w time.Duration
	if ulule {
		var known bool
		if w, known = ululeUnits[strings.ToUpper(per)]; !known {
			return Rule{}, fmt.Errorf("%w %q: unknown period %q, want S, M, H or D", ErrInvalidRate, text, per)
		}
	} else if w, err = parseRateWindow(per); err == errWindowTooLong {
		return Rule{}, ruleRateError(text, fmt.Sprintf("window %q exceeds MaxWindow (%v)", per, MaxWindow))
	} else if err != nil {
		return Rule{}, fmt.Errorf("%w %q: %v", ErrInvalidRate, text, err)
	}
	if w > MaxWindow {
		return Rule{}, ruleRateError(text, fmt.Sprintf("window %v exceeds MaxWindow (%v)", w, MaxWindow))
	}
	r := Rule{Limit: n, Window: w}
	if err := r.Validate(); err != nil {
		return Rule{}, fmt.Errorf("%w %q: %w", ErrInvalidRate, text, err)
	}
	return r, nil
}

// rateRuleError is a ParseRate error for a well-formed rate that no Rule can
// hold: it wraps both ErrInvalidRate and ErrInvalidRule.
type rateRuleError struct{ msg string }

func (e *rateRuleError) Error() string   { return e.msg }
func (e *rateRuleError) Unwrap() []error { return []error{ErrInvalidRate, ErrInvalidRule} }

func ruleRateError(text, detail string) error {
	return &rateRuleError{msg: fmt.Sprintf("%v %q: %s", ErrInvalidRate, text, detail)}
}

// MustParseRate is like [ParseRate] but panics if s is not a valid rate. It
// is meant for rates written in the program itself; rates read from
// configuration go through ParseRate, so that a mistake is an error.
func MustParseRate(s string) Rule {
	r, err := ParseRate(s)
	if err != nil {
		panic(err)
	}
	return r
}

// parseRateCount parses the count of a rate: decimal digits only.
func parseRateCount(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("missing count")
	}
	if !allDigits(s) {
		return 0, fmt.Errorf("count %q is not a positive decimal integer", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > MaxLimit {
		return 0, errCountTooLarge
	}
	if n == 0 {
		return 0, errors.New("count must be positive, got 0")
	}
	return n, nil
}

// errCountTooLarge is returned by parseRateCount for a count above
// MaxLimit.
var errCountTooLarge = errors.New("count exceeds MaxLimit")

// errWindowTooLong is returned by parseRateWindow for a well-formed
// window too long for MaxWindow that it cannot return: a number of days
// above MaxWindow, or a duration beyond time.Duration's range.
var errWindowTooLong = errors.New("window exceeds MaxWindow")

// parseRateWindow parses what follows the '/' of a rate: a unit name, a
// whole number of days ("7d"), or a Go duration ("10m", "1h30m").
func parseRateWindow(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("missing unit or duration after '/'")
	}
	if w, ok := rateUnits[s]; ok {
		return w, nil
	}
	if c := s[0]; c == '+' || c == '-' {
		return 0, fmt.Errorf("duration %q is signed, want it without a sign", s)
	}
	if (s[0] < '0' || s[0] > '9') && s[0] != '.' {
		return 0, fmt.Errorf("unknown unit %q, want ms, s, sec, second, m, min, minute, h, hr, hour, d or day, or a duration such as 10m", s)
	}
	if days, ok := strings.CutSuffix(s, "d"); ok && allDigits(days) {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n > int64(MaxWindow/day) {
			return 0, errWindowTooLong
		}
		if n == 0 {
			return 0, fmt.Errorf("duration %q must be positive", s)
		}
		return time.Duration(n) * day, nil
	}
	w, err := time.ParseDuration(s)
	syntax, whole := durationSyntax(s)
	if err != nil {
		if syntax {
			return 0, errWindowTooLong // it only overflows
		}
		return 0, fmt.Errorf("duration %q is not a whole number of days or a duration such as 10m or 1h30m", s)
	}
	if w <= 0 {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	if !whole {
		// ParseDuration drops the fraction of a nanosecond: a window
		// other than the one written.
		return 0, fmt.Errorf("duration %q is not a whole number of nanoseconds", s)
	}
	return w, nil
}

// durationSyntax reports whether s is written as time.ParseDuration reads
// an unsigned duration: one or more decimal numbers ("10", "1.5", ".5"),
// each followed by a unit (ns, us, µs, μs, ms, s, m, h). ParseDuration
// refuses such a text only when its value is beyond time.Duration's range.
// whole reports whether every number of it is a whole number of
// nanoseconds, the fraction of one being what ParseDuration drops.
func durationSyntax(s string) (syntax, whole bool) {
	if s == "" {
		return false, false
	}
	whole = true
	for s != "" {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		digits := i
		frac := ""
		if i < len(s) && s[i] == '.' {
			i++
			j := i
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			digits += i - j
			frac = s[j:i]
		}
		if digits == 0 {
			return false, false
		}
		j := i
		for i < len(s) && s[i] != '.' && (s[i] < '0' || s[i] > '9') {
			i++
		}
		unit, ok := unitNanos[s[j:i]]
		if !ok {
			return false, false
		}
		whole = whole && wholeFraction(frac, unit)
		s = s[i:]
	}
	return true, whole
}

// unitNanos are the nanoseconds of time.ParseDuration's units.
var unitNanos = map[string]int64{
	"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9,
}

// wholeFraction reports whether the decimal fraction .frac of a unit of
// unit nanoseconds is a whole number of nanoseconds.
func wholeFraction(frac string, unit int64) bool {
	frac = strings.TrimRight(frac, "0")
	if frac == "" {
		return true
	}
	f, _ := new(big.Int).SetString(frac, 10)
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	return new(big.Int).Mod(f.Mul(f, big.NewInt(unit)), pow).Sign() == 0
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
