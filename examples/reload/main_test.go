package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/limitry/ratelimit/core"
)

// TestReloadKeepsUsage follows the package documentation: three requests
// under 5/10m, then the file says 10/10m and the next response shows the new
// limit with the three requests still counted.
func TestReloadKeepsUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(path, []byte(`{"per-ip": "5/10m"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := newServer(path, core.NewFakeClock(time.Unix(1_800_000_000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	do := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		s.handler.ServeHTTP(w, r)
		return w
	}
	for i, want := range []string{"4", "3", "2"} {
		w := do()
		if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") != "5" || w.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("request %d: %d limit %s remaining %s, want 200 limit 5 remaining %s", i+1, w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"), want)
		}
	}
	if err := os.WriteFile(path, []byte(`{"per-ip": "10/10m"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	w := do()
	if w.Header().Get("X-RateLimit-Limit") != "10" || w.Header().Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("after the reload: limit %s remaining %s, want limit 10 remaining 6", w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
	}
	// A bad file changes nothing.
	if err := os.WriteFile(path, []byte(`{"per-ip": "lots"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.reload(); err == nil || !strings.Contains(err.Error(), "per-ip") {
		t.Fatalf("bad file: %v, want an error naming the layer", err)
	}
	if got := do().Header().Get("X-RateLimit-Limit"); got != "10" {
		t.Fatalf("after a bad file: limit %s, want 10", got)
	}
}
