package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// goal is one ratio target of the performance targets: ours ÷ a peer's on
// one workload and unit, met when the ratio is below bound (above it when
// higher is better).
type goal struct {
	label        string
	workload     string
	unit         string
	a, b         string // the rows compared: a ÷ b
	bound        float64
	higherBetter bool
	strict       bool // met only strictly below (above) bound
}

// goals lists the ratio targets that can be computed from r: the fastest
// peer of each in-memory workload, the bounded peers' heap, the fastest
// header-writing middleware, and the Redis throughput targets.
func goals(r results, m meta) []goal {
	var gs []goal
	for _, w := range memWorkloads {
		if bp, _, ok := r.best(w, "ns/op", nil); ok {
			gs = append(gs, goal{label: w + " vs " + bp, workload: w, unit: "ns/op", a: ours, b: bp, bound: 1, strict: true})
		}
	}
	if _, ok := r.get("HeapPerKey", ours, "B/key"); ok {
		// An absolute bound: shown as a ratio to 128 bytes.
		gs = append(gs, goal{label: "HeapPerKey (bytes per key ÷ 128)", workload: "HeapPerKey", unit: "B/key", a: ours, bound: 1})
	}
	if _, ok := r.get("HeapPerKeyUsedAgain", ours, "B/key"); ok {
		gs = append(gs, goal{label: "HeapPerKeyUsedAgain (bytes per key ÷ 128)", workload: "HeapPerKeyUsedAgain", unit: "B/key", a: ours, bound: 1})
	}
	for _, w := range mwWorkloads {
		if bp, _, ok := r.best(w, "ns/op", m.writesHeaders); ok {
			gs = append(gs, goal{label: w + " vs " + bp, workload: w, unit: "ns/op", a: ours, b: bp, bound: 0.6})
		}
	}
	for _, w := range []string{"RedisHotKeyParallel64", "RedisKeys100kParallel64"} {
		for _, pair := range [][2]string{{ours, "redis_rate"}, {ours + "-fixedwindow", "ulule"}} {
			_, ok1 := r.get(w, pair[0], "decisions/s")
			_, ok2 := r.get(w, pair[1], "decisions/s")
			if ok1 && ok2 {
				keys, alg := "100,000 keys", "token bucket"
				if w == "RedisHotKeyParallel64" {
					keys = "one hot key"
				}
				if pair[0] != ours {
					alg = "fixed window"
				}
				gs = append(gs, goal{label: fmt.Sprintf("Redis, 64-way, %s: %s vs %s", keys, alg, pair[1]),
					workload: w, unit: "decisions/s", a: pair[0], b: pair[1], bound: 1, higherBetter: true})
			}
		}
	}
	return gs
}

// ratio returns the goal's ratio (the median of the per-round ratios, or
// the ratio of medians when the rounds do not pair) with the smallest and
// largest per-round ratio.
func (g goal) ratio(r results) (med, lo, hi float64, ok bool) {
	if g.b == "" {
		vs := r[g.workload][g.a][g.unit]
		v, ok := r.get(g.workload, g.a, g.unit)
		if !ok {
			return 0, 0, 0, false
		}
		lo, hi = math.Inf(1), math.Inf(-1)
		for _, x := range vs {
			lo, hi = math.Min(lo, x/128), math.Max(hi, x/128)
		}
		return v / 128, lo, hi, true
	}
	if med, lo, hi, ok := r.paired(g.workload, g.a, g.b, g.unit); ok {
		return med, lo, hi, true
	}
	va, ok1 := r.get(g.workload, g.a, g.unit)
	vb, ok2 := r.get(g.workload, g.b, g.unit)
	if !ok1 || !ok2 || vb == 0 {
		return 0, 0, 0, false
	}
	return va / vb, va / vb, va / vb, true
}

