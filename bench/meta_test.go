package bench

import (
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var metaOut = flag.String("meta-out", "", "write the peers' metadata (memory bound, headers written) as JSON to this file")

// Meta is what cmd/chart knows of the peers beyond their measurements.
type Meta struct {
	// Bound maps an in-memory peer to how it bounds its memory.
	Bound map[string]string `json:"bound"`
	// Headers maps a middleware peer to the rate-limit headers it writes.
	Headers map[string]string `json:"headers"`
}

// TestMeta writes the peers' metadata when -meta-out is set.
func TestMeta(t *testing.T) {
	if *metaOut == "" {
		t.Skip("no -meta-out")
	}
	m := Meta{Bound: map[string]string{}, Headers: map[string]string{}}
	for _, p := range peers() {
		m.Bound[p.name] = p.bound
	}
	for _, p := range mwPeers() {
		m.Headers[p.name] = p.headers
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*metaOut, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
