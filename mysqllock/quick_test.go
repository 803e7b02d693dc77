package mysqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// TestQuickGrantFailsWhole: a reader's short grant is one request of several
// statements (quickBatch); when one fails after the row's UPDATE ran (here the
// permit's INSERT waits past the lock wait timeout for a range another session
// share-locks), the transaction is rolled back with its connection, not left open
// in the pool, where the next request's START TRANSACTION would commit the UPDATE
// without its permit (a token spent, the row's lock held until then). The retry
// is granted the next token.
func TestQuickGrantFailsWhole(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	g1, err := b.Acquire(ctx, reader(key, "r1"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT owner FROM `"+mysqllock.DefaultTable+"_sem` WHERE lock_key = ? LOCK IN SHARE MODE", key); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	time.AfterFunc(1500*time.Millisecond, func() { tx.Rollback() }) // past one lock wait timeout
	g2, err := b.Acquire(ctx, reader(key, "r2"))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token != g1.Token+1 {
		t.Fatalf("the second reader's token is %d, the first's %d: a failed attempt's UPDATE was committed", g2.Token, g1.Token)
	}
}

// TestQuickGrantOnCallersPool: a backend made by New on the caller's pool (which
// cannot take several statements in one request) grants readers beside readers in
// a transaction of its own statements instead, refuses a writer beside them, and
// grants it once they are gone.
func TestQuickGrantOnCallersPool(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	b, err := mysqllock.New(ctx, admin(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	key := drivertest.Key(t, "k")
	var last uint64
	for _, owner := range []string{"r1", "r2", "r3"} {
		g, err := b.Acquire(ctx, reader(key, owner))
		if err != nil {
			t.Fatalf("reader %s: %v", owner, err)
		}
		if g.Token <= last {
			t.Fatalf("reader %s: token %d after %d", owner, g.Token, last)
		}
		last = g.Token
	}
	if _, err := b.Acquire(ctx, writer(key, "w")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a writer beside readers: %v, want ErrLocked", err)
	}
	for _, owner := range []string{"r1", "r2", "r3"} {
		if err := b.Release(ctx, key, owner); err != nil {
			t.Fatal(err)
		}
	}
	g, err := b.Acquire(ctx, writer(key, "w"))
	if err != nil || g.Token <= last {
		t.Fatalf("the writer once the readers left: %+v, %v", g, err)
	}
}

// TestQuickGrantKeyEscaped: the short grant's request has its parameters written
// into the text by the driver; keys, owners and values with quotes, backslashes and
// statement separators are stored as they are and run nothing.
func TestQuickGrantKeyEscaped(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	b := open(t, srv.URL())
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k'\"\\'; DELETE FROM "+mysqllock.DefaultTable+"; -- ")
	owner := "o'\\; --"
	val := []byte("v'\\\"; DROP TABLE x; --\x00\xff")
	// The first reader makes the key's row (a transaction of single statements);
	// the second takes the short grant.
	for _, o := range []string{"first", owner} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Shared: true, Value: val}); err != nil {
			t.Fatal(err)
		}
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 2 || hs[1].Owner != owner {
		t.Fatalf("Holders = %+v, %v; want the readers \"first\" and %q", hs, err, owner)
	}
	for _, h := range hs {
		if h.Key != key || string(h.Value) != string(val) || !h.Shared {
			t.Fatalf("holder %+v; want key %q, value %q, shared", h, key, val)
		}
	}
}

// TestQuickGrantCharsets: short grants go as one request (parameters written into
// the text, escaped) only on connections whose character set reads the escaping as
// written; with GBK, where a multi-byte character may end in a backslash byte, they
// keep their parameters apart, and readers with values of such bytes work.
func TestQuickGrantCharsets(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	for _, tc := range []struct {
		charset string
		batched bool
	}{{"", true}, {"utf8mb4", true}, {"latin1,utf8mb4", true}, {"gbk", false}, {"utf8mb4,sjis", false}} {
		raw := srv.URL()
		if tc.charset != "" {
			raw = withQuery(raw, "charset", tc.charset)
		}
		b := open(t, raw)
		if got := mysqllock.Batched(b); got != tc.batched {
			t.Errorf("charset %q: batched %v, want %v", tc.charset, got, tc.batched)
		}
		key := drivertest.Key(t, "k-"+tc.charset)
		val := []byte("\xbf'\xbf\\'; --")
		for _, o := range []string{"r1", "r2"} {
			if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: time.Minute, Shared: true, Value: val}); err != nil {
				t.Fatalf("charset %q: %v", tc.charset, err)
			}
		}
		if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 2 || string(hs[1].Value) != string(val) {
			t.Fatalf("charset %q: Holders = %+v, %v", tc.charset, hs, err)
		}
		b.Close()
	}
}
