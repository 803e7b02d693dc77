package main

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/dlockio/dlock"
)

func TestVersion(t *testing.T) {
	code, long, stderr := run("version")
	if code != exitOK || stderr != "" || !strings.HasPrefix(long, "dlock ") || !strings.Contains(long, "\ngo: "+runtime.Version()) {
		t.Fatalf("dlock version: exit %d, stdout %q, stderr %q", code, long, stderr)
	}
	code, flag, stderr := run("--version")
	if code != exitOK || stderr != "" || flag != long {
		t.Fatalf("dlock --version: exit %d, stdout %q (dlock version said %q), stderr %q", code, flag, long, stderr)
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_dlock", "zsh": "#compdef dlock", "fish": "complete -c dlock", "powershell": "Register-ArgumentCompleter"} {
		code, stdout, stderr := run("completion", shell)
		if code != exitOK || stderr != "" || !strings.Contains(stdout, want) {
			t.Errorf("dlock completion %s: exit %d, stderr %q, script without %q", shell, code, stderr, want)
		}
	}
	_, help, _ := run("completion", "--help")
	for _, want := range []string{"bash-completion/completions/dlock", "_dlock", "fish/completions/dlock.fish", "$PROFILE"} {
		if !strings.Contains(help, want) {
			t.Errorf("dlock completion --help does not say %q", want)
		}
	}
	// The scripts ask the command itself for completions.
	if code, stdout, _ := run("__complete", "ins"); code != exitOK || !strings.Contains(stdout, "inspect") {
		t.Errorf("dlock __complete ins: exit %d, %q", code, stdout)
	}
}

