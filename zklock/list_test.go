package zklock_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// List decodes the lock nodes' names and matches its prefix against the keys, not
// their escaped spelling; it skips nodes under the root that LockPath does not
// name (another name, an escaping PathEscape would not write, a nested root with no
// contenders), and lists every holder of a semaphore and of readers.
func TestListEscapedKeys(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := newClient(t, open(t, srv.URL("/list")))
	lock := func(key string, opts ...dlock.Option) string {
		t.Helper()
		l, err := c.Lock(ctx, key, opts...)
		if err != nil {
			t.Fatalf("Lock(%q): %v", key, err)
		}
		t.Cleanup(func() { _ = l.Release(ctx) })
		return fmt.Sprint(l.Key(), " ", l.Owner(), " ", l.Token())
	}
	want := []string{lock("a"), lock("a b"), lock("a%b"), lock("a/b"), lock("a/é")}
	want = append(want, lock("a/s", dlock.WithLimit(3)), lock("a/s", dlock.WithLimit(3)))
	want = append(want, lock("a/r", dlock.WithShared()), lock("a/r", dlock.WithShared()))
	slices.SortStableFunc(want, func(a, b string) int { return strings.Compare(lineKey(a), lineKey(b)) })
	lock("b")
	// A node with a contender child that LockPath never names: "a" escaped
	// needlessly (which must not list "a" twice), and a name without "k-".
	for _, n := range []string{"/list/k-%61", "/list/x-a"} {
		if _, err := raw.Create(n, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Create(n+"/lock-someone-0123456789abcdef0123456789abcdef-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	// A root nested in a lock node: its lock nodes are not contenders.
	cn := newClient(t, open(t, srv.URL("/list/k-a%2Fn")))
	if l, err := cn.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	} else {
		t.Cleanup(func() { _ = l.Release(ctx) })
	}

	list := func(prefix string) []string {
		t.Helper()
		got, err := c.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		var s []string
		for _, in := range got {
			s = append(s, fmt.Sprint(in.Key, " ", in.Owner, " ", in.Token))
		}
		return s
	}
	if got := list("a"); !slices.Equal(got, want) {
		t.Fatalf("List(\"a\") =\n  %q\nwant\n  %q", got, want)
	}
	for prefix, n := range map[string]int{"a/": 6, "a%": 1, "a%2": 0, "a%2F": 0, "a ": 1, "a/é": 1, "k-": 0, "": len(want) + 1} {
		if got := list(prefix); len(got) != n {
			t.Errorf("List(%q) = %q, want %d entries", prefix, got, n)
		}
	}
}

// lineKey returns the key of a line "KEY OWNER TOKEN" (a key may hold spaces).
func lineKey(s string) string {
	s = s[:strings.LastIndexByte(s, ' ')]
	return s[:strings.LastIndexByte(s, ' ')]
}
