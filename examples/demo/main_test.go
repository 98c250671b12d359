package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemo runs the demo and checks its timeline: who was refused, when, by
// which layer, and with which Retry-After.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	type row struct{ time, client, status, remaining, retry, refusedBy string }
	var rows []row
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || !strings.HasPrefix(f[0], "+") {
			continue
		}
		rows = append(rows, row{f[0], f[1], f[3], f[4], f[5], strings.Join(f[6:], " ")})
	}
	want := []row{
		{"+0.0s", "alice", "200", "2", "-", "-"},
		{"+0.0s", "alice", "200", "1", "-", "-"},
		{"+0.0s", "alice", "200", "0", "-", "-"},
		{"+0.0s", "alice", "429", "0", "4s", "per-user"},
		{"+0.0s", "bob", "200", "1", "-", "-"},
		{"+0.0s", "bob", "200", "0", "-", "-"},
		{"+0.0s", "bob", "429", "0", "2s", "per-ip"},
		{"+0.0s", "guest", "200", "4", "-", "-"},
		{"+0.0s", "guest", "200", "3", "-", "-"},
		{"+0.0s", "guest", "200", "2", "-", "-"},
		{"+1.0s", "bob", "429", "0", "1s", "per-ip"},
		{"+2.0s", "bob", "200", "0", "-", "-"},
		{"+2.0s", "alice", "429", "0", "2s", "per-ip, per-user"},
		{"+4.0s", "alice", "200", "0", "-", "-"},
		{"+10.0s", "guest", "200", "4", "-", "-"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d timeline rows, want %d:\n%s", len(rows), len(want), out.String())
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, rows[i], want[i])
		}
	}
	for _, s := range []string{
		`RateLimit-Policy: "per-ip";q=5;w=10, "per-user";q=3;w=10`,
		`RateLimit: "per-ip";r=0;t=2, "per-user";r=0;t=2`,
		"Retry-After: 2",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
}
