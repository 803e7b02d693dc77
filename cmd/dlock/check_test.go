package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check"
	"github.com/dlockio/dlock/internal/testserver"
)

func TestCheckUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"check"},
		{"check", "extra"},
		{"check", "--setup", "nosuch"},
		{"check", "--setup", "redis", "--fault", "nosuch"},
		{"check", "--setup", "etcd", "--fault", "kill"},
		{"check", "--setup", "redis", "--fencing", "maybe"},
		{"check", "--setup", "redis", "--resource", "mysql"},
		{"check", "--setup", "redis", "--workers", "0"},
		{"check", "--setup", "redis", "--ttl", "1ms"},
		{"check", "--setup", "redis", "--hold", "2s"},
		{"check", "--setup", "redis", "--duration", "abc"},
		{"check", "--matrix", "--setup", "redis"},
		{"check", "--setup", "redis", "--doc", "x.md"},
		{"check", "--setup", "redis", "--safe-only"},
		{"check", "--setup", "redis", "--acquisitions", "-5"},
		{"check", "--setup", "redis", "--injections", "x"},
		{"check-worker", "--id", "0"},
	} {
		code, stdout, stderr := run(args...)
		if code != exitUsage {
			t.Errorf("dlock %v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
		if stdout != "" || !strings.HasPrefix(stderr, "dlock: ") || !strings.Contains(stderr, "usage: dlock check") {
			t.Errorf("dlock %v: want a reason and the usage on stderr, got stdout %q stderr %q", args, stdout, stderr)
		}
	}
}

func TestCheckList(t *testing.T) {
	code, stdout, _ := run("check", "--list")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"redis-aof", "redlock", "etcd", "zk", "postgres", "mariadb", "pause-after-check", "failover", "clock", "resources", "pgfence", "redisfence", "etcdfence"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--list does not mention %q", want)
		}
	}
}

// A short real run of the cell the checker must catch: Redis without persistence,
// killed and restarted while a lock is held. Unfenced and fenced, the lock is
// violated (P1 > 0, "detected"); fenced, the store refused every stale write.
func TestCheckRedisKill(t *testing.T) {
	testserver.Require(t, "redis", "redis-server", "install it with: apt-get install -y redis-server")
	t.Setenv("DLOCK_TEST_MAIN", "1") // the workers are this test binary running Main
	out := t.TempDir()
	code, stdout, stderr := run("check", "--setup", "redis", "--fault", "kill", "--duration", "4s",
		"--ttl", "500ms", "--interval", "1s", "--keys", "1", "--out", out, "--seed", "7")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rows := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(rows) != 4 {
		t.Fatalf("want a header and 2 rows, got:\n%s", stdout)
	}
	for i, want := range []string{"| redis | kill | no |", "| redis | kill | yes |"} {
		row := rows[2+i]
		if !strings.HasPrefix(row, want) || !strings.HasSuffix(row, "| detected |") {
			t.Errorf("row %q: want %q ... detected", row, want)
		}
	}
	for _, name := range []string{"redis_kill_unfenced", "redis_kill_fenced"} {
		for _, ext := range []string{".json", ".html"} {
			if st, err := os.Stat(filepath.Join(out, name+ext)); err != nil || st.Size() == 0 {
				t.Errorf("%s%s: %v", name, ext, err)
			}
		}
	}
}

// The MariaDB setup keeps PostgreSQL's promises: kill -9 of the server (restarted
// at once, InnoDB's redo log flushed at every commit) loses no lease and no token, so
// both cells are safe (P1, P3 and P4 all 0, "as expected").
func TestCheckMariaDBKill(t *testing.T) {
	testserver.Require(t, "mariadb", "mariadbd", testserver.MariaDBInstallHint)
	t.Setenv("DLOCK_TEST_MAIN", "1") // the workers are this test binary running Main
	out := t.TempDir()
	code, stdout, stderr := run("check", "--setup", "mariadb", "--fault", "kill", "--fault", "clock", "--duration", "5s",
		"--ttl", "500ms", "--interval", "1500ms", "--keys", "1", "--out", out, "--seed", "7")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rows := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(rows) != 6 {
		t.Fatalf("want a header and 4 rows, got:\n%s", stdout)
	}
	for i, want := range []string{"| mariadb | kill | no |", "| mariadb | kill | yes |", "| mariadb | clock | no |", "| mariadb | clock | yes |"} {
		row := rows[2+i]
		if !strings.HasPrefix(row, want) {
			t.Errorf("row %q: want %q ...", row, want)
		}
	}
	// kill: safe in both modes; clock: the fenced cell is safe, the unfenced one may
	// show the stale write (detected) or not.
	for _, i := range []int{2, 3, 5} {
		if !strings.HasSuffix(rows[i], "| as expected |") && !strings.HasSuffix(rows[i], "| detected |") {
			t.Errorf("row %q: want as expected or detected", rows[i])
		}
	}
}

// The command line in a generated safety document repeats the run: every flag that
// changes the cells or their length is in it.
func TestMatrixCommand(t *testing.T) {
	f := checkFlags{fencing: "off", safeOnly: true}
	cfg := check.Config{Workers: 5, Keys: 16, Duration: 20 * time.Minute, TTL: time.Second,
		Hold: 2 * time.Millisecond, Acquisitions: 100000, Injections: 50, Seed: 3}
	got := matrixCommand(f, cfg)
	want := "dlock check --matrix --duration 20m0s --ttl 1s --workers 5 --keys 16 --hold 2ms --acquisitions 100000 --injections 50 --safe-only --fencing off --seed 3"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	f.resources = []string{"postgres"}
	want = strings.Replace(want, " --seed", " --resource postgres --seed", 1)
	if got := matrixCommand(f, cfg); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
