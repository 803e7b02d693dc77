//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// exitOf runs the dlock command line in a child process and returns its exit code.
func exitOf(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run: %v", err)
	}
	return cmd.ProcessState.ExitCode()
}

func redisFor(t *testing.T) (*testserver.Redis, *redis.Client) {
	srv := testserver.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

func holdLock(t *testing.T, url, key string) *dlock.Lease {
	t.Helper()
	c, err := dlock.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l, err := c.Lock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunExitCodes(t *testing.T) {
	srv, _ := redisFor(t)
	ctx := context.Background()
	var out, errb strings.Builder

	cmd := command(ctx, "run", "--backend", srv.URL(), "job", "--", "sh", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN $DLOCK_HELD"; exit 3`)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if code := exitOf(t, cmd); code != 3 {
		t.Fatalf("child's status: exit %d, want 3 (stderr %q)", code, errb.String())
	}
	f := strings.Fields(out.String())
	if len(f) != 3 || f[0] != "job" || f[2] != "1" {
		t.Fatalf("child saw %q", out.String())
	}
	if tok, err := strconv.ParseUint(f[1], 10, 64); err != nil || tok == 0 {
		t.Fatalf("DLOCK_TOKEN = %q", f[1])
	}

	// --wait 0 on a held lock: 75 at once.
	l := holdLock(t, srv.URL(), "held")
	start := time.Now()
	cmd = command(ctx, "run", "--backend", srv.URL(), "--wait", "0", "held", "--", "true")
	if code := exitOf(t, cmd); code != 75 {
		t.Fatalf("--wait 0 on a held lock: exit %d, want 75", code)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("--wait 0 took %v", el)
	}
	cmd = command(ctx, "run", "--backend", srv.URL(), "--wait", "300ms", "held", "--", "true")
	if code := exitOf(t, cmd); code != 75 {
		t.Fatalf("--wait 300ms on a held lock: exit %d, want 75", code)
	}
	_ = l.Release(ctx)

	// Unreachable backend: 69, and the password is not printed.
	port := testserver.FreePort(t)
	errb.Reset()
	cmd = command(ctx, "run", "--backend", "redis://:hunter2@127.0.0.1:"+strconv.Itoa(port)+"/0", "job", "--", "true")
	cmd.Stderr = &errb
	if code := exitOf(t, cmd); code != 69 {
		t.Fatalf("unreachable backend: exit %d, want 69 (stderr %q)", code, errb.String())
	}
	if strings.Contains(errb.String(), "hunter2") {
		t.Fatalf("password printed: %q", errb.String())
	}

	// Bad URL, missing command, missing backend: 64.
	for _, args := range [][]string{
		{"run", "--backend", "nosuch://x", "job", "--", "true"},
		{"run", "--backend", srv.URL() + "?bogus=1", "job", "--", "true"},
		{"run", "--backend", srv.URL(), "job", "--"},
		{"run", "--backend", srv.URL(), "job", "true"},
		{"run", "--backend", srv.URL(), "--ttl", "-1s", "job", "--", "true"},
		{"run", "--backend", srv.URL(), "--grace", "-1s", "job", "--", "true"},
		{"run", "job", "--", "true"},
	} {
		cmd := command(ctx, args...)
		cmd.Env = append(cmd.Env, "DLOCK_URL=")
		if code := exitOf(t, cmd); code != 64 {
			t.Errorf("dlock %v: exit %d, want 64", args, code)
		}
	}
	// The command does not exist: 127.
	if code := exitOf(t, command(ctx, "run", "--backend", srv.URL(), "job", "--", "/nonexistent/x")); code != 127 {
		t.Fatalf("missing program: exit %d, want 127", code)
	}
}

// The lease is lost while the child runs (the server drops the key): the child is
// stopped within TTL + grace, and dlock exits 76.
func TestRunLeaseLost(t *testing.T) {
	srv, rdb := redisFor(t)
	ctx := context.Background()
	pidFile := filepath.Join(t.TempDir(), "pid")
	var errb strings.Builder
	cmd := command(ctx, "run", "--backend", srv.URL(), "--ttl", "1s", "--grace", "500ms", "job", "--",
		"sh", "-c", `trap "" TERM; echo $$ > `+pidFile+`; exec sleep 60`)
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { _, err := os.Stat(pidFile); return err == nil })
	if err := rdb.Del(ctx, "dlock:lock\x1fjob").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 76 {
		t.Fatalf("exit %d (%v), want 76; stderr %q", code, err, errb.String())
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("child stopped %v after the lease was dropped", el)
	}
	if !strings.Contains(errb.String(), "lost") {
		t.Fatalf("no message about the lost lease: %q", errb.String())
	}
	pid, _ := os.ReadFile(pidFile)
	n, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	if n > 0 && syscall.Kill(n, 0) == nil {
		t.Fatalf("child %d still running", n)
	}
}

// Ctrl-C while waiting leaves no waiter behind; Ctrl-C while the child runs reaches
// the child, and the lock is released.
func TestRunInterrupt(t *testing.T) {
	srv, rdb := redisFor(t)
	ctx := context.Background()
	l := holdLock(t, srv.URL(), "job")
	cmd := command(ctx, "run", "--backend", srv.URL(), "--wait", "forever", "job", "--", "true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "dlock to queue", func() bool { n, _ := rdb.LLen(ctx, "dlock:queue\x1fjob").Result(); return n == 1 })
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("interrupted wait: exit %d, want 130", code)
	}
	if n, _ := rdb.LLen(ctx, "dlock:queue\x1fjob").Result(); n != 0 {
		t.Fatalf("%d queued waiters left behind", n)
	}
	_ = l.Release(ctx)

	ready := filepath.Join(t.TempDir(), "ready")
	cmd = command(ctx, "run", "--backend", srv.URL(), "job", "--", "sh", "-c", `trap "exit 9" INT; touch `+ready+`; while :; do sleep 0.05; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { _, err := os.Stat(ready); return err == nil })
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 9 {
		t.Fatalf("forwarded SIGINT: exit %d, want the child's 9", code)
	}
	if n, _ := rdb.Exists(ctx, "dlock:lock\x1fjob").Result(); n != 0 {
		t.Fatal("lock left behind after Ctrl-C")
	}
}

func TestInspectAndRelease(t *testing.T) {
	srv, _ := redisFor(t)
	code, out, _ := run("inspect", "--backend", srv.URL(), "job")
	if code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("inspect free key: %d %q", code, out)
	}
	l := holdLock(t, srv.URL(), "job")
	code, out, _ = run("inspect", "--backend", srv.URL(), "job")
	if code != 0 || !strings.Contains(out, l.Owner()) || !strings.Contains(out, strconv.FormatUint(uint64(l.Token()), 10)) {
		t.Fatalf("inspect: %d %q", code, out)
	}
	code, out, _ = run("inspect", "--json", "--backend", srv.URL(), "job")
	var info struct {
		Held  bool   `json:"held"`
		Owner string `json:"owner"`
		Token uint64 `json:"token"`
		TTL   int64  `json:"ttl_ms"`
	}
	if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil || !info.Held || info.Owner != l.Owner() || info.Token != uint64(l.Token()) || info.TTL <= 0 {
		t.Fatalf("inspect --json: %d %q %v", code, out, err)
	}

	if code, _, _ := run("release", "--backend", srv.URL(), "job"); code != 64 {
		t.Fatalf("release without --force: exit %d, want 64", code)
	}
	code, _, errs := run("release", "--force", "--backend", srv.URL(), "job")
	if code != 0 || !strings.Contains(errs, "may still be running") {
		t.Fatalf("release --force: %d %q", code, errs)
	}
	code, out, _ = run("inspect", "--backend", srv.URL(), "job")
	if code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("after force release: %d %q", code, out)
	}
	// Idempotent: a free key is reported free, and that is success.
	if code, _, errs := run("release", "--force", "--backend", srv.URL(), "job"); code != 0 || errs != "dlock: job was free; nothing to release\n" {
		t.Fatalf("release --force of a free key: exit %d, want 0; stderr %q", code, errs)
	}
	for _, args := range [][]string{{"inspect", "--backend", srv.URL()}, {"inspect", "--backend", srv.URL(), "a", "b"}, {"release", "--force", "--backend", srv.URL(), ""}} {
		if code, _, _ := run(args...); code != 64 {
			t.Errorf("dlock %v: exit %d, want 64", args, code)
		}
	}
}

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

// pidIn reads a pid that a test's command wrote, and kills it when the test ends
// (after a failure it may still run).
func pidIn(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("%s: %q", path, b)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// TERM to dlock run reaches the command's whole group, and the lock passes to the
// next holder only once the group is gone: no grandchild writes beside it.
func TestRunTermStopsGroupBeforeRelease(t *testing.T) {
	srv, _ := redisFor(t)
	for _, tc := range []struct{ name, trap string }{
		{"obeys TERM", ``},
		{"ignores TERM", `trap "" TERM;`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := strings.ReplaceAll(tc.name, " ", "-")
			dir := t.TempDir()
			pidFile, ready := filepath.Join(dir, "pid"), filepath.Join(dir, "ready")
			// The grandchild writes its pid and sets its trap, then says it is ready.
			script := `echo $$ > "$0"; ` + tc.trap + ` touch "$1"; exec sleep 1000`
			cmd := command(ctx, "run", "--backend", srv.URL(), "--grace", "300ms", key, "--",
				"sh", "-c", `sh -c "$2" "$0" "$1" & wait`, pidFile, ready, script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the command to start", func() bool { _, err := os.Stat(ready); return err == nil })
			grandchild := pidIn(t, pidFile)

			c, err := dlock.Open(ctx, srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := c.Lock(lctx, key)
			if err != nil {
				t.Fatalf("the next holder: %v", err)
			}
			stillRunning := alive(grandchild)
			_ = l.Release(ctx)
			_ = cmd.Wait()
			if stillRunning {
				t.Fatalf("grandchild %d still ran when the next holder acquired the lock", grandchild)
			}
			if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
				t.Fatalf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
			}
		})
	}
}

// kill -9 of dlock run: the command and its group die with it.
func TestRunKilledTakesGroupAlong(t *testing.T) {
	srv, _ := redisFor(t)
	ctx := context.Background()
	dir := t.TempDir()
	childFile, grandchildFile, ready := filepath.Join(dir, "child"), filepath.Join(dir, "grandchild"), filepath.Join(dir, "ready")
	cmd := command(ctx, "run", "--backend", srv.URL(), "job", "--",
		"sh", "-c", `sleep 1000 & echo $! > "$1"; echo $$ > "$0"; touch "$2"; wait`, childFile, grandchildFile, ready)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command to start", func() bool { _, err := os.Stat(ready); return err == nil })
	child, grandchild := pidIn(t, childFile), pidIn(t, grandchildFile)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, "the command and its child to die with dlock", func() bool { return !alive(child) && !alive(grandchild) })
}

// The backend's password can be given without argv, and the command never sees it.
func TestRunPassword(t *testing.T) {
	srv := testserver.StartRedis(t, "--user", "app", "on", ">s3cret", "~*", "&*", "+@all")
	ctx := context.Background()
	withPw := "redis://app:s3cret@" + srv.Addr() + "/0"
	noPw := "redis://app@" + srv.Addr() + "/0"
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"DLOCK_URL with a password", []string{"DLOCK_URL=" + withPw}, nil, 0},
		{"DLOCK_PASSWORD", []string{"DLOCK_URL=" + noPw, "DLOCK_PASSWORD=s3cret"}, nil, 0},
		{"--password-file", []string{"DLOCK_URL="}, []string{"--backend", noPw, "--password-file", pwFile}, 0},
		{"wrong password", []string{"DLOCK_URL=", "DLOCK_PASSWORD=wrong"}, []string{"--backend", noPw}, 77},
		{"two passwords", []string{"DLOCK_URL=", "DLOCK_PASSWORD=s3cret"}, []string{"--backend", withPw}, 64},
		{"missing file", []string{"DLOCK_URL="}, []string{"--backend", noPw, "--password-file", pwFile + ".nope"}, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"run"}, tc.args...), "job", "--", "env")
			cmd := command(ctx, args...)
			cmd.Env = append(cmd.Env, tc.env...)
			var out, errb strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errb
			if code := exitOf(t, cmd); code != tc.want {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.want, errb.String())
			}
			if strings.Contains(out.String()+errb.String(), "s3cret") {
				t.Fatalf("password shown:\nstdout %s\nstderr %s", out.String(), errb.String())
			}
			if tc.want == 0 && !strings.Contains(out.String(), "DLOCK_HELD=1") {
				t.Fatalf("the command did not run: %q", out.String())
			}
		})
	}
}

// A command that exists but cannot be executed exits 126, as in the shell; one
// that does not exist, 127.
func TestRunNotExecutable(t *testing.T) {
	srv, _ := redisFor(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, command(ctx, "run", "--backend", srv.URL(), "job", "--", path)); code != 126 {
		t.Fatalf("not executable: exit %d, want 126", code)
	}
	if code := exitOf(t, command(ctx, "run", "--backend", srv.URL(), "job", "--", "no-such-program-dlock-test")); code != 127 {
		t.Fatalf("not found: exit %d, want 127", code)
	}
}

// The library's errors start with "dlock: "; the command line does not add another.
func TestNoDoubledPrefix(t *testing.T) {
	for _, args := range [][]string{
		{"inspect", "--backend", "nosuch://x", "job"},
		{"inspect", "--backend", "mem://?bogus=1", "job"},
		{"inspect", "--backend", "mem://", ""},
		{"release", "--force", "--backend", "mem://", ""},
		{"run", "--backend", "mem://?bogus=1", "job", "--", "true"},
		{"run", "--backend", "mem://", "--owner", "bad owner", "job", "--", "true"},
	} {
		code, _, stderr := run(args...)
		if code == 0 || !strings.HasPrefix(stderr, "dlock: ") || strings.Contains(stderr, "dlock: dlock:") {
			t.Errorf("dlock %q: exit %d, stderr %q", args, code, stderr)
		}
	}
}
