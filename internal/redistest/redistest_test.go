package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	found := func(string) (string, error) { return "/usr/bin/redis-server", nil }
	missing := func(name string) (string, error) { return "", fmt.Errorf("exec: %q: not found", name) }
	tests := []struct {
		name     string
		envVar   string
		env      map[string]string
		lookPath func(string) (string, error)
		want     setup
	}{
		{
			name:     "binary on PATH",
			envVar:   EnvAddr,
			lookPath: found,
			want:     setup{binary: "/usr/bin/redis-server"},
		},
		{
			name:     "REDIS_ADDR wins over the binary",
			envVar:   EnvAddr,
			env:      map[string]string{EnvAddr: " redis.internal:6379 "},
			lookPath: found,
			want:     setup{external: []string{"redis.internal:6379"}},
		},
		{
			name:     "REDIS_ADDR without binary",
			envVar:   EnvAddr,
			env:      map[string]string{EnvAddr: "10.0.0.1:6379", EnvCI: "true"},
			lookPath: missing,
			want:     setup{external: []string{"10.0.0.1:6379"}},
		},
		{
			name:     "blank REDIS_ADDR is unset",
			envVar:   EnvAddr,
			env:      map[string]string{EnvAddr: "  "},
			lookPath: missing,
			want:     setup{skip: "redis-server not found on PATH; install redis-server or set REDIS_ADDR to run Redis tests"},
		},
		{
			name:     "no binary, not CI: skip",
			envVar:   EnvAddr,
			lookPath: missing,
			want:     setup{skip: "redis-server not found on PATH; install redis-server or set REDIS_ADDR to run Redis tests"},
		},
		{
			name:     "no binary, CI=true: fail",
			envVar:   EnvAddr,
			env:      map[string]string{EnvCI: "true"},
			lookPath: missing,
			want:     setup{fatal: fatalMessage},
		},
		{
			name:     "no binary, CI=1: fail",
			envVar:   EnvAddr,
			env:      map[string]string{EnvCI: "1"},
			lookPath: missing,
			want:     setup{fatal: fatalMessage},
		},
		{
			name:     "no binary, CI=false: skip",
			envVar:   EnvAddr,
			env:      map[string]string{EnvCI: "false"},
			lookPath: missing,
			want:     setup{skip: "redis-server not found on PATH; install redis-server or set REDIS_ADDR to run Redis tests"},
		},
		{
			name:     "Start ignores REDIS_ADDR",
			envVar:   "",
			env:      map[string]string{EnvAddr: "10.0.0.1:6379"},
			lookPath: found,
			want:     setup{binary: "/usr/bin/redis-server"},
		},
		{
			name:     "Start skips without binary, not naming REDIS_ADDR",
			envVar:   "",
			env:      map[string]string{EnvAddr: "10.0.0.1:6379"},
			lookPath: missing,
			want:     setup{skip: "redis-server not found on PATH; install redis-server to run Redis tests that need a private server"},
		},
		{
			name:     "Start ignores REDIS_ADDR and fails in CI without binary",
			envVar:   "",
			env:      map[string]string{EnvAddr: "10.0.0.1:6379", EnvCI: "true"},
			lookPath: missing,
			want:     setup{fatal: fatalMessage},
		},
		{
			name:     "REDIS_CLUSTER_ADDRS split and trimmed",
			envVar:   EnvClusterAddrs,
			env:      map[string]string{EnvClusterAddrs: "a:7000, b:7001,,c:7002 "},
			lookPath: missing,
			want:     setup{external: []string{"a:7000", "b:7001", "c:7002"}},
		},
		{
			name:     "cluster ignores REDIS_ADDR",
			envVar:   EnvClusterAddrs,
			env:      map[string]string{EnvAddr: "10.0.0.1:6379"},
			lookPath: missing,
			want:     setup{skip: "redis-server not found on PATH; install redis-server or set REDIS_CLUSTER_ADDRS to run Redis tests"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var looked []string
			lookPath := func(name string) (string, error) {
				looked = append(looked, name)
				return tt.lookPath(name)
			}
			got := decide(tt.envVar, lookPath, func(k string) string { return tt.env[k] })
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("decide() = %+v, want %+v", got, tt.want)
			}
			for _, name := range looked {
				if name != "redis-server" {
					t.Errorf("looked up %q, want redis-server", name)
				}
			}
		})
	}
}

