package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/cmd/dlock/internal/runner"
)

// TestMain lets the test binary stand in for the dlock program: with
// DLOCK_TEST_MAIN=1 it runs the command line instead of the tests. The demo starts
// its workers by running its own executable, which in a test is this binary.
func TestMain(m *testing.M) {
	runner.MaybeRunWatchdog()
	if spec := os.Getenv(etcdPeerEnv); spec != "" {
		os.Exit(runEtcdPeer(spec))
	}
	if os.Getenv("DLOCK_TEST_MAIN") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	// toxiproxy (TestElectionPartition) can leave a toxic's pipe goroutine blocked
	// on a send after the proxy is healed and stopped; it is the library's, not
	// dlock's, and dies with the test binary.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"))
}

// command returns the dlock command line run in a child process.
func command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "DLOCK_TEST_MAIN=1")
	return cmd
}

func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bogus"},
		{"--bogus"},
		{"dev", "--port", "abc"},
		{"dev", "--port", "70000"},
		{"dev", "--bogus"},
		{"dev", "extra"},
		{"demo", "--workers", "1"},
		{"demo", "--rounds", "0"},
		{"demo", "--ttl", "1500ms"},
		{"demo-worker"},
	} {
		code, stdout, stderr := run(args...)
		if code != exitUsage {
			t.Errorf("dlock %v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "dlock: ") || !strings.HasPrefix(lines[1], "usage: dlock") {
			t.Errorf("dlock %v: want a one-line reason and the usage on stderr, got stdout %q stderr %q", args, stdout, stderr)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{}, {"--help"}, {"dev", "--help"}, {"demo", "--help"}, {"help", "dev"}} {
		code, stdout, stderr := run(args...)
		if code != exitOK || !strings.Contains(stdout, "Usage:") || stderr != "" {
			t.Errorf("dlock %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	_, stdout, _ := run("--help")
	for _, c := range []string{"dev", "demo"} {
		if !strings.Contains(stdout, c) {
			t.Errorf("dlock --help does not list %q", c)
		}
	}
	if strings.Contains(stdout, "demo-worker") {
		t.Error("dlock --help lists the internal demo-worker command")
	}
}

// The demo runs on its own, needs nothing installed, and ends with a summary that
// reports the rejected stale write.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := command(ctx, "demo")
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("dlock demo: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	t.Logf("dlock demo took %v:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	summary := lines[len(lines)-1]
	if !strings.HasPrefix(summary, "demo: ok") || !strings.Contains(summary, "1 stale write rejected") {
		t.Fatalf("summary %q does not report the rejected stale write", summary)
	}
	if !strings.Contains(out.String(), "SIGSTOP") || !strings.Contains(out.String(), "REJECTED") {
		t.Fatalf("the log does not show the pause and the rejection:\n%s", out.String())
	}
}

// dlock dev starts etcd, prints a URL that works, and exits cleanly on SIGTERM,
// removing its temporary data.
func TestDev(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := command(ctx, "dev", "--port", "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	sc := bufio.NewScanner(stdout)
	var url, banner string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if banner == "" {
			banner = line
		}
		if strings.HasPrefix(line, "etcd://") {
			url = line
			break
		}
	}
	if url == "" {
		t.Fatalf("dlock dev printed no URL (stderr %q)", errb.String())
	}
	_, dataDir, _ := strings.Cut(banner, "data in ")
	dataDir, _, _ = strings.Cut(dataDir, " ")
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("data directory %q from the banner %q: %v", dataDir, banner, err)
	}

	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatalf("Open(%q): %v", url, err)
	}
	l, err := c.Lock(ctx, "dev-test")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() == 0 {
		t.Fatal("token 0 from etcd")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dlock dev after SIGTERM: %v (stderr %q)", err, errb.String())
	}
	if !strings.Contains(string(rest), "stopped") {
		t.Fatalf("dlock dev did not say it stopped: %q", rest)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("temporary data directory %s left behind: %v", dataDir, err)
	}
}
