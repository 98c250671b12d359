package main

import (
	"fmt"
	"strings"
)

// scriptSteps are BenchmarkRedisScriptOp's rows, in the order they are
// shown, with what each stands for.
var scriptSteps = []struct{ name, what string }{
	{"loop", "the Lua loop alone (subtracted below)"},
	{"INCRBY", "ulule: count the request"},
	{"PTTL", "ulule: the window's remaining time"},
	{"TIME", "ours: the server's clock, which aligns windows for the whole fleet"},
	{"GET", "ours: read the record, to check the policy that wrote it"},
	{"SET-PX", "ours: write the record, tagged with its policy, and its expiry (a window's first charge)"},
	{"SET-KEEPTTL", "ours: write the record, keeping its expiry (later charges in the window, Redis 7 and later)"},
	{"unpack-policy", "ours: decode the policy argument (cmsgpack)"},
	{"match-record", "ours: parse the record"},
	{"format-record", "ours: format the record (and its expiry too, for a window's first charge)"},
	{"INCRBY+PTTL", "ulule's commands, together"},
	{"TIME+GET+SET-KEEPTTL", "our commands, together (a charge after a window's first)"},
	{"ulule-script", "ulule's script whole, its Lua around INCRBY and PTTL included (a count after a window's first)"},
	{"fast-path", "ours whole: our script's fast path, its Lua around its three commands included (a charge after a window's first)"},
}

