package redislock_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

// List matches its prefix, and the backend's, literally: glob characters in
// either match only themselves. It lists a semaphore's holders and readers too,
// and not a key of another prefix that the lock key's pattern would reach if it
// were a glob.
func TestListGlobCharacters(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := func(prefix string) *dlock.Client {
		b, err := redislock.Open(ctx, u, redislock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		c, err := dlock.New(b)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := client(`p*[a]?\`)
	other := client(`p[*]xa_`) // what the pattern would match unescaped
	lock := func(c *dlock.Client, key string, opts ...dlock.Option) *dlock.Lease {
		t.Helper()
		l, err := c.Lock(ctx, key, opts...)
		if err != nil {
			t.Fatalf("Lock(%q): %v", key, err)
		}
		t.Cleanup(func() { _ = l.Release(ctx) })
		return l
	}
	var want []string
	for _, k := range []string{`a*`, `a?b`, `a[b]`, `a\b`, `a\*`} {
		l := lock(c, k)
		want = append(want, fmt.Sprint(l.Key(), " ", l.Owner(), " ", l.Token()))
	}
	for range 2 {
		l := lock(c, `a[s]`, dlock.WithLimit(3))
		want = append(want, fmt.Sprint(l.Key(), " ", l.Owner(), " ", l.Token()))
	}
	for range 2 {
		l := lock(c, `a^r`, dlock.WithShared())
		want = append(want, fmt.Sprint(l.Key(), " ", l.Owner(), " ", l.Token()))
	}
	slices.SortStableFunc(want, func(a, b string) int { return compareKey(a, b) })
	for _, k := range []string{`ab`, `a[`, `aXb`, `a*`} {
		lock(other, k)
	}
	lock(c, `b*`)
	lock(c, `xa`)

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
	for prefix, n := range map[string]int{`a*`: 1, `a?`: 1, `a[`: 3, `a[b`: 1, `a\`: 2, `a\*`: 1, `*`: 0, `?`: 0, `[`: 0, `\`: 0, `a^`: 2} {
		if got := list(prefix); len(got) != n {
			t.Errorf("List(%q) = %q, want %d entries", prefix, got, n)
		}
	}
	if got := list(""); len(got) != len(want)+2 {
		t.Errorf("List(\"\") = %q, want %d entries", got, len(want)+2)
	}
	// A flushed script cache: the pipeline sends the script's source.
	if err := rawClient(t, srv).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := list("a"); !slices.Equal(got, want) {
		t.Fatalf("List(\"a\") after SCRIPT FLUSH =\n  %q\nwant\n  %q", got, want)
	}
}

// compareKey orders "KEY OWNER TOKEN" lines by key alone.
func compareKey(a, b string) int {
	ka, _, _ := strings.Cut(a, " ")
	kb, _, _ := strings.Cut(b, " ")
	return strings.Compare(ka, kb)
}