func TestServerReturnsREDIS_ADDR(t *testing.T) {
	t.Setenv(EnvAddr, "redis.example:6379")
	if got := Server(t); got != "redis.example:6379" {
		t.Errorf("Server() = %q, want REDIS_ADDR", got)
	}
}

func TestClusterReturnsREDIS_CLUSTER_ADDRS(t *testing.T) {
	t.Setenv(EnvClusterAddrs, "a:7000,b:7001")
	if got := Cluster(t); strings.Join(got, " ") != "a:7000 b:7001" {
		t.Errorf("Cluster() = %q, want REDIS_CLUSTER_ADDRS", got)
	}
}

func TestServer(t *testing.T) {
	t.Parallel()
	start := time.Now()
	addr := Server(t)
	t.Logf("Server started in %v", time.Since(start))
	if got := Do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING = %q, want PONG", got)
	}
	key := fmt.Sprintf("redistest:%d:%d", os.Getpid(), time.Now().UnixNano())
	if got := Do(t, addr, "SET", key, "v", "PX", "10000"); got != "OK" {
		t.Errorf("SET = %q, want OK", got)
	}
	if got := Do(t, addr, "GET", key); got != "v" {
		t.Errorf("GET = %q, want v", got)
	}
	if os.Getenv(EnvAddr) == "" {
		if other := Server(t); other == addr {
			t.Errorf("second Server() = %q, want a different private server", other)
		}
	}
}

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	p := Start(t)
	addr := p.Addr()
	if got := Do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING = %q, want PONG", got)
	}
	pid := p.Pid()
	if pid <= 0 {
		t.Fatalf("Pid() = %d, want > 0", pid)
	}
	if got := ParseInfo(Do(t, addr, "INFO", "server"))["process_id"]; got != strconv.Itoa(pid) {
		t.Errorf("INFO process_id = %q, want %d", got, pid)
	}
	// Fault tests use DEBUG SLEEP to make Redis slow; Redis 7 disables it by default.
	if got := Do(t, addr, "DEBUG", "SLEEP", "0"); got != "OK" {
		t.Errorf("DEBUG SLEEP 0 = %q, want OK", got)
	}
	Do(t, addr, "SET", "k", "v")

	p.Stop()
	p.Stop() // idempotent
	if got := p.Pid(); got != 0 {
		t.Errorf("Pid() after Stop = %d, want 0", got)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("dial %s after Stop succeeded, want connection refused", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial %s after Stop: %v, want connection refused", addr, err)
	}

	start := time.Now()
	p.Restart(t)
	t.Logf("Restart took %v", time.Since(start))
	if p.Addr() != addr {
		t.Errorf("Addr() after Restart = %q, want %q", p.Addr(), addr)
	}
	if got := Do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING after Restart = %q, want PONG", got)
	}
	if got := p.Pid(); got <= 0 || got == pid {
		t.Errorf("Pid() after Restart = %d, want a new process (was %d)", got, pid)
	}
	if got := Do(t, addr, "EXISTS", "k"); got != "0" {
		t.Errorf("EXISTS k after Restart = %q, want 0 (empty server)", got)
	}
	p.Restart(t) // restarting a running server works too
	if got := Do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING after second Restart = %q, want PONG", got)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	addrs := Cluster(t)
	t.Logf("Cluster started in %v", time.Since(start))
	if os.Getenv(EnvClusterAddrs) == "" && len(addrs) != clusterMasters {
		t.Fatalf("Cluster() returned %d addresses, want %d", len(addrs), clusterMasters)
	}
	for _, addr := range addrs {
		info := ParseInfo(Do(t, addr, "CLUSTER", "INFO"))
		for k, want := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": "16384",
			"cluster_size":           "3",
		} {
			if info[k] != want {
				t.Errorf("%s: %s = %q, want %q", addr, k, info[k], want)
			}
		}
	}

	// Route a key by its hash tag: the owner accepts it, another node redirects.
	tag := fmt.Sprintf("redistest-%d-%d", os.Getpid(), time.Now().UnixNano())
	key := "{" + tag + "}a"
	slot := keySlot(key)
	owner := slotOwner(t, addrs[0], slot)
	if got := Do(t, owner, "SET", key, "1", "PX", "10000"); got != "OK" {
		t.Errorf("SET %s on owner %s = %q, want OK", key, owner, got)
	}
	if got := Do(t, owner, "CLUSTER", "KEYSLOT", key); got != strconv.Itoa(slot) {
		t.Errorf("CLUSTER KEYSLOT %s = %s, want %d", key, got, slot)
	}
	for _, addr := range addrs {
		if addr == owner {
			continue
		}
		_, err := Exec(t.Context(), addr, "GET", key)
		want := fmt.Sprintf("MOVED %d %s", slot, owner)
		var re ReplyError
		if !errors.As(err, &re) || string(re) != want {
			t.Errorf("GET %s on %s: err = %v, want %q", key, addr, err, want)
		}
	}
}