// scriptTable is the table of BenchmarkRedisScriptOp, and the ceiling its
// two sequences put on our fixed window's ratio to ulule's in the 64-way
// workloads, where the server's CPU is the bottleneck.
func scriptTable(r results) string {
	const w = "RedisScriptOp"
	loop, ok := r.get(w, "loop", "srv-ns/op")
	if !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Steps of a fixed-window script (BenchmarkRedisScriptOp: each step run in a loop inside one script; the server's own clock around the loop)\n\n")
	fmt.Fprintf(&b, "| step | what | srv ns/op | less the loop |\n|---|---|---:|---:|\n")
	for _, s := range scriptSteps {
		v, ok := r.get(w, s.name, "srv-ns/op")
		if !ok {
			continue
		}
		net := "–"
		if s.name != "loop" {
			net = num(v - loop)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", s.name, s.what, num(v), net)
	}
	theirs, ok1 := r.get(w, "INCRBY+PTTL", "srv-ns/op")
	mine, ok2 := r.get(w, "TIME+GET+SET-KEEPTTL", "srv-ns/op")
	if !ok1 || !ok2 {
		return b.String()
	}
	extra := mine - theirs
	fmt.Fprintf(&b, "\nOur three commands cost the server %s ns more per decision than ulule's two. ", num(extra))
	// what extra stands for in the estimates below
	what := "that alone would"
	caveat := ", as long as the rest of our script costs at least what the rest of ulule's does"
	ul, ok1 := r.get(w, "ulule-script", "srv-ns/op")
	fp, ok2 := r.get(w, "fast-path", "srv-ns/op")
	if ok1 && ok2 {
		fmt.Fprintf(&b, "The scripts whole, in the same loops: ours %s ns, ulule's %s ns. Less their commands, the Lua around them costs %s ns in ours and %s ns in ulule's, so our script's body does %s ns more work per decision in all. ",
			num(fp-loop), num(ul-loop), num(fp-mine), num(ul-theirs), num(fp-ul))
		extra, what, caveat = fp-ul, "that would", ""
	}
	for _, wl := range redis64Workloads {
		srv, ok := r.get(wl, "ulule", "srv-us/op")
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "In %s, where ulule's decision costs the server %s µs, %s put our fixed window, each decision sent alone, at %.3f of ulule's decisions per second (%s ÷ (%s + %s)) if the server's CPU alone set the pace%s. ",
			wl, num(srv), what, srv/(srv+extra/1000), num(srv), num(srv), num(extra/1000), caveat)
	}
	for _, wl := range redis64Workloads {
		ours, ok1 := r.get(wl, oursFixedAlone, "script-us/op")
		ul, ok2 := r.get(wl, "ulule", "script-us/op")
		if ok1 && ok2 {
			fmt.Fprintf(&b, "Whole scripts, in %s (script µs/op, the commands included), each decision sent alone: ours %s µs, ulule's %s µs, a difference of %s µs. ", wl, num(ours), num(ul), num(ours-ul))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// structure is a row of a structure benchmark's table: the sub-benchmark's
// name and what it stands for.
type structure struct{ name, what string }

// structureRows writes the table of the structure benchmark w: each of
// rows that the run measured, with its per-round ratio to the last row,
// the baseline.
func structureRows(b *strings.Builder, r results, w string, rows []structure) {
	base := rows[len(rows)-1].name
	fmt.Fprintf(b, "| structure | ns/op | B/op | allocs/op | per-round ratio to %s |\n|---|---:|---:|---:|---|\n", base)
	for _, row := range rows {
		v, ok := r.get(w, row.name, "ns/op")
		if !ok {
			continue
		}
		ratio := "–"
		if row.name != base {
			ratio = r.pairedNote(w, row.name, base, "ns/op")
		}
		fmt.Fprintf(b, "| %s (%s) | %s | %s | %s | %s |\n", row.name, row.what,
			num(v), cell(r, w, row.name, "B/op"), cell(r, w, row.name, "allocs/op"), ratio)
	}
}

// insertTable is the table of BenchmarkLRUInsert: what the bound costs a
// new key, set against NewKey's gap to the fastest peer.
func insertTable(r results) string {
	const w = "LRUInsert"
	lru, ok1 := r.get(w, "golang-lru-slot", "ns/op")
	m, ok2 := r.get(w, "map", "ns/op")
	if !ok1 || !ok2 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### A new key's structure alone (BenchmarkLRUInsert: 200,000 keys in 64 locked shards, 1 goroutine, no clock or algorithm)\n\n")
	structureRows(&b, r, w, []structure{
		{"golang-lru-slot", "the store's layout before the slab became its index: a miss, drop the least recently used key, add one in its slot"},
		{"map-fifo", "the same map, bounded: drop the oldest key for each new one; no recency"},
		{"map", "unbounded, cleared when full, as httprate's windows"},
	})
	fifo, ok3 := r.get(w, "map-fifo", "ns/op")
	fmt.Fprintf(&b, "\ngolang-lru's bounded structure costs a new key %s ns more than an unbounded map here", num(lru-m))
	if ok3 {
		fmt.Fprintf(&b, "; the cheapest bound on a Go map (golang-lru's index), first in first out, %s ns more (finding and deleting the dropped key's entry), and least-recently-used order on golang-lru %s ns more than that", num(fifo-m), num(lru-fifo))
	}
	b.WriteString(". ")
	if o, p, v, ok := r.oursAndBest("NewKey"); ok {
		fmt.Fprintf(&b, "NewKey: ours %s ns, %s %s ns.", num(o), p, num(v))
		if o < v {
			b.WriteString(" A new key no longer goes through golang-lru: keys used once wait in their shard's ring (see core.MemoryStore).")
		} else if ok3 {
			fmt.Fprintf(&b, " Our gap to %s (%s ns) is %s the first-in-first-out bound's cost (%s ns).", p, num(o-v), cmpWord(o-v, fifo-m), num(fifo-m))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// growInsertTable is the table of BenchmarkLRUInsertGrowing: what
// golang-lru costs a new key in a growing store, set against
// NewKeyGrowing's gap to the fastest peer.
func growInsertTable(r results) string {
	const w = "LRUInsertGrowing"
	least, ok1 := r.get(w, "golang-lru", "ns/op")
	m, ok2 := r.get(w, "map", "ns/op")
	if !ok1 || !ok2 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### A new key's structure alone, in a growing store (BenchmarkLRUInsertGrowing: 1,000,000 keys into 81 locked shards that start empty, 1 goroutine, no clock or algorithm)\n\n")
	structureRows(&b, r, w, []structure{
		{"golang-lru", "a lookup that misses and an Add of the key's hash with a 4-byte value: the least a store finding its keys' state through golang-lru does"},
		{"golang-lru-slot", "the structure of the store's layout before the slab became its index, without placing keys by hash: a lookup that misses, the state in the shard's next slot, an Add with the slot"},
		{"map", "growing as Go maps do, as httprate's counters"},
	})
	fmt.Fprintf(&b, "\nIn a growing store, golang-lru costs a new key at least %s ns more than a map (its entry, allocated, linked, and marked by the collector)", num(least-m))
	slot, ok3 := r.get(w, "golang-lru-slot", "ns/op")
	if ok3 {
		fmt.Fprintf(&b, "; the previous layout's structure, without placing keys by hash, %s ns more", num(slot-m))
	}
	b.WriteString(". ")
	if o, p, v, ok := r.oursAndBest("NewKeyGrowing"); ok {
		if o < v {
			fmt.Fprintf(&b, "NewKeyGrowing: ours %s ns, %s %s ns: a new key no longer goes through golang-lru (keys used once wait in their shard's ring).", num(o), p, num(v))
		} else {
			fmt.Fprintf(&b, "NewKeyGrowing: ours %s ns, %s %s ns, a gap of %s ns, %s golang-lru's least (%s ns).", num(o), p, num(v), num(o-v), cmpWord(o-v, least-m), num(least-m))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// mwPartsTable is the table of BenchmarkMiddlewareParts and
// BenchmarkMiddlewarePartsParallel: our middleware's time, piece by piece.
func mwPartsTable(r results, m meta) string {
	const seq, par = "MiddlewareParts", "MiddlewarePartsParallel"
	parts := []struct{ name, what string }{
		{"key", "the client-IP key alone"},
		{"store", "the store's decision alone (core.Limiter.Allow, same addresses)"},
		{"no-headers", "the middleware, writing no headers"},
		{"x-headers", "the middleware, X-RateLimit-* (the default)"},
		{"all-headers", "the middleware, X-RateLimit-* and RateLimit-Policy/RateLimit (the Middleware row)"},
	}
	if _, ok := r.get(seq, "all-headers", "ns/op"); !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Our middleware, piece by piece (BenchmarkMiddlewareParts: as BenchmarkMiddleware, 10,000 client IPs)\n\n")
	fmt.Fprintf(&b, "| piece | what | ns/op | B/op | allocs/op | parallel ns/op |\n|---|---|---:|---:|---:|---:|\n")
	for _, p := range parts {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", p.name, p.what,
			cell(r, seq, p.name, "ns/op"), cell(r, seq, p.name, "B/op"), cell(r, seq, p.name, "allocs/op"), cell(r, par, p.name, "ns/op"))
	}
	none, ok1 := r.get(seq, "no-headers", "ns/op")
	all, ok2 := r.get(seq, "all-headers", "ns/op")
	pnone, ok3 := r.get(par, "no-headers", "ns/op")
	pall, ok4 := r.get(par, "all-headers", "ns/op")
	if ok1 && ok2 && ok3 && ok4 {
		fmt.Fprintf(&b, "\nWriting both header sets costs %s ns a request (%s in parallel): %.0f%% of the middleware's time (%.0f%%).", num(all-none), num(pall-pnone), 100*(all-none)/all, 100*(pall-pnone)/pall)
		if p, v, ok := r.best("Middleware", "ns/op", m.writesHeaders); ok {
			fmt.Fprintf(&b, " Without headers our middleware takes %s ns, %.2f× the Middleware row of %s (%s ns, with its three headers).", num(none), none/v, p, num(v))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// cmpWord says how a compares with b, in words.
func cmpWord(a, b float64) string {
	switch {
	case a < b:
		return "less than"
	case a > b:
		return "more than"
	}
	return "equal to"
}