// glance draws the targets as one chart: for each, a dot at the median of
// the per-round ratios with a line from the smallest to the largest, on a
// scale where the target's bound is the same vertical line for every row
// (a ratio is divided by its bound; for throughput, its inverse is). Green
// when met, red when not.
func glance(r results, m meta) string {
	type row struct {
		label       string
		med, lo, hi float64 // normalised: < 1 is met
		raw         float64
		bound       float64
		higher      bool
		strict      bool
	}
	var rows []row
	for _, g := range goals(r, m) {
		med, lo, hi, ok := g.ratio(r)
		if !ok || med <= 0 || lo <= 0 {
			continue
		}
		rw := row{label: g.label, raw: med, bound: g.bound, higher: g.higherBetter, strict: g.strict}
		if g.higherBetter {
			rw.med, rw.lo, rw.hi = g.bound/med, g.bound/hi, g.bound/lo
		} else {
			rw.med, rw.lo, rw.hi = med/g.bound, lo/g.bound, hi/g.bound
		}
		rows = append(rows, rw)
	}
	const (
		labelW = 400
		plotW  = 520
		rowH   = 24
		top    = 64
		xMax   = 2.0 // the scale runs from 0 to twice the bound
	)
	width := labelW + plotW + 150
	height := top + len(rows)*rowH + 40
	x := func(v float64) float64 { return labelW + math.Min(v, xMax)/xMax*plotW }

	var b strings.Builder
	pf := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	pf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	pf(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	pf(`<text x="12" y="22" font-size="15" font-weight="bold">Targets at a glance: left of the line is met</text>` + "\n")
	pf(`<text x="12" y="42" fill="#444444">dot: median of the per-round ratios; bar: smallest to largest round; each row scaled so that its target is the line</text>` + "\n")
	pf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333333" stroke-dasharray="4 3"/>`+"\n", x(1), top-10, x(1), top+len(rows)*rowH)
	for i, rw := range rows {
		y := top + i*rowH + rowH/2
		color := "#1a7f37"
		if rw.med > 1 || rw.strict && rw.med == 1 {
			color = "#cf222e"
		}
		if i%2 == 0 {
			pf(`<rect x="0" y="%d" width="%d" height="%d" fill="#f6f8fa"/>`+"\n", y-rowH/2, width, rowH)
		}
		pf(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-10, y+4, html.EscapeString(rw.label))
		pf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="3" stroke-opacity="0.35"/>`+"\n", x(rw.lo), y, x(rw.hi), y, color)
		pf(`<circle cx="%.1f" cy="%d" r="5" fill="%s"/>`+"\n", x(rw.med), y, color)
		rel := "≤"
		switch {
		case rw.strict && rw.higher:
			rel = ">"
		case rw.strict:
			rel = "<"
		case rw.higher:
			rel = "≥"
		}
		pf(`<text x="%d" y="%d" fill="%s">%.2f× (target %s %.1f×)</text>`+"\n", labelW+plotW+10, y+4, color, rw.raw, html.EscapeString(rel), rw.bound)
	}
	for _, t := range []float64{0, 0.5, 1, 1.5, 2} {
		pf(`<text x="%.1f" y="%d" text-anchor="middle" fill="#666666" font-size="10">%s</text>`+"\n", x(t), top+len(rows)*rowH+16, scaleLabel(t))
	}
	pf("</svg>\n")
	return b.String()
}

// scaleLabel names a point of glance's scale, in multiples of the target.
func scaleLabel(t float64) string {
	switch t {
	case 0:
		return "0"
	case 1:
		return "target"
	}
	return fmt.Sprintf("%g× target", t)
}

// layoutTable is the table of BenchmarkLRULayout (the per-key structures
// behind Keys100kParallel, without clock or algorithm), or "" when it was
// not run.
func layoutTable(r results) string {
	ps := r.peers("LRULayout")
	if len(ps) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Per-key layouts (BenchmarkLRULayout: 100,000 keys; BenchmarkLRULayoutWarm: 10,000; 2 goroutines, 64 locked shards, no clock or algorithm)\n\n")
	const store = "slab-index"
	fmt.Fprintf(&b, "| layout | 100,000 keys ns/op | per-round ratio to %s (the store's layout) | 10,000 keys ns/op | per-round ratio |\n|---|---:|---|---:|---|\n", store)
	for _, p := range ps {
		note, warm := "–", "–"
		if p != store {
			note = r.pairedNote("LRULayout", p, store, "ns/op")
			warm = r.pairedNote("LRULayoutWarm", p, store, "ns/op")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", p, cell(r, "LRULayout", p, "ns/op"), note, cell(r, "LRULayoutWarm", p, "ns/op"), warm)
	}
	idx, ok1 := r.get("LRULayout", store, "ns/op")
	prev, ok2 := r.get("LRULayout", "golang-lru-slot", "ns/op")
	if ok1 && ok2 {
		fmt.Fprintf(&b, "\nOver 100,000 keys the store's layout (the slab as the index: one search of the slab, no golang-lru lookup) takes %s ns a decision here, the layout it replaced (golang-lru-slot: a golang-lru lookup, then the slot) %s ns. ", num(idx), num(prev))
		if o, p, v, ok := r.oursAndBest("Keys100kParallel"); ok {
			fmt.Fprintf(&b, "Keys100kParallel: ours %s ns, %s %s ns.", num(o), p, num(v))
		}
		b.WriteString("\n")
	}
	return b.String()
}
