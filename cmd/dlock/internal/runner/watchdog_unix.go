//go:build unix

package runner

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// watchdog is a small process, the runner's own executable started again, that
// kills the child's process group if the runner dies. It holds the read end of a pipe
// whose write end only the runner has: the runner writes the group's id, and, at a
// normal end, "q". If the pipe reaches end-of-file first, the runner died (kill -9,
// the OOM killer, a crash) and the watchdog sends SIGKILL to the group: the lease
// is no longer renewed and may pass to another holder at any moment.
type watchdog struct {
	cmd *exec.Cmd
	w   *os.File
}

// The watchdog's pipe is its file descriptor 3.
const watchdogFD = 3

func startWatchdog() (*watchdog, error) {
	exe, err := selfExe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe() // close-on-exec: the child does not inherit w
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	// GORACE: a race-detector build would otherwise linger a second at exit.
	cmd.Env = []string{watchdogEnv + "=1", "GORACE=atexit_sleep_ms=0"}
	cmd.ExtraFiles = []*os.File{r}
	cmd.Stderr = os.Stderr
	// Its own group, so that Ctrl-C at a terminal (sent to the runner's group) does
	// not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	return &watchdog{cmd: cmd, w: w}, nil
}

// watch hands the group's id to the watchdog.
func (wd *watchdog) watch(pgid int) error {
	_, err := fmt.Fprintf(wd.w, "%d\n", pgid)
	return err
}

// close ends the watchdog. When the group is gone it must never signal the group's
// id, which may be reused: it is told "q", and killed rather than waited for while
// it starts up. Otherwise the pipe is closed, and it kills the group once more.
func (wd *watchdog) close(gone bool) {
	if gone {
		_, _ = wd.w.Write([]byte("q"))
		_ = wd.cmd.Process.Kill()
	}
	wd.w.Close()
	_ = wd.cmd.Wait()
}

// MaybeRunWatchdog must be called first thing in main by every program that calls
// Run (and in TestMain of tests that do): when the process was started as a run's
// watchdog it does that job and exits; otherwise it returns at once.
func MaybeRunWatchdog() {
	if os.Getenv(watchdogEnv) != "1" {
		return
	}
	os.Exit(runWatchdog(os.NewFile(watchdogFD, "dlock-run-watchdog")))
}

func runWatchdog(f *os.File) int {
	// Signals meant for the runner or the command (a terminal's Ctrl-C, a TERM to
	// a group) must not end the watchdog; only the pipe does.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if f == nil {
		return 2
	}
	r := bufio.NewReader(f)
	line, err := r.ReadString('\n')
	if err != nil {
		return 0 // the runner ended before it started the command
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pgid <= 1 {
		return 2
	}
	if b, err := r.ReadByte(); err == nil && b == 'q' {
		return 0
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err == nil {
		fmt.Fprintf(os.Stderr, "dlock: run ended without stopping its command; killed process group %d\n", pgid)
	}
	return 0
}