func TestStartClusterNodeRestart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	nodes := StartCluster(t)
	t.Logf("StartCluster took %v", time.Since(start))
	n := nodes[1]
	n.Stop()
	start = time.Now()
	n.Restart(t)
	t.Logf("Restart took %v", time.Since(start))
	// The restarted node keeps its identity and slots from nodes.conf.
	info := ParseInfo(Do(t, n.Addr(), "CLUSTER", "INFO"))
	if info["cluster_slots_assigned"] != "16384" || info["cluster_known_nodes"] != "3" {
		t.Errorf("restarted node: cluster_slots_assigned=%q cluster_known_nodes=%q, want 16384 and 3",
			info["cluster_slots_assigned"], info["cluster_known_nodes"])
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	a, b := FreePort(t), FreePort(t)
	if a == b || a <= 0 || b <= 0 {
		t.Fatalf("FreePort() = %d, %d, want two distinct ports", a, b)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(a)))
	if err != nil {
		t.Fatalf("listen on FreePort() %d: %v", a, err)
	}
	l.Close()
}

func TestServerMajorVersion(t *testing.T) {
	tests := []struct {
		out  string
		want int
		ok   bool
	}{
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0", 7, true},
		{"Redis server v=6.2.14 sha=00000000:0", 6, true},
		{"Redis server v=x.y", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := serverMajorVersion(tt.out)
		if got != tt.want || ok != tt.ok {
			t.Errorf("serverMajorVersion(%q) = %d, %v, want %d, %v", tt.out, got, ok, tt.want, tt.ok)
		}
	}
}

func TestSlotRange(t *testing.T) {
	next := 0
	for i := range clusterMasters {
		lo, hi := slotRange(i, clusterMasters)
		if lo != next || hi < lo {
			t.Fatalf("slotRange(%d) = %d-%d, want it to start at %d", i, lo, hi, next)
		}
		next = hi + 1
	}
	if next != clusterSlots {
		t.Fatalf("slot ranges end at %d, want %d", next-1, clusterSlots-1)
	}
}

// slotOwner returns the address of the node that serves slot, per CLUSTER SLOTS.
func slotOwner(t *testing.T, addr string, slot int) string {
	t.Helper()
	reply, err := Exec(t.Context(), addr, "CLUSTER", "SLOTS")
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	ranges, _ := reply.([]any)
	for _, r := range ranges {
		// Each range: start, end, [ip, port, id, ...], replicas...
		fields, _ := r.([]any)
		if len(fields) < 3 {
			t.Fatalf("CLUSTER SLOTS range %v: too short", r)
		}
		lo, _ := fields[0].(int64)
		hi, _ := fields[1].(int64)
		master, _ := fields[2].([]any)
		if len(master) < 2 {
			t.Fatalf("CLUSTER SLOTS range %v: bad master", r)
		}
		ip, _ := master[0].(string)
		port, _ := master[1].(int64)
		if int64(slot) >= lo && int64(slot) <= hi {
			return net.JoinHostPort(ip, strconv.FormatInt(port, 10))
		}
	}
	t.Fatalf("no node serves slot %d in %v", slot, reply)
	return ""
}

// keySlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, if it has a non-empty one, or of the whole key, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// TestForMain starts a server without a testing.TB and stops it.
func TestForMain(t *testing.T) {
	addr, stop, skip, err := ForMain()
	if err != nil {
		t.Fatal(err)
	}
	if skip != "" {
		t.Skip(skip)
	}
	if got := Do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	stop()
	if os.Getenv(EnvAddr) == "" {
		if _, err := Exec(context.Background(), addr, "PING"); err == nil {
			t.Fatal("server still answers after stop")
		}
	}
}
