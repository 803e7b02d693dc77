package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlockio/dlock/cmd/dlock/internal/bench"
	"github.com/dlockio/dlock/internal/testserver"
)

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "extra"},
		{"bench", "--bogus"},
		{"bench", "--duration", "abc"},
		{"bench", "--duration", "0s"},
		{"bench", "--duration", "11m"},
		{"bench", "--workers", "1"},
		{"bench", "--workers", "x"},
		{"bench", "--keys", "0"},
		{"bench", "--rounds", "0"},
		{"bench", "--waiters", "1,0"},
		{"bench", "--waiters", "a"},
		{"bench", "--pin", "x"},
		{"bench", "--pin", "3-1"},
		{"bench", "--pin", "1000"}, // not a CPU of this machine
		{"bench", "--backend", "nosuch://x"},
		{"bench", "--backend", "localhost:6379"},
		{"bench", "--backend", "mem://a?ttl=zz"},
		{"bench", "--backend", "mem://a?owner=me"},
		{"bench", "--backend", "a=mem://x", "--backend", "a=mem://y"},
		{"bench", "--servers", "redis"},
		{"bench", "--start-servers", "--servers", "nosuch"},
	} {
		code, stdout, stderr := run(args...)
		if code != exitUsage {
			t.Errorf("dlock %v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "dlock: ") || !strings.HasPrefix(lines[1], "usage: dlock bench") {
			t.Errorf("dlock %v: want a one-line reason and the usage on stderr, got stdout %q stderr %q", args, stdout, stderr)
		}
	}
}

func TestBenchHelp(t *testing.T) {
	code, stdout, _ := run("bench", "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--pin", "cross CPUs", "--start-servers", "--json", "--charts", "Jain", "--peers", "redsync"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("bench --help does not mention %q", want)
		}
	}
}

// TestBenchMem runs a very short benchmark of the in-process backend, and one
// named on the command line, and checks the outputs' structure (not the numbers).
func TestBenchMem(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "out.json")
	charts := filepath.Join(dir, "img")
	code, stdout, stderr := run("bench", "--duration", "60ms", "--rounds", "2", "--workers", "3", "--keys", "4",
		"--waiters", "1,3", "--backend", "mem://cli-a", "--backend", "second=mem://cli-b",
		"--json", jsonFile, "--charts", charts)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"### Uncontended Lock + Release", "### One hot key (3 workers)", "| mem |", "| second |", "| 3 waiters |"} {
		if !strings.Contains(stdout, want) && !strings.Contains(stdout, strings.Trim(want, "| ")) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	b, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Backends) != 2 || res.Backends[0].Name != "mem" || res.Backends[1].Name != "second" || res.Settings.Rounds != 2 {
		t.Errorf("JSON: %+v", res.Settings)
	}
	for _, f := range []string{bench.ChartCycleLatency, bench.ChartHandoffLatency, bench.ChartWaitersRate, bench.ChartWaitersCost} {
		if _, err := os.Stat(filepath.Join(charts, f)); err != nil {
			t.Error(err)
		}
	}
	// stderr is not a terminal here: no progress bar, only the files written.
	if strings.Contains(stderr, "round 1/") {
		t.Errorf("progress bar on a non-terminal: %q", stderr)
	}

	// JSON instead of markdown on stdout; the default backend is mem://.
	code, stdout, stderr = run("bench", "-q", "--duration", "20ms", "--rounds", "1", "--workers", "2", "--waiters", "2", "--json", "-")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res.Backends) != 1 || res.Backends[0].URL != benchMemURL {
		t.Fatalf("JSON on stdout: %v %+v", err, res.Backends)
	}
}

// TestBenchPeers: --peers runs the peers of a Redis backend beside it, labelled as
// peers, with dlock's ratio to the best of them.
func TestBenchPeers(t *testing.T) {
	srv := testserver.StartRedis(t)
	code, stdout, stderr := run("bench", "-q", "--peers", "--duration", "200ms", "--rounds", "1", "--workers", "2", "--waiters", "1",
		"--backend", srv.URL())
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"### Beside the peers", "| redsync-1 (peer) |", "| bsm/redislock (peer) |", "hot key / best peer"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestBenchFailedBackend(t *testing.T) {
	code, stdout, stderr := run("bench", "-q", "--duration", "20ms", "--rounds", "1", "--workers", "2", "--waiters", "1",
		"--backend", "mem://ok", "--backend", "redis://127.0.0.1:1/0?dial_timeout=100ms&max_retries=0")
	if code != exitError {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitError, stderr)
	}
	if !strings.Contains(stdout, "**Failed:**") || !strings.Contains(stderr, "1 backend(s) failed") {
		t.Errorf("stdout %q\nstderr %q", stdout, stderr)
	}
}