// closedPort is a loopback port that nothing listens on, a moment ago.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// Every error the command prints is one line: "dlock: " once, each part said once,
// and, after a usage error, one "usage:" line. Messages that are not errors (the
// status while waiting, "was free") obey the same rule.
func TestErrorsAreOneLine(t *testing.T) {
	ctx := context.Background()
	held, err := dlock.Open(ctx, "mem://errors-held")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	l, err := held.Lock(ctx, "job", dlock.WithOwner("other-job"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	port := closedPort(t)
	for _, c := range []struct {
		args []string
		code int
	}{
		// bad URLs
		{[]string{"inspect", "--backend", "http://x", "job"}, exitUsage},
		{[]string{"inspect", "--backend", ":bad", "job"}, exitUsage},
		{[]string{"inspect", "--backend", "mem://?bogus=1", "job"}, exitUsage},
		{[]string{"run", "--backend", "redis://127.0.0.1:" + port + "/0?tls_ca=/nonexistent", "job", "--", "true"}, -1},
		{[]string{"inspect", "job"}, exitUsage}, // no backend
		// bad flag values and arguments
		{[]string{"run", "--backend", "mem://", "--wait", "soon", "job", "--", "true"}, exitUsage},
		{[]string{"run", "--backend", "mem://", "--ttl", "-1s", "job", "--", "true"}, exitUsage},
		{[]string{"run", "--backend", "mem://", "--grace", "-1s", "job", "--", "true"}, exitUsage},
		{[]string{"run", "--backend", "mem://", "--owner", "bad owner", "job", "--", "true"}, exitUsage},
		{[]string{"run", "--backend", "mem://", "--resume", "job", "--", "true"}, exitUsage},
		{[]string{"run", "--backend", "mem://", "job"}, exitUsage},
		{[]string{"--log-level", "loud", "inspect", "--backend", "mem://", "job"}, exitUsage},
		{[]string{"inspect", "--json=maybe", "job"}, exitUsage},
		{[]string{"inspect", "--backend", "mem://", ""}, exitUsage},
		{[]string{"inspect", "--backend", "mem://", "a", "b"}, exitUsage},
		{[]string{"dev", "--port", "abc"}, exitUsage},
		{[]string{"completion", "tcsh"}, exitUsage},
		{[]string{"release", "--backend", "mem://", "job"}, exitUsage},
		{[]string{"release", "--force", "--backend", "mem://", ""}, exitUsage},
		{[]string{"run", "--password-file", "/nonexistent", "--backend", "mem://", "job", "--", "true"}, exitUsage},
		// unknown commands and flags
		{[]string{"bogus"}, exitUsage},
		{[]string{"--bogus"}, exitUsage},
		{[]string{"inspect", "--bogus", "job"}, exitUsage},
		// unreachable servers
		{[]string{"inspect", "--backend", "redis://127.0.0.1:" + port + "/0", "job"}, 69},
		{[]string{"run", "--backend", "redlock://127.0.0.1:" + port + ",127.0.0.1:" + closedPort(t) + ",127.0.0.1:" + closedPort(t), "job", "--", "true"}, 69},
		{[]string{"inspect", "--backend", "postgres://u:secret@127.0.0.1:" + port + "/db", "job"}, 69},
		// a held lock, at once and after waiting
		{[]string{"run", "--backend", "mem://errors-held", "job", "--", "true"}, 75},
		{[]string{"run", "--backend", "mem://errors-held", "--wait", "1500ms", "job", "--", "true"}, 75},
		// a free key released by force: not an error
		{[]string{"release", "--force", "--backend", "mem://", "free-key"}, exitOK},
	} {
		code, _, stderr := run(c.args...)
		t.Logf("dlock %q: exit %d\n%s", c.args, code, stderr)
		if c.code >= 0 && code != c.code {
			t.Errorf("dlock %q: exit %d, want %d (stderr %q)", c.args, code, c.code, stderr)
		}
		if code != exitOK && stderr == "" {
			t.Errorf("dlock %q: exit %d with nothing on stderr", c.args, code)
		}
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		for i, line := range lines {
			if strings.HasPrefix(line, "usage: ") && i == len(lines)-1 && code == exitUsage && i > 0 {
				continue
			}
			if !strings.HasPrefix(line, "dlock: ") || strings.Contains(line, "dlock: dlock:") || strings.Contains(line, ": dlock: ") {
				t.Errorf("dlock %q: line %q is not one message with one \"dlock: \" (stderr %q)", c.args, line, stderr)
			}
			if part, ok := repeated(line); ok {
				t.Errorf("dlock %q: %q says %q twice", c.args, line, part)
			}
			if strings.Contains(line, "secret") {
				t.Errorf("dlock %q: %q shows the password", c.args, line)
			}
		}
	}
	// The status and the error say who holds the key.
	_, _, stderr := run("run", "--backend", "mem://errors-held", "--wait", "1500ms", "job", "--", "true")
	if !strings.Contains(stderr, `waiting for "job": held by owner "other-job" (token `) || !strings.Contains(stderr, `"job" still held by another owner "other-job" (token `) {
		t.Errorf("the wait does not say who holds the key: %q", stderr)
	}
	if _, _, stderr := run("release", "--force", "--backend", "mem://", "free-key"); stderr != "dlock: free-key was free; nothing to release\n" {
		t.Errorf("release --force of a free key: %q", stderr)
	}
}

// repeated reports a part of line (separated by "; ") that occurs twice.
func repeated(line string) (string, bool) {
	seen := map[string]bool{}
	for part := range strings.SplitSeq(line, "; ") {
		if seen[part] {
			return part, true
		}
		seen[part] = true
	}
	return "", false
}

func TestLogLevel(t *testing.T) {
	for _, level := range []string{"debug", "info", "warn", "error"} {
		if code, _, stderr := run("--log-level", level, "inspect", "--backend", "mem://", "job"); code != exitOK {
			t.Errorf("--log-level %s: exit %d, stderr %q", level, code, stderr)
		}
	}
	if _, _, stderr := run("--log-level", "loud", "version"); !strings.Contains(stderr, "--log-level must be debug, info, warn or error") {
		t.Errorf("--log-level loud: %q", stderr)
	}
}
