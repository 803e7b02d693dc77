//go:build !unix

package testserver

import (
	"os"
	"syscall"
)

// credential is the user a server process runs as; only Unix systems switch users.
type credential struct{ Uid, Gid uint32 }

// Windows has neither SIGSTOP nor SIGCONT: os.Process.Signal refuses them, so Pause
// and Resume do nothing there. The values are Linux's, for the type only.
const sigStop, sigCont = syscall.Signal(19), syscall.Signal(18)

// serverCredential: the server runs as the test's own user.
func serverCredential() (*credential, error) { return nil, nil }

// procAttr has nothing to set: there are no process groups and no parent-death
// signal, so a test binary that dies without running its cleanups leaves its
// servers running.
func procAttr(bool, *credential) *syscall.SysProcAttr { return nil }

// killGroup acts on the group's leader alone, and only SIGKILL (termination) is
// delivered; other signals are refused.
func killGroup(pid int, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	defer p.Release()
	return p.Signal(sig)
}

// groupAlive: without process groups there is nothing but the leader, which the
// caller has waited for.
func groupAlive(int) bool { return false }
