package etcdlock_test

import (
	"context"
	"slices"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// List matches the lock-key prefix literally though keys are escaped in etcd
// ("%" and "/"), lists in the order of the keys, not of their escaped forms, and
// leaves out the locks of a nested prefix.
func TestListEscapedKeys(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	client := func(prefix string) *dlock.Client {
		c, err := dlock.New(open(t, srv.URL(prefix)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, nested := client("dlock"), client("dlock/a")
	var leases []*dlock.Lease
	for _, k := range []string{"a/x", "a&", "a%2F", "a%", "a*?[_", "b"} {
		l, err := c.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	l, err := nested.Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	leases = append(leases, l)
	for _, tc := range []struct {
		c      *dlock.Client
		prefix string
		want   []string
	}{
		{c, "a", []string{"a%", "a%2F", "a&", "a*?[_", "a/x"}},
		{c, "a%", []string{"a%", "a%2F"}},
		{c, "a/", []string{"a/x"}},
		{c, "a*", []string{"a*?[_"}},
		{c, "", []string{"a%", "a%2F", "a&", "a*?[_", "a/x", "b"}},
		{nested, "", []string{"x"}},
		{c, "x", nil},
	} {
		infos, err := tc.c.List(ctx, tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
