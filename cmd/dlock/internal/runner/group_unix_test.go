//go:build unix

package runner

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive reports whether process pid exists and is not a zombie: an orphan's zombie
// lingers where init does not reap (as in many containers), and runs no code.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err) // no /proc: kill(pid, 0) is all we know
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// The command exits and leaves processes in its group: they are stopped (SIGTERM,
// or SIGKILL after the grace period) before Run releases the lease and returns.
func TestStragglersStoppedBeforeRelease(t *testing.T) {
	for _, tc := range []struct{ name, trap string }{
		{"obeys TERM", ``},
		{"ignores TERM", `trap "" TERM;`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			dir := t.TempDir()
			pidFile, ready := filepath.Join(dir, "pid"), filepath.Join(dir, "ready")
			// The grandchild writes its pid and sets its trap before the child
			// exits.
			grandchild := `echo $$ > "$0"; ` + tc.trap + ` touch "$1"; exec sleep 1000`
			script := `sh -c "$2" "$0" "$1" & while [ ! -e "$1" ]; do sleep 0.01; done`
			if code := e.run(t, e.cfg("job", "sh", "-c", script, pidFile, ready, grandchild)); code != 0 {
				t.Fatalf("exit %d, want 0 (stderr: %s)", code, e.errout)
			}
			if pid := readPid(t, pidFile); alive(pid) {
				t.Fatalf("the command's background process %d still runs after the lease was released", pid)
			}
			if _, err := e.store.Backend().Inspect(context.Background(), "job"); err == nil {
				t.Fatal("lock still held after the run")
			}
		})
	}
}

// A forwarded signal reaches the whole group, and the lease is released only once
// the group is gone.
func TestSignalReachesGroup(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	pidFile, ready := filepath.Join(dir, "pid"), filepath.Join(dir, "ready")
	done := make(chan int, 1)
	go func() {
		done <- e.run(t, e.cfg("job", "sh", "-c", `sleep 1000 & echo $! > "$0"; touch "$1"; wait`, pidFile, ready))
	}()
	sigs := <-e.sigs
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	pid := readPid(t, pidFile)
	sigs <- syscall.SIGTERM
	if code := <-done; code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want %d (stderr: %s)", code, 128+int(syscall.SIGTERM), e.errout)
	}
	if alive(pid) {
		t.Fatalf("grandchild %d still runs after the lease was released", pid)
	}
}

func TestNotExecutable(t *testing.T) {
	e := setup(t)
	path := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := e.run(t, e.cfg("job", path)); code != ExitCannotRun {
		t.Fatalf("not executable: exit %d, want %d (stderr: %s)", code, ExitCannotRun, e.errout)
	}
	if code := e.run(t, e.cfg("job", t.TempDir())); code != ExitCannotRun {
		t.Fatalf("a directory: exit %d, want %d", code, ExitCannotRun)
	}
	if code := e.run(t, e.cfg("job", "no-such-program-dlock-test")); code != ExitNoCommand {
		t.Fatalf("not in $PATH: exit %d, want %d", code, ExitNoCommand)
	}
}

// The child does not see the backend's password.
func TestChildEnvHasNoPassword(t *testing.T) {
	e := setup(t)
	cfg := e.cfg("job", "env")
	cfg.Env = []string{"PATH=" + os.Getenv("PATH"), "KEEP=1", "DLOCK_PASSWORD=hunter2",
		"DLOCK_URL=redis://:hunter2@127.0.0.1:6379/0", "DLOCK_TOKEN=999"}
	if code := e.run(t, cfg); code != 0 {
		t.Fatalf("exit %d (stderr: %s)", code, e.errout)
	}
	out := e.out.String()
	if strings.Contains(out, "hunter2") || strings.Contains(out, "DLOCK_URL") || strings.Contains(out, "999") {
		t.Fatalf("the child's environment holds a secret or a stale variable:\n%s", out)
	}
	if !strings.Contains(out, "KEEP=1") || !strings.Contains(out, "DLOCK_TOKEN=1\n") {
		t.Fatalf("the child's environment lacks its variables:\n%s", out)
	}

	for raw, secret := range map[string]bool{
		"redis://127.0.0.1:6379/0":                    false,
		"etcd://user@h1:2379,h2:2379/app":             false,
		"redis://:pw@127.0.0.1/0":                     true,
		"zk://u:pw@h:2181/x":                          true,
		"postgres://u@h/db?sslpassword=pw":            true,
		"postgres://u@h/db?sslmode=require&password=": true,
		"redis://%zz":                                 true,
	} {
		if got := urlHasSecret(raw); got != secret {
			t.Errorf("urlHasSecret(%q) = %v, want %v", raw, got, secret)
		}
	}
}

// The watchdog kills the group it watches when the pipe from the runner ends
// without "q", and leaves it alone after "q".
func TestWatchdog(t *testing.T) {
	for _, tc := range []struct {
		name     string
		say      string
		wantKill bool
	}{
		{"runner died", "", true},
		{"normal end", "q", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim := exec.Command("sleep", "1000")
			victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := victim.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if victim.ProcessState == nil { // the test failed early
					_ = victim.Process.Kill()
					_ = victim.Wait()
				}
			})
			wd, err := startWatchdog()
			if err != nil {
				t.Fatal(err)
			}
			if err := wd.watch(victim.Process.Pid); err != nil {
				t.Fatal(err)
			}
			_, _ = wd.w.Write([]byte(tc.say))
			wd.w.Close() // as when the runner dies
			if err := wd.cmd.Wait(); err != nil {
				t.Fatalf("watchdog: %v", err)
			}
			if !tc.wantKill {
				if !alive(victim.Process.Pid) {
					t.Fatal("the watchdog killed the group after a normal end")
				}
				_ = syscall.Kill(-victim.Process.Pid, syscall.SIGKILL)
			}
			err = victim.Wait()
			ws, _ := victim.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the group's process ended with %v, want SIGKILL", err)
			}
		})
	}
}
