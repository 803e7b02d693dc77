//go:build unix

package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// dlock run --limit N holds one of N permits; another N is a usage error while the
// key is held; dlock inspect lists the holders.
func TestRunLimit(t *testing.T) {
	ctx := context.Background()
	url := "mem://run-limit"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Lock(ctx, "pool", dlock.WithLimit(2), dlock.WithValue([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("run", "--backend", url, "--limit", "2", "pool", "--", "true"); code != 0 {
		t.Fatalf("a second permit of 2: exit %d: %s", code, errs)
	}
	b, err := c.Lock(ctx, "pool", dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("run", "--backend", url, "--limit", "2", "pool", "--", "true"); code != 75 {
		t.Fatalf("a third holder of 2: exit %d, want 75: %s", code, errs)
	}
	for _, args := range [][]string{{"--limit", "3"}, nil} {
		code, _, errs := run(append(append([]string{"run", "--backend", url}, args...), "pool", "--", "true")...)
		if code != 64 || !strings.Contains(errs, "limit") {
			t.Fatalf("another limit (%v): exit %d, want 64: %s", args, code, errs)
		}
	}
	if code, _, errs := run("run", "--backend", url, "--limit", "0", "pool", "--", "true"); code != 64 {
		t.Fatalf("--limit 0: exit %d, want 64: %s", code, errs)
	}
	code, out, errs := run("inspect", "--backend", url, "pool")
	if code != 0 || !strings.Contains(out, "limit:   2\nholders: 2\n") || !strings.Contains(out, "owner "+a.Owner()+", token 1") ||
		!strings.Contains(out, `value "a"`) || !strings.Contains(out, "owner "+b.Owner()+", token 3") {
		t.Fatalf("inspect: exit %d, %q %q", code, out, errs)
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
}

// dlock run --shared runs beside other readers, not beside a writer; inspect
// lists the readers.
func TestRunShared(t *testing.T) {
	ctx := context.Background()
	url := "mem://run-shared"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Lock(ctx, "doc", dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("run", "--backend", url, "--shared", "doc", "--", "true"); code != 0 {
		t.Fatalf("a reader beside a reader: exit %d: %s", code, errs)
	}
	if code, _, errs := run("run", "--backend", url, "doc", "--", "true"); code != 75 {
		t.Fatalf("a writer beside a reader: exit %d, want 75: %s", code, errs)
	}
	if code, _, errs := run("run", "--backend", url, "--shared", "--limit", "2", "doc", "--", "true"); code != 64 {
		t.Fatalf("--shared --limit 2: exit %d, want 64: %s", code, errs)
	}
	code, out, errs := run("inspect", "--backend", url, "doc")
	if code != 0 || !strings.Contains(out, "owner "+r.Owner()+", token 1, TTL left ") || !strings.Contains(out, ", shared") {
		t.Fatalf("inspect: exit %d, %q %q", code, out, errs)
	}
	_ = r.Release(ctx)
	if code, _, errs := run("run", "--backend", url, "doc", "--", "true"); code != 0 {
		t.Fatalf("a writer once the reader left: exit %d: %s", code, errs)
	}
}

// dlock inspect lists the queue where the backend keeps one: each waiter in the
// order it will be served, readers marked, in text and JSON.
func TestInspectQueue(t *testing.T) {
	ctx := context.Background()
	url := "mem://inspect-queue"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := c.Lock(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{}, 2)
	for i, opts := range [][]dlock.Option{{dlock.WithShared(), dlock.WithValue([]byte("r"))}, nil} {
		go func() {
			defer func() { done <- struct{}{} }()
			if l, err := c.Lock(wctx, "doc", opts...); err == nil {
				_ = l.Release(ctx)
			}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for q, _ := c.Waiters(ctx, "doc"); len(q) <= i; q, _ = c.Waiters(ctx, "doc") {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d never queued", i+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
	code, out, errs := run("inspect", "--backend", url, "doc")
	want := "waiters: 2 (1 shared, 1 exclusive)\n  1. owner "
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, `, shared, value "r"`) {
		t.Fatalf("inspect: exit %d, %q %q; want %q", code, out, errs, want)
	}
	code, out, errs = run("inspect", "--json", "--backend", url, "doc")
	if code != 0 || !strings.Contains(out, `"queue": [`) || !strings.Contains(out, `"shared": true`) || !strings.Contains(out, `"waiters": 2`) {
		t.Fatalf("inspect --json: exit %d, %q %q", code, out, errs)
	}
	cancel()
	<-done
	<-done
	_ = w.Release(ctx)
}

// dlock inspect --watch prints the state, then again at each change of holder (a
// line with the time before it), and stops when interrupted.
func TestInspectWatch(t *testing.T) {
	ctx := context.Background()
	url := "mem://inspect-watch"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out lockedBuffer
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		b, err := dlock.Open(ctx, url)
		if err != nil {
			done <- err
			return
		}
		defer b.Close()
		done <- watchKey(wctx, b, "job", 20*time.Millisecond, &out, false)
	}()
	waitOut := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("output %q never said %q", out.String(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitOut("job: free\n")
	l, err := c.Lock(ctx, "job", dlock.WithValue([]byte("v1")))
	if err != nil {
		t.Fatal(err)
	}
	waitOut("owner:   " + l.Owner())
	waitOut(`value:   "v1"`)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for strings.Count(out.String(), "job: free\n") < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n-- "); n != 2 {
		t.Fatalf("%d change lines, want 2 (held, free again): %q", n, out.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dlock list shows every held key under a prefix, one line per holder, in text
// and JSON; Redlock, which cannot list, is a usage error.
func TestList(t *testing.T) {
	ctx := context.Background()
	url := "mem://list"
	c, err := dlock.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Lock(ctx, "orders/1", dlock.WithValue([]byte("host a")))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Lock(ctx, "orders/2", dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("list", "--backend", url, "orders/")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "KEY") ||
		!strings.HasPrefix(lines[1], "orders/1  "+a.Owner()) || !strings.Contains(lines[1], `exclusive  "host a"`) ||
		!strings.HasPrefix(lines[2], "orders/2  "+r.Owner()) || !strings.Contains(lines[2], "shared") {
		t.Fatalf("list: exit %d, %q %q", code, out, errs)
	}
	code, out, _ = run("list", "--json", "--backend", url)
	if code != 0 || strings.Count(out, `"key"`) != 3 || !strings.Contains(out, `"key": "other"`) {
		t.Fatalf("list --json: exit %d, %q", code, out)
	}
	for _, l := range []*dlock.Lease{a, r, o} {
		_ = l.Release(ctx)
	}
	if code, out, _ := run("list", "--backend", url, "orders/"); code != 0 || out != "no locks held under \"orders/\"\n" {
		t.Fatalf("list of nothing: exit %d, %q", code, out)
	}
	if code, _, errs := run("list", "--backend", url, "a", "b"); code != 64 {
		t.Fatalf("two prefixes: exit %d: %s", code, errs)
	}
}

// dlock inspect lists the readers of a Redlock key (driver.HolderLister).
func TestInspectRedlockReaders(t *testing.T) {
	ctx := context.Background()
	url := testserver.RedlockURL(testserver.StartRedisNodes(t, 3), "node_timeout=500ms")
	for range 2 {
		c, err := dlock.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Lock(ctx, "doc", dlock.WithShared())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
	}
	code, out, errs := run("inspect", "--backend", url, "doc")
	if code != 0 || !strings.Contains(out, "holders: 2\n") || strings.Count(out, ", shared") != 2 {
		t.Fatalf("inspect: exit %d, %q %q; want two holders, shared", code, out, errs)
	}
	code, out, errs = run("inspect", "--json", "--backend", url, "doc")
	if code != 0 || strings.Count(out, `"shared": true`) != 2 {
		t.Fatalf("inspect --json: exit %d, %q %q", code, out, errs)
	}
}
