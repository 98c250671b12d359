package ratelimit_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeNamesExistingTests holds the README's evidence to the code:
// every test, fuzz test and example it names (in backquotes) exists in
// some _test.go file of the repository.
func TestReadmeNamesExistingTests(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	declared := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Example)\w*)\(`)
	exists := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
			exists[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Fuzz|Example)[A-Za-z0-9_]*)`").FindAllStringSubmatch(string(readme), -1)
	if len(named) < 100 {
		t.Fatalf("the README names %d tests: the pattern no longer finds them", len(named))
	}
	for _, m := range named {
		if !exists[m[1]] {
			t.Errorf("the README names %s as evidence, and no _test.go file declares it", m[1])
		}
	}
}
