package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// ForMain returns the address of a Redis server for a whole test binary,
// for a TestMain whose examples need one (examples take no testing.TB):
// the one named by REDIS_ADDR if that is set, otherwise a fresh private
// redis-server, which stop kills (call it after m.Run). Without a
// redis-server binary it returns "" and a message saying why, unless CI
// is set, when it returns an error; examples needing the server should
// then be skipped (go test's -skip flag), since they cannot skip
// themselves.
func ForMain() (addr string, stop func(), skip string, err error) {
	s := decide(EnvAddr, exec.LookPath, os.Getenv)
	switch {
	case s.fatal != "":
		return "", nil, "", errors.New("redistest: " + s.fatal)
	case s.skip != "":
		return "", nil, s.skip, nil
	case s.external != nil:
		return s.external[0], func() {}, "", nil
	}
	dir, err := os.MkdirTemp("", "redistest-main-")
	if err != nil {
		return "", nil, "", fmt.Errorf("redistest: %w", err)
	}
	p := &Process{bin: s.binary, dir: dir}
	for range startAttempts {
		if p.port, err = reservePort(false); err != nil {
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
		os.RemoveAll(dir)
		return "", nil, "", fmt.Errorf("redistest: %w", err)
	}
	return p.Addr(), func() { p.Stop(); os.RemoveAll(dir) }, "", nil
}
