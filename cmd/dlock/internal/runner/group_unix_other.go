//go:build unix && !linux

package runner

import (
	"os"
	"syscall"
)

// prepareChild has nothing to add outside Linux: no parent-death signal; the
// watchdog stops the group if the runner dies.
func prepareChild(*syscall.SysProcAttr) {}

// selfExe is the runner's own executable.
func selfExe() (string, error) { return os.Executable() }
