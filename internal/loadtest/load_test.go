//go:build loadtest

package loadtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitry/ratelimit/internal/redistest"
)

const (
	workers  = 64
	duration = 10 * time.Second
)

func TestLoadQuickstart(t *testing.T) {
	run(t, "quickstart")
}

func TestLoadRedis(t *testing.T) {
	srv := redistest.Start(t)
	run(t, "redis", "-redis", srv.Addr())
}

func run(t *testing.T, example string, args ...string) {
	bin := filepath.Join(t.TempDir(), example)
	// Examples that need an adapter are modules of their own: build each
	// in its own directory.
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "examples", example)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building examples/%s: %v", example, err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, append([]string{"-addr", addr}, args...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitListening(t, addr)

	url := "http://" + addr + "/"
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()

	var ok, limited, other, failed atomic.Int64
	var firstErr atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var rss []int64
	var rssMu sync.Mutex
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if v := residentKB(cmd.Process.Pid); v > 0 {
					rssMu.Lock()
					rss = append(rss, v)
					rssMu.Unlock()
				}
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					if resp.Header.Get("Retry-After") == "" {
						other.Add(1)
					}
					limited.Add(1)
				default:
					other.Add(1)
					firstErr.CompareAndSwap(nil, "status "+resp.Status)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := ok.Load() + limited.Load() + other.Load()
	t.Logf("examples/%s: %d requests in %v from %d connections: %.0f req/s (%d OK, %d 429) on %d cores",
		example, total, elapsed.Round(time.Millisecond), workers, float64(total)/elapsed.Seconds(), ok.Load(), limited.Load(), runtime.NumCPU())
	if failed.Load() > 0 || other.Load() > 0 {
		t.Fatalf("%d transport errors and %d unexpected responses (first: %v)", failed.Load(), other.Load(), firstErr.Load())
	}
	if ok.Load() == 0 || limited.Load() == 0 {
		t.Fatalf("want both admitted and limited requests, got %d and %d", ok.Load(), limited.Load())
	}
	rssMu.Lock()
	defer rssMu.Unlock()
	if len(rss) < 6 {
		t.Fatalf("only %d memory samples", len(rss))
	}
	// Flat memory: the second half of the run holds no more than the first
	// half's peak plus a small margin (connection buffers settle early).
	half := len(rss) / 2
	first, second := append([]int64(nil), rss[:half]...), append([]int64(nil), rss[half:]...)
	sort.Slice(first, func(i, j int) bool { return first[i] < first[j] })
	sort.Slice(second, func(i, j int) bool { return second[i] < second[j] })
	t.Logf("resident memory (KiB): first half max %d, second half max %d, samples %v", first[len(first)-1], second[len(second)-1], rss)
	if second[len(second)-1] > first[len(first)-1]+8*1024 {
		t.Fatalf("memory grew: first half peaked at %d KiB, second at %d KiB", first[len(first)-1], second[len(second)-1])
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitListening(t *testing.T, addr string) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("server did not listen on %s", addr)
}

// residentKB returns the process's resident set size in KiB, from /proc.
func residentKB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}
