package redistest

import "syscall"

// sysProcAttr makes the kernel kill a private server if the test binary dies
// without running its cleanups (for example on a go test -timeout panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
