//go:build !unix && !windows

package runner

import (
	"os"
	"os/exec"
)

// group is the child alone: without process groups, signals reach only the child,
// and nothing stops it if the runner is killed.
type group struct{ cmd *exec.Cmd }

func startGroup(cmd *exec.Cmd, _ func(format string, a ...any)) (*group, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &group{cmd: cmd}, nil
}

func (g *group) signal(sig os.Signal) {
	_ = g.cmd.Process.Signal(sig) // on Windows only SIGKILL can be delivered
}

// gone is called once the child was reaped, which is all there is to wait for.
func (g *group) gone() bool { return true }

func (g *group) close(bool) {}

// MaybeRunWatchdog does nothing on this system: there is no watchdog.
func MaybeRunWatchdog() {}
