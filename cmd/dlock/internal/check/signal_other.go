//go:build !unix

package check

import "syscall"

// Windows has neither SIGSTOP nor SIGCONT: os.Process.Signal refuses them, so the
// pause faults leave workers running there. The values are Linux's, for the type only.
const sigStop, sigCont = syscall.Signal(19), syscall.Signal(18)
