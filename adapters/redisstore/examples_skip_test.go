package redisstore_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRedisExamplesPatternComplete checks that every example run by go
// test (one with an Output comment) that talks to redisAddr is named by
// redisExamplesPattern, so that without a Redis server it is skipped, as
// the README promises, instead of failing or writing to a server on
// localhost:6379.
func TestRedisExamplesPatternComplete(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	skip := regexp.MustCompile(redisExamplesPattern)
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fd.Name.Name, "Example") || fd.Recv != nil {
				continue
			}
			hasOutput := false
			for _, cg := range af.Comments {
				if cg.Pos() > fd.Body.Lbrace && cg.End() < fd.Body.Rbrace && strings.Contains(cg.Text(), "Output:") {
					hasOutput = true
				}
			}
			usesRedis := false
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok && id.Name == "redisAddr" {
					usesRedis = true
				}
				return true
			})
			if hasOutput && usesRedis {
				checked++
				if !skip.MatchString(fd.Name.Name) {
					t.Errorf("%s checks its Output against the Redis server at redisAddr, but redisExamplesPattern does not name it", fd.Name.Name)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no example that talks to redisAddr: the check no longer sees them")
	}
}
