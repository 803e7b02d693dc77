package mysqllock_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
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

// Tables made before values had a column for them get one at Open, by whichever
// of several clients opening at once comes first; the others find it there.
func testValueColumnAdded(t *testing.T, srv *testserver.MariaDB) {
	db := admin(t, srv)
	exec(t, db, "CREATE TABLE old_locks (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, owner VARBINARY(128) NOT NULL, "+
		"token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL, queued TINYINT NOT NULL DEFAULT 0) ENGINE=InnoDB")
	exec(t, db, "CREATE TABLE old_locks_queue (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, lock_key VARBINARY(512) NOT NULL, "+
		"owner VARBINARY(128) NOT NULL, conn BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL, "+
		"UNIQUE KEY place (lock_key, owner), KEY conn (conn)) ENGINE=InnoDB")
	exec(t, db, "INSERT INTO old_locks VALUES ('held', 'o', 7, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, 0)")
	var wg sync.WaitGroup
	bs := make([]*mysqllock.Backend, 4)
	for i := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bs[i] = open(t, withQuery(srv.URL(), "table", "old_locks"))
		}()
	}
	wg.Wait()
	ctx := context.Background()
	b := bs[0]
	for _, o := range bs {
		defer o.Close()
	}
	if in, err := b.Inspect(ctx, "held"); err != nil || in.Owner != "o" || in.Token != 7 || in.Value != nil {
		t.Fatalf("the old row: %+v, %v", in, err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "a", TTL: time.Minute, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if in, err := bs[1].Inspect(ctx, "k"); err != nil || string(in.Value) != "v" {
		t.Fatalf("Inspect = %+v, %v; want the value", in, err)
	}
}
