package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// startTimeout bounds how long a starting server may take to answer PING.
	startTimeout = 10 * time.Second
	// startAttempts is how many free ports are tried when a server cannot bind.
	startAttempts = 5
	// pollInterval is the pause between readiness probes.
	pollInterval = 5 * time.Millisecond
)

// errExited reports that redis-server exited before it answered PING, which is
// usually a port taken between choosing it and binding it.
var errExited = errors.New("redis-server exited during start-up")

// Process is a private redis-server started by [Start] or [StartCluster]. It is
// killed when the test that started it has finished, and may be stopped and
// restarted before that to simulate Redis failing.
//
// Its methods are safe for concurrent use; Stop and Pid wait while a Restart is
// in progress.
type Process struct {
	bin     string // path of the redis-server binary
	dir     string // working directory: logs, cluster config
	cluster bool   // start with cluster mode enabled
	port    int    // set before the Process is shared, then never changed

	mu   sync.Mutex    // guards cmd and done; held for a whole start or stop
	cmd  *exec.Cmd     // the running server, or nil when stopped
	done chan struct{} // closed when cmd has exited and been waited for
}

// startProcess starts a private server from bin on a free port, retrying with
// another port if the server exits before answering (for example because the
// port was taken meanwhile), and registers its cleanup with tb.
func startProcess(tb testing.TB, bin string, cluster bool) *Process {
	tb.Helper()
	p := &Process{bin: bin, dir: workDir(tb, cluster), cluster: cluster}
	// Registered after workDir's cleanup, so it runs before the directory is removed.
	tb.Cleanup(p.Stop)
	var err error
	for range startAttempts {
		if p.port, err = reservePort(cluster); err != nil {
			break
		}
		p.mu.Lock()
		err = p.start()
		p.mu.Unlock()
		if !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return p
}

// workDir returns a fresh working directory for a server, removed when the test
// ends. Cluster nodes fsync nodes.conf on every configuration change, which can
// stall them for seconds on a busy disk, so they work in /dev/shm (memory) where
// it exists; other servers write nothing but their log and use tb.TempDir.
func workDir(tb testing.TB, cluster bool) string {
	tb.Helper()
	if cluster {
		if dir, err := os.MkdirTemp("/dev/shm", "redistest-"); err == nil {
			tb.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	return tb.TempDir()
}

// Addr returns the server's address, "127.0.0.1:port". It stays the same across
// Stop and Restart.
func (p *Process) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// Port returns the server's TCP port.
func (p *Process) Port() int {
	return p.port
}

// Pid returns the process id of the running server, or 0 if it is stopped.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop kills the server at once (SIGKILL, as if it crashed) and waits for it to
// exit. Connections to it break and its port refuses new ones; nothing it held
// survives. Stop does nothing if the server is already stopped, so it may be
// called any number of times.
func (p *Process) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stop()
}

// Restart starts the server again on the same port, stopping it first if it is
// running, and waits until it answers PING. The restarted server is empty. It
// fails tb if the server cannot start, for example because another process took
// the port while it was stopped.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stop()
	if err := p.start(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// stop kills the server and waits for it. Requires p.mu held.
func (p *Process) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill() // fails only if it already exited, which is fine
	<-p.done
	p.cmd, p.done = nil, nil
}

// start launches the server on p.port and waits until it answers PING. On
// failure nothing is left running. Requires p.mu held and the server stopped.
func (p *Process) start() error {
	var stderr bytes.Buffer
	cmd := exec.Command(p.bin, p.args()...)
	cmd.Dir = p.dir
	cmd.Stderr = &stderr // read only after done is closed, when writing has ended
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	if err := waitReady(p.Addr(), cmd.Process.Pid, done); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("redis-server on %s: %w%s", p.Addr(), err, p.diagnostics(cmd, stderr.String()))
	}
	p.cmd, p.done = cmd, done
	return nil
}

// args returns the redis-server command line for p.
func (p *Process) args() []string {
	args := []string{
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", p.dir,
		"--logfile", p.logFile(),
	}
	if allowsDebugCommand(p.bin) {
		// Redis 7 refuses DEBUG (used by fault tests: DEBUG SLEEP) unless enabled.
		args = append(args, "--enable-debug-command", "local")
	}
	if p.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(p.dir, fmt.Sprintf("nodes-%d.conf", p.port)),
			"--cluster-node-timeout", "5000",
			// Nodes advertise this address in CLUSTER SLOTS/SHARDS and MOVED replies.
			"--cluster-announce-ip", "127.0.0.1",
		)
	}
	return args
}

func (p *Process) logFile() string {
	return filepath.Join(p.dir, "redis.log")
}

// diagnostics describes why a server failed to start: its exit status, its
// stderr and the end of its log. cmd must have been waited for.
func (p *Process) diagnostics(cmd *exec.Cmd, stderr string) string {
	var b strings.Builder
	if cmd.ProcessState != nil {
		fmt.Fprintf(&b, " (%s)", cmd.ProcessState)
	}
	if s := strings.TrimSpace(stderr); s != "" {
		fmt.Fprintf(&b, "\nstderr:\n%s", s)
	}
	if log, err := os.ReadFile(p.logFile()); err == nil && len(log) > 0 {
		lines := strings.Split(strings.TrimSpace(string(log)), "\n")
		lines = lines[max(0, len(lines)-10):]
		fmt.Fprintf(&b, "\nend of %s:\n%s", p.logFile(), strings.Join(lines, "\n"))
	}
	return b.String()
}

// waitReady polls addr until the server with process id pid answers PING, the
// process exits (errExited), or startTimeout passes. Checking the pid guards
// against a PONG from another server that took the port first.
func waitReady(addr string, pid int, done <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for {
		select {
		case <-done:
			return errExited
		default:
		}
		if last = probe(addr, pid); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %w", startTimeout, last)
		}
		select {
		case <-done:
			return errExited
		case <-time.After(pollInterval):
		}
	}
}

// probe checks that the server at addr answers PING and has process id pid.
func probe(addr string, pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.close()
	reply, err := c.do("PING")
	if err != nil {
		return err
	}
	if reply != "PONG" {
		return fmt.Errorf("PING replied %q", reply)
	}
	info, err := c.do("INFO", "server")
	if err != nil {
		return err
	}
	s, _ := info.(string)
	if got := ParseInfo(s)["process_id"]; got != strconv.Itoa(pid) {
		return fmt.Errorf("%s is served by process %q, not %d", addr, got, pid)
	}
	return nil
}

// debugSupport caches, per binary path, whether it accepts --enable-debug-command.
var debugSupport sync.Map // string → bool

// allowsDebugCommand reports whether the redis-server at bin is version 7 or
// later, which has (and needs) the enable-debug-command option.
func allowsDebugCommand(bin string) bool {
	if v, ok := debugSupport.Load(bin); ok {
		return v.(bool)
	}
	out, _ := exec.Command(bin, "--version").Output()
	major, ok := serverMajorVersion(string(out))
	v := ok && major >= 7
	debugSupport.Store(bin, v)
	return v
}

// serverMajorVersion extracts the major version from `redis-server --version`
// output such as "Redis server v=7.0.15 sha=00000000:0 ...".
func serverMajorVersion(out string) (int, bool) {
	for f := range strings.FieldsSeq(out) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			major, _, _ := strings.Cut(v, ".")
			n, err := strconv.Atoi(major)
			return n, err == nil
		}
	}
	return 0, false
}
