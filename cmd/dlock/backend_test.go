package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/cmd/dlock/internal/runner"
	"github.com/dlockio/dlock/internal/testserver"
)

// Issue 17 items 6, 7 and 11 from the command line: a bad go-redis parameter
// panicked (exit 2 with a goroutine dump), a DNS failure exited 64 (bad input), and
// refused credentials exited 69 (unreachable).
func TestBackendExitCodes(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if err := rdb.Do(context.Background(), "ACL", "SETUSER", "alice", "on", ">right", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url  string
		code int
	}{
		{srv.URL() + "?pool_size=-1", exitUsage},
		{srv.URL() + "?pipeline_pool_size=2147483648", exitUsage},
		{srv.URL() + "?strict=true%", exitUsage},
		{"zk://no-such-host.invalid:2181/r", runner.ExitUnavailable},
		{"redis://alice:wrong-secret@" + srv.Addr() + "/0", exitNoPerm},
		{"redis://alice:right@" + srv.Addr() + "/0", exitOK},
	} {
		code, _, stderr := run("inspect", "--backend", tc.url, "k")
		if code != tc.code {
			t.Errorf("dlock inspect --backend %s: exit %d, want %d (stderr %q)", tc.url, code, tc.code, stderr)
		}
		if strings.Contains(stderr, "wrong-secret") || strings.Contains(stderr, "goroutine") {
			t.Errorf("dlock inspect --backend %s: stderr %q", tc.url, stderr)
		}
	}
}
