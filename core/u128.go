package core

import "math/bits"

// mulAddDiv returns floor((a*b + c) / d) and the remainder, computed with a
// 128-bit intermediate. It requires the quotient to fit in 64 bits, which the
// callers guarantee through the bounds checked in NewPolicy.
func mulAddDiv(a, b, c, d uint64) (q, r uint64) {
	hi, lo := bits.Mul64(a, b)
	var carry uint64
	lo, carry = bits.Add64(lo, c, 0)
	hi += carry
	return bits.Div64(hi, lo, d)
}

// mulDivChecked returns floor(a*b / d) and the remainder, and false when
// the quotient does not fit in 64 bits.
func mulDivChecked(a, b, d uint64) (q, r uint64, ok bool) {
	hi, lo := bits.Mul64(a, b)
	if hi >= d {
		return 0, 0, false
	}
	q, r = bits.Div64(hi, lo, d)
	return q, r, true
}

// ceilDiff returns ceil((aq + ar/l) - (bq + br/l)) for fractions ar, br in
// [0, l): the whole parts differ by aq-bq and the fractional parts add one
// when ar exceeds br.
func ceilDiff(aq int64, ar uint64, bq int64, br uint64) int64 {
	d := aq - bq
	if ar > br {
		d++
	}
	return d
}

// lessEq reports whether aq + ar/l <= bq + br/l for fractions in [0, l).
func lessEq(aq int64, ar uint64, bq int64, br uint64) bool {
	return aq < bq || (aq == bq && ar <= br)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
