package redistest

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
)

// busPortOffset is the distance from a cluster node's port to its cluster bus port.
const busPortOffset = 10000

var (
	portMu   sync.Mutex
	reserved = map[int]bool{} // ports handed out by this test binary; guarded by portMu
)

// FreePort returns a TCP port on 127.0.0.1 that was free when checked and that
// this package has not handed out before in this test binary. Another process may
// still take it before the caller binds it, so callers should retry on a bind
// failure. It fails tb if no free port can be found.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := reservePort(false)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return port
}

// reservePort finds a free port not reserved before and reserves it. With bus,
// it also requires and reserves port+busPortOffset, a cluster node's bus port.
func reservePort(bus bool) (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for range 100 {
		port, err := kernelPort()
		if err != nil {
			return 0, err
		}
		if reserved[port] {
			continue
		}
		if bus {
			b := port + busPortOffset
			if b > 65535 || reserved[b] || !isFree(b) {
				continue
			}
			reserved[b] = true
		}
		reserved[port] = true
		return port, nil
	}
	return 0, errors.New("no free TCP port found on 127.0.0.1")
}

// kernelPort asks the kernel for a free port by listening on port 0.
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// isFree reports whether port can be listened on now.
func isFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
