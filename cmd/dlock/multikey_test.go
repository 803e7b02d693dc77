//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// dlock run with several --key flags holds every key or none: with one held it
// exits 75 naming that key and leaves the others free; the command sees each key
// and its token in key order, and no single DLOCK_TOKEN.
func TestRunMultiKey(t *testing.T) {
	ctx := context.Background()
	url := "mem://run-multikey"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hb, err := c.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	code, _, errs := run("run", "--backend", url, "--key", "b", "--key", "a", "--", "true")
	if code != 75 || !strings.Contains(errs, `"b" is held by another owner`) {
		t.Fatalf("with b held: exit %d, want 75 naming b: %s", code, errs)
	}
	la, err := c.TryLock(ctx, "a")
	if err != nil {
		t.Fatalf("a after the refused run: %v (left held)", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	script := `echo "$DLOCK_KEYS $DLOCK_KEY_1=$DLOCK_TOKEN_1 $DLOCK_KEY_2=$DLOCK_TOKEN_2 ${DLOCK_TOKEN-none} $DLOCK_HELD"`
	code, out, errs := run("run", "--backend", url, "b", "--key", "a", "--key", "b", "--", "sh", "-c", script)
	// a and b were each granted once before (token 1), the refused run took none.
	if want := "2 a=2 b=2 none 1\n"; code != 0 || out != want {
		t.Fatalf("exit %d, output %q, want %q: %s", code, out, want, errs)
	}
	if !strings.Contains(errs, `acquired "a" (token 2), "b" (token 2)`) {
		t.Fatalf("stderr %q does not say what was acquired", errs)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := c.Inspect(ctx, k); err == nil {
			t.Fatalf("%q still held after the run", k)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--", "true"}, "missing KEY"},
		{[]string{"--key", "a", "--key", "x\x01", "--", "true"}, "control character"},
		{[]string{"--key", "", "--", "true"}, "empty key"},
	} {
		code, _, errs := run(append([]string{"run", "--backend", url}, tc.args...)...)
		if code != 64 || !strings.Contains(errs, tc.want) {
			t.Errorf("run %q: exit %d, want 64 saying %q: %s", tc.args, code, tc.want, errs)
		}
	}
	many := []string{"run", "--backend", url}
	for i := range dlock.MaxKeys + 1 {
		many = append(many, "--key", fmt.Sprint("k", i))
	}
	if code, _, errs := run(append(many, "--", "true")...); code != 64 || !strings.Contains(errs, "at most 64") {
		t.Errorf("%d keys: exit %d, want 64: %s", dlock.MaxKeys+1, code, errs)
	}
}

// dlock run --metrics-addr serves the run's lease as Prometheus metrics while it
// runs; a bad address is a usage error.
func TestRunMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	done := make(chan string)
	go func() {
		code, _, errs := run("run", "-q", "--backend", "mem://run-metrics", "--metrics-addr", addr, "job", "--", "sleep", "2")
		done <- fmt.Sprint(code, errs)
	}()
	want := `dlock_leases_active{backend="memlock",key="job",mode="exclusive"} 1`
	deadline := time.Now().Add(10 * time.Second)
	for {
		body := ""
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		if strings.Contains(body, want) && strings.Contains(body, `dlock_lock_acquire_duration_seconds_count{backend="memlock",key="job",mode="exclusive",result="granted"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never showed the held lease: %q", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := <-done; got != "0" {
		t.Fatalf("run: %s", got)
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Fatal("metrics still served after the run")
	}
	for _, bad := range []string{"9464", "127.0.0.1:99999"} {
		if code, _, errs := run("run", "--backend", "mem://", "--metrics-addr", bad, "job", "--", "true"); code != 64 || !strings.Contains(errs, "--metrics-addr") {
			t.Errorf("--metrics-addr %s: exit %d, want 64: %s", bad, code, errs)
		}
	}
}
