package pglock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

func listKeys(t *testing.T, c *dlock.Client, prefix string) []dlock.Info {
	t.Helper()
	infos, err := c.List(context.Background(), prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return infos
}

func keysOf(infos []dlock.Info) []string {
	var keys []string
	for _, in := range infos {
		keys = append(keys, in.Key)
	}
	return keys
}

// List matches the prefix literally (LIKE's metacharacters, a backslash, code
// points past ASCII up to the last one), in byte order of the keys; counts a key's
// live places; lists readers one by one; and works without a permit table.
func TestList(t *testing.T) {
	srv := testserver.StartPostgres(t)
	ctx := context.Background()
	newClient := func(rawURL string) *dlock.Client {
		c, err := dlock.Open(ctx, rawURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	u := withQuery(srv.URL(), "table", "list_locks")
	c := newClient(u)
	var leases []*dlock.Lease
	lock := func(c *dlock.Client, key string, opts ...dlock.Option) *dlock.Lease {
		t.Helper()
		l, err := c.Lock(ctx, key, opts...)
		if err != nil {
			t.Fatalf("Lock(%q): %v", key, err)
		}
		leases = append(leases, l)
		return l
	}
	keys := []string{"a%", "a%x", "a_", "ab", `a\`, `a\b`, "a[", "é", "éa", "f\U0010FFFF", "f\U0010FFFFx", "g"}
	for _, k := range keys {
		lock(c, k)
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a%", []string{"a%", "a%x"}},
		{"a_", []string{"a_"}},
		{`a\`, []string{`a\`, `a\b`}},
		{"a[", []string{"a["}},
		{"é", []string{"é", "éa"}},
		{"f\U0010FFFF", []string{"f\U0010FFFF", "f\U0010FFFFx"}},
		{"", slices.Sorted(slices.Values(keys))},
		{"z", nil},
	} {
		if got := keysOf(listKeys(t, c, tc.prefix)); !slices.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}

	// A queued waiter is counted, as Inspect counts it.
	holder := lock(c, "w")
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		l, err := newClient(u).Lock(wctx, "w")
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := listKeys(t, c, "w")
		if len(got) != 1 || got[0].Owner != holder.Owner() {
			t.Fatalf("List(w) = %+v", got)
		}
		if got[0].Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List(w) never counted the waiter: %+v", got)
		}
	}
	cancel()
	<-done

	// Readers: one entry each, shared.
	r1, r2 := lock(c, "r", dlock.WithShared()), lock(newClient(u), "r", dlock.WithShared())
	got := listKeys(t, c, "r")
	if len(got) != 2 || got[0].Owner != r1.Owner() || got[1].Owner != r2.Owner() || !got[0].Shared || !got[1].Shared {
		t.Fatalf("List(r) = %+v, want the two readers, oldest first", got)
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := listKeys(t, c, ""); len(got) != 0 {
		t.Fatalf("List once every key is released = %+v", got)
	}

	// Without a permit table (no privilege on it): mutex keys only.
	pool := admin(t, srv)
	exec(t, pool, `DROP ROLE IF EXISTS list_limited`)
	exec(t, pool, `CREATE ROLE list_limited LOGIN PASSWORD 'list-limited-pw'`)
	exec(t, pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON list_locks TO list_limited`)
	exec(t, pool, `GRANT USAGE ON SEQUENCE list_locks_token_seq TO list_limited`)
	lc := newClient(withQuery(srv.URLFor("list_limited", "list-limited-pw", "postgres"), "table", "list_locks"))
	l := lock(lc, "m%")
	lock(c, "m_x")
	if got := listKeys(t, lc, "m%"); len(got) != 1 || got[0].Owner != l.Owner() || got[0].TTL <= 0 {
		t.Fatalf("List(m%%) without a permit table = %+v", got)
	}
}
