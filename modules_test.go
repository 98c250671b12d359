package ratelimit_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// goMod is the part of `go mod edit -json` these tests read.
type goMod struct {
	Module  struct{ Path string }
	Go      string
	Require []struct {
		Path     string
		Indirect bool
	}
}

func readGoMod(t *testing.T, dir string) goMod {
	t.Helper()
	out, err := exec.Command("go", "mod", "edit", "-json", filepath.Join(dir, "go.mod")).Output()
	if err != nil {
		t.Fatalf("go mod edit -json %s/go.mod: %v", dir, err)
	}
	var m goMod
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("%s/go.mod: %v", dir, err)
	}
	return m
}

// TestRootModuleRequiresOnlyLRU pins the dependency rule: an application
// importing the root package pulls golang-lru/v2 and nothing else (goleak
// is required by this module's own tests only).
func TestRootModuleRequiresOnlyLRU(t *testing.T) {
	m := readGoMod(t, ".")
	allowed := map[string]bool{
		"github.com/hashicorp/golang-lru/v2": true,
		"go.uber.org/goleak":                 true, // tests only
	}
	for _, r := range m.Require {
		if !allowed[r.Path] {
			t.Errorf("root go.mod requires %s: frameworks, backends and metrics belong in an adapter module", r.Path)
		}
	}
}

// TestModuleLayout checks that every adapter is its own module and that
// every library module's go line names a release without a patch number.
func TestModuleLayout(t *testing.T) {
	release := regexp.MustCompile(`^1\.[0-9]+$`)
	dirs := []string{".", "adapters/chilimit", "adapters/echolimit", "adapters/ginlimit", "adapters/promlimit", "adapters/redisstore"}
	for _, dir := range dirs {
		m := readGoMod(t, dir)
		want := "github.com/limitry/ratelimit"
		if dir != "." {
			want += "/" + dir
		}
		if m.Module.Path != want {
			t.Errorf("%s/go.mod: module %q, want %q", dir, m.Module.Path, want)
		}
		if !release.MatchString(m.Go) {
			t.Errorf("%s/go.mod: go %s; a library names the oldest release it supports, like 1.24", dir, m.Go)
		}
	}
}
