package frameworkctx

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/limitry/ratelimit"
)

type fwContext struct{ user any }

// TestKey checks the Key functions built on a Carrier: the carried context
// reaches fn until Clear, a request without a Carrier gets noContext, an
// empty key is ErrEmptyKey, and fn's error is returned as it is.
func TestKey(t *testing.T) {
	noContext := ConfigError("fw: no context")
	if !errors.Is(noContext, ratelimit.ErrConfig) || noContext.Error() != "fw: no context" {
		t.Fatalf("ConfigError: %v, not a ratelimit.ErrConfig with its text", noContext)
	}
	user := Key("fw", func(c *fwContext) (string, error) {
		return String("fw", "user", c.user, c.user != nil)
	}, noContext)
	r := httptest.NewRequest("GET", "/", nil)
	if _, err := user(r); err != noContext {
		t.Fatalf("without a Carrier: %v, want noContext", err)
	}
	kc := New(context.Background(), &fwContext{user: "alice"})
	if k, err := user(r.WithContext(kc)); k != "alice" || err != nil {
		t.Fatalf("with a Carrier: %q, %v", k, err)
	}
	for v, want := range map[any]error{nil: ratelimit.ErrNoKey, "": ratelimit.ErrNoKey} {
		if _, err := user(r.WithContext(New(context.Background(), &fwContext{user: v}))); !errors.Is(err, want) {
			t.Errorf("user %#v: %v, want %v", v, err, want)
		}
	}
	if _, err := user(r.WithContext(New(context.Background(), &fwContext{user: 7}))); err == nil || errors.Is(err, ratelimit.ErrNoKey) {
		t.Errorf("a value that is not a string: %v, want a key error", err)
	}
	empty := Key("fw", func(*fwContext) (string, error) { return "", nil }, noContext)
	if _, err := empty(r.WithContext(kc)); err != ratelimit.ErrEmptyKey {
		t.Errorf("an empty key: %v, want ErrEmptyKey", err)
	}
	kc.Clear()
	if _, ok := kc.Get(); ok {
		t.Fatal("Get after Clear reports a context")
	}
	if _, err := user(r.WithContext(kc)); err != noContext {
		t.Fatalf("after Clear: %v, want noContext", err)
	}
	type other struct{}
	parent := context.WithValue(context.Background(), other{}, 1)
	if v := New(parent, &fwContext{}).Value(other{}); v != 1 {
		t.Fatalf("the parent's values: %v", v)
	}
}

// TestSameFunc: a function value is the same as itself, and two closures
// of one function literal are not the same, though they share their code.
func TestSameFunc(t *testing.T) {
	mk := func(n int) func() int { return func() int { return n } }
	f, g := mk(1), mk(1)
	if !SameFunc(f, f) {
		t.Error("a func is not the same as itself")
	}
	if SameFunc(f, g) {
		t.Error("two closures of one literal are the same")
	}
}
