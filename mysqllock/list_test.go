package mysqllock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// List matches the prefix byte for byte: LIKE's wildcards, a backslash and bytes
// above 0x7f in it are themselves, and a longer prefix than a key does not match it.
func testListPrefixBytes(t *testing.T, srv *testserver.MariaDB) {
	ctx := context.Background()
	b := open(t, srv.URL())
	defer b.Close()
	keys := []string{"lp/a_b", "lp/axb", "lp/a%b", "lp/a\\b", "lp/\xc3\xa9", "lp/\xc3\xa9x", "lp/\xff", "lp"}
	for _, k := range keys {
		if _, err := b.Acquire(ctx, driver.Request{Key: k, Owner: "o", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string][]string{
		"lp/a_":       {"lp/a_b"},
		"lp/a%":       {"lp/a%b"},
		"lp/a\\":      {"lp/a\\b"},
		"lp/\xc3\xa9": {"lp/\xc3\xa9", "lp/\xc3\xa9x"},
		"lp/\xff":     {"lp/\xff"},
		"lp/":         {"lp/a%b", "lp/a\\b", "lp/a_b", "lp/axb", "lp/\xc3\xa9", "lp/\xc3\xa9x", "lp/\xff"},
		"lp/a_bc":     nil,
	} {
		got, err := b.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, in := range got {
			names = append(names, in.Key)
			if in.Owner != "o" || in.Token == 0 || in.TTL <= 0 || in.Waiters != 0 {
				t.Errorf("List(%q): entry %+v", prefix, in)
			}
		}
		if !slices.Equal(names, want) {
			t.Errorf("List(%q) = %q, want %q", prefix, names, want)
		}
	}
	for _, k := range keys {
		if err := b.Release(ctx, k, "o"); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := b.List(ctx, "lp"); err != nil || len(got) != 0 {
		t.Fatalf("List after the releases = %+v, %v", got, err)
	}
	if q, err := b.Queue(ctx, "lp/a_b"); err != nil || q == nil || len(q) != 0 {
		t.Fatalf("Queue of a free key = %#v, %v; want an empty list", q, err)
	}
}
