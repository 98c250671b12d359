package redisstore_test

import (
	"bytes"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/limitry/ratelimit/internal/redistest"
)

// captureStdout runs f and returns what it printed.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	var buf bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(&buf, r) }()
	defer func() {
		os.Stdout = old
	}()
	f()
	w.Close()
	wg.Wait()
	return buf.String()
}

// TestExamples runs the example that needs a Cluster against a private
// one and checks what it prints (the single-server examples check their
// Output against the server TestMain gives them).
func TestExamples(t *testing.T) {
	t.Run("Cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starting a cluster takes 2 s")
		}
		clusterAddrs = redistest.Cluster(t)
		got := captureStdout(t, Example_cluster)
		// Two of three requests fit a burst of 2 per second, unless the
		// second boundary falls between them (then all three do).
		a := "burst allowed=true, hour remaining=999\nburst allowed=true, hour remaining=998\nburst allowed=false, hour remaining=998\n"
		b := "burst allowed=true, hour remaining=999\nburst allowed=true, hour remaining=998\nburst allowed=true, hour remaining=997\n"
		if got != a && got != b {
			t.Fatalf("Example_cluster printed\n%s", got)
		}
	})
}
