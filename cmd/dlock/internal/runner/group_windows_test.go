package runner

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

func startTestGroup(t *testing.T, args ...string) (*group, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	g, err := startGroup(cmd, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if g.job == 0 {
		t.Fatal("no job object")
	}
	t.Cleanup(func() { g.close(false) })
	return g, cmd
}

func waitGone(t *testing.T, g *group) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !g.gone() {
		if time.Now().After(deadline) {
			t.Fatal("processes of the job still running after 10s")
		}
		time.Sleep(pollInterval)
	}
}

// The child, created suspended, runs once it is in the job, and its exit status
// comes through.
func TestJobRunsChild(t *testing.T) {
	g, cmd := startTestGroup(t, "cmd", "/c", "exit 3")
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("child ended with %v, want exit status 3", err)
	}
	waitGone(t, g)
}

// KILL ends the child and the processes it started, which stay in the job.
func TestJobTerminateEndsDescendants(t *testing.T) {
	g, cmd := startTestGroup(t, "cmd", "/c", "start /b ping -n 120 127.0.0.1 >NUL & ping -n 120 127.0.0.1 >NUL")
	time.Sleep(500 * time.Millisecond)
	if g.gone() {
		t.Fatal("the job is empty while its processes run")
	}
	g.signal(os.Kill)
	_ = cmd.Wait()
	waitGone(t, g)
}

// Run on Windows: the command's exit status is dlock's, and the lock is released.
func TestRunWindows(t *testing.T) {
	e := setup(t)
	if code := e.run(t, e.cfg("job", "cmd", "/c", "exit 4")); code != 4 {
		t.Fatalf("exit %d, want 4 (stderr %s)", code, e.errout)
	}
}
