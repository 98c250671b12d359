// Package redistest starts private redis-server processes for tests.
//
// Three entry points cover the usual needs:
//
//   - [Server] returns the address of a Redis server for one test: the one named by
//     REDIS_ADDR if that is set, otherwise a fresh private redis-server started for
//     this call alone (about 10 ms) and stopped when the test ends.
//   - [Start] always starts a private server and returns its [Process], which fault
//     tests can stop (simulating Redis dying mid-traffic) and restart on the same port.
//   - [Cluster] returns the seed addresses of a Redis Cluster: the ones named by
//     REDIS_CLUSTER_ADDRS if that is set, otherwise a private 3-master cluster (about
//     2 s to start, most of it Redis's own start-up delay before a master accepts writes).
//
// Private servers listen on 127.0.0.1 on a free port, keep no data on disk
// (--save "" --appendonly no), work in a fresh temporary directory (tb.TempDir, or
// /dev/shm for cluster nodes), and are killed by their own process id in a
// tb.Cleanup; the package never sends SHUTDOWN or FLUSHDB to any server. On Linux
// a private server is also killed when the test binary dies (for example on a go
// test -timeout panic), so none are left behind.
//
// Each call starts its own servers: tests never share state through a private
// server and may run in parallel. Tests that use REDIS_ADDR or REDIS_CLUSTER_ADDRS
// share that server with every other test and must therefore use unique key
// prefixes and never FLUSHDB.
//
// When redis-server is not on PATH (and the relevant address variable is unset), the
// test is skipped, unless the CI variable is set (as CI systems do, e.g. CI=true), in
// which case it fails: a CI run must not silently skip the Redis tests. .ci/run
// installs Redis with .ci/install-redis.sh.
//
// The package speaks RESP itself ([Do], [Exec]) and imports nothing outside the
// standard library; tests build their own go-redis clients from the addresses.
//
// All helpers must be called from the goroutine running the test, like
// testing.TB's own Fatal methods; [Exec], [ParseInfo] and the [Process] methods
// Addr, Port, Pid and Stop may be called from any goroutine.
package redistest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Environment variables read by the package.
const (
	// EnvAddr names an existing Redis server (host:port) that [Server] returns
	// instead of starting one. Tests using it must use unique key prefixes.
	EnvAddr = "REDIS_ADDR"
	// EnvClusterAddrs names the comma-separated seed addresses of an existing Redis
	// Cluster that [Cluster] returns instead of starting one.
	EnvClusterAddrs = "REDIS_CLUSTER_ADDRS"
	// EnvCI, when set to anything but "", "0" or "false", turns a missing
	// redis-server binary from a skip into a test failure.
	EnvCI = "CI"
)

// serverBinary is the name of the executable looked up on PATH.
const serverBinary = "redis-server"

// fatalMessage fails a test in CI when redis-server cannot be found.
const fatalMessage = "redis-server not found on PATH and CI is set; .ci/run must install it (.ci/install-redis.sh)"

// skipMessage returns the message that skips a test when redis-server cannot be
// found, naming the variable that could supply a server instead, if any.
func skipMessage(envVar string) string {
	if envVar == "" {
		return "redis-server not found on PATH; install redis-server to run Redis tests that need a private server"
	}
	return "redis-server not found on PATH; install redis-server or set " + envVar + " to run Redis tests"
}

// Server returns the address (host:port) of a Redis server for this test.
//
// If REDIS_ADDR is set, Server returns it unchanged; that server is shared, so the
// caller must use unique key prefixes and must never FLUSHDB it. Otherwise Server
// starts a fresh private redis-server for this call alone (each call gets its own,
// in about 10 ms), waits until it answers PING, and stops it when the test and its
// subtests have finished.
//
// Without a redis-server binary on PATH, Server skips the test, or fails it when CI
// is set.
func Server(tb testing.TB) string {
	tb.Helper()
	s := resolve(tb, EnvAddr)
	if s.external != nil {
		return s.external[0]
	}
	return startProcess(tb, s.binary, false).Addr()
}

// Start starts a private redis-server for this test and returns its [Process]. It
// ignores REDIS_ADDR, because fault tests stop and restart the server they get.
// The server is stopped when the test and its subtests have finished.
//
// Without a redis-server binary on PATH, Start skips the test, or fails it when CI
// is set.
func Start(tb testing.TB) *Process {
	tb.Helper()
	s := resolve(tb, "")
	return startProcess(tb, s.binary, false)
}

// setup is what a helper should do, as decided by decide.
type setup struct {
	external []string // addresses taken from the environment: start nothing
	binary   string   // path of the redis-server binary to start
	skip     string   // if not "", skip the test with this message
	fatal    string   // if not "", fail the test with this message
}

// decide chooses between an external server named by the environment variable
// envVar (ignored if ""), a private server started from the binary found by
// lookPath, skipping, and failing. It has no side effects, so tests can drive it
// with a fake lookPath and getenv.
func decide(envVar string, lookPath func(string) (string, error), getenv func(string) string) setup {
	if envVar != "" {
		if addrs := splitAddrs(getenv(envVar)); len(addrs) > 0 {
			return setup{external: addrs}
		}
	}
	if path, err := lookPath(serverBinary); err == nil {
		return setup{binary: path}
	}
	if isCI(getenv(EnvCI)) {
		return setup{fatal: fatalMessage}
	}
	return setup{skip: skipMessage(envVar)}
}

// resolve applies decide to the real environment, skipping or failing tb as decided.
func resolve(tb testing.TB, envVar string) setup {
	tb.Helper()
	s := decide(envVar, exec.LookPath, os.Getenv)
	switch {
	case s.fatal != "":
		tb.Fatalf("redistest: %s", s.fatal)
	case s.skip != "":
		tb.Skipf("redistest: %s", s.skip)
	}
	return s
}

// isCI reports whether the value of the CI variable means "running in CI".
func isCI(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// splitAddrs splits a comma-separated address list, dropping blanks.
func splitAddrs(s string) []string {
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}
