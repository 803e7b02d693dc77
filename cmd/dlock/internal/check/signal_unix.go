//go:build unix

package check

import "syscall"

// The pause faults freeze a worker with SIGSTOP and thaw it with SIGCONT.
const sigStop, sigCont = syscall.SIGSTOP, syscall.SIGCONT
