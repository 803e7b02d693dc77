//go:build unix && !linux

package testserver

import (
	"errors"
	"syscall"
)

// procAttr starts a server process in its own process group when group is set, as
// the user cred when it is not nil. There is no parent-death signal outside Linux: a
// test binary that dies without running its cleanups (kill -9) leaves its servers
// running.
func procAttr(group bool, cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: group, Credential: cred}
}

// groupAlive reports whether a process is in process group pgid. Without /proc it
// cannot tell zombies apart: they count as alive until reaped.
func groupAlive(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}
