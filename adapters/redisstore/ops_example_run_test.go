package redisstore_test

import (
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
)

// TestOpsExamples runs the examples of Peek, Refund and Reset against a
// private server and checks what they print.
func TestOpsExamples(t *testing.T) {
	saved := redisAddr
	redisAddr = redistest.Server(t)
	t.Cleanup(func() { redisAddr = saved })
	for _, c := range []struct {
		name string
		f    func()
		want string
	}{
		{"Refund", ExampleStore_Refund, "login ok: true remaining after the charge: 4\nlogin ok: false remaining after the charge: 4\nlogin ok: true remaining after the charge: 3\n"},
		{"Peek", ExampleStore_Peek, "3 would be admitted: true\n3 would be admitted: true\n"},
		{"Reset", ExampleStore_Reset, "before: false\nafter a reset: true\n"},
	} {
		if got := captureStdout(t, c.f); got != c.want {
			t.Errorf("ExampleStore_%s printed %q, want %q", c.name, got, c.want)
		}
	}
}
