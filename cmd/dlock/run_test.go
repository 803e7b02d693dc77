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
	if code, _, _ := run("release", "--force", "--backend", srv.URL(), "job"); code != 1 {
		t.Fatalf("release --force of a free key: exit %d, want 1", code)
	}
	for _, args := range [][]string{{"inspect", "--backend", srv.URL()}, {"inspect", "--backend", srv.URL(), "a", "b"}, {"release", "--force", "--backend", srv.URL(), ""}} {
		if code, _, _ := run(args...); code != 64 {
			t.Errorf("dlock %v: exit %d, want 64", args, code)
		}
	}
}
