//go:build unix

package runner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// group is the child's process group: the child leads it, and its descendants stay
// in it unless they leave (setsid, setpgid).
type group struct {
	cmd  *exec.Cmd
	pgid int
	wd   *watchdog // nil if it could not be started
}

// startGroup starts cmd as the leader of a new process group, watched by a watchdog
// that kills the group if the runner dies. warnf reports a watchdog that could not
// be started; the command runs anyway.
func startGroup(cmd *exec.Cmd, warnf func(format string, a ...any)) (*group, error) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	prepareChild(attr)
	cmd.SysProcAttr = attr
	// The watchdog starts first: if the runner dies after starting the child, the
	// watchdog already holds the pipe that tells it so.
	wd, err := startWatchdog()
	if err != nil {
		warnf("no watchdog (%v): the command would outlive a killed dlock", err)
	}
	if err := cmd.Start(); err != nil {
		if wd != nil {
			wd.close(true)
		}
		return nil, err
	}
	g := &group{cmd: cmd, pgid: cmd.Process.Pid, wd: wd}
	if wd != nil {
		if err := wd.watch(g.pgid); err != nil {
			warnf("watchdog lost (%v): the command would outlive a killed dlock", err)
		}
	}
	return g, nil
}

// signal sends sig to every process of the group.
//
// Once the child has been reaped its pid, the group's id, may in principle be reused
// for a new group as soon as the group is empty; gone is checked before the runner
// signals again, which leaves only the instant between the two, as for any kill(2).
func (g *group) signal(sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(-g.pgid, s)
	}
}

// gone reports whether no process of the group remains. It is called only after the
// child itself was reaped; it reaps the group's processes that became the runner's
// children (see prepareChild), whose zombies would otherwise still count.
func (g *group) gone() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-g.pgid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return errors.Is(syscall.Kill(-g.pgid, 0), syscall.ESRCH)
}

// close dismisses the watchdog: quietly if the group is gone, else after it kills
// the group once more.
func (g *group) close(gone bool) {
	if g.wd != nil {
		g.wd.close(gone)
	}
}

func (g *group) String() string { return fmt.Sprintf("process group %d", g.pgid) }
