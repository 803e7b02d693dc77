package zklock_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

func inspectValue(t testing.TB, ctx context.Context, b *zklock.Backend, key string) driver.Info {
	t.Helper()
	info, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect %q: %v", key, err)
	}
	return info
}

// holderData returns the data of the holder's node of key, read behind the backend.
func holderData(t testing.TB, raw *zk.Conn, key string) []byte {
	t.Helper()
	names := children(t, raw, key)
	lowest := ""
	for _, n := range names {
		if strings.HasPrefix(n, "lock-") && (lowest == "" || n[len(n)-10:] < lowest[len(lowest)-10:]) {
			lowest = n
		}
	}
	if lowest == "" {
		t.Fatalf("%q has no holder node", key)
	}
	data, _, err := raw.Get(lockPath(key) + "/" + lowest)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Values live in the contender's node: written by the create (a queued place
// carries its value to the grant), kept by renewals, replaced by SetValue (also
// from another connection of the owner, which the holder's next renewal keeps) and
// by a re-entering attempt, gone with the grant. A node without a value is written
// as older versions wrote it.
func TestValues(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, drivertest.Wait)
	b1 := open(t, srv.URL("/dlock"))
	defer b1.Close()
	b2 := open(t, srv.URL("/dlock"))
	defer b2.Close()
	const key = "values"
	req := func(owner, value string) driver.Request {
		r := driver.Request{Key: key, Owner: owner, TTL: time.Minute}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}

	// No value: the data is the TTL alone, as before.
	if _, err := b1.Acquire(ctx, req("a", "")); err != nil {
		t.Fatal(err)
	}
	if got := string(holderData(t, raw, key)); got != "60000" {
		t.Fatalf("data without a value = %q, want %q", got, "60000")
	}
	if info := inspectValue(t, ctx, b1, key); info.Value != nil || info.TTL <= 0 {
		t.Fatalf("Inspect without a value: %+v", info)
	}
	if err := b1.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}

	// With a value; a queued place of another owner carries its own.
	if _, err := b1.Acquire(ctx, req("a", "addr-a")); err != nil {
		t.Fatal(err)
	}
	w, err := b2.Watch(ctx, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	queued := req("b", "addr-b")
	queued.Wait, queued.Patience = true, time.Minute
	if _, err := b2.Acquire(ctx, queued); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("queued attempt = %v, want ErrLocked", err)
	}
	if info := inspectValue(t, ctx, b2, key); string(info.Value) != "addr-a" || info.Owner != "a" {
		t.Fatalf("Inspect = %+v, want a with addr-a", info)
	}
	if err := b2.SetValue(ctx, key, "b", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by a queued owner = %v, want ErrNotHeld", err)
	}
	if err := b1.SetValue(ctx, key, "nobody", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by a stranger = %v, want ErrNotHeld", err)
	}

	// SetValue keeps the TTL: the header names the start of the TTL, and Inspect
	// does not count the write as a renewal.
	time.Sleep(50 * time.Millisecond)
	before := inspectValue(t, ctx, b1, key).TTL
	if err := b1.SetValue(ctx, key, "a", []byte("addr-a2\nwith a newline")); err != nil {
		t.Fatal(err)
	}
	info := inspectValue(t, ctx, b1, key)
	if string(info.Value) != "addr-a2\nwith a newline" {
		t.Fatalf("value after SetValue = %q", info.Value)
	}
	if info.TTL > before {
		t.Fatalf("TTL left %v after SetValue, %v before: SetValue renewed the grant", info.TTL, before)
	}
	if h, _, _ := bytes.Cut(holderData(t, raw, key), []byte("\n")); !bytes.HasPrefix(h, []byte("60000 ")) {
		t.Fatalf("header after SetValue = %q, want the TTL and its start", h)
	}
	// A renewal keeps the value and writes the TTL alone again.
	if err := b1.Refresh(ctx, key, "a", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := string(holderData(t, raw, key)); got != "30000\naddr-a2\nwith a newline" {
		t.Fatalf("data after Refresh = %q", got)
	}
	// SetValue through another connection of the same owner id: the holder's
	// renewal, whose conditional write then fails, reads it and keeps it.
	if err := b2.SetValue(ctx, key, "a", []byte("from-b2")); err != nil {
		t.Fatal(err)
	}
	if err := b1.Refresh(ctx, key, "a", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := string(inspectValue(t, ctx, b1, key).Value); got != "from-b2" {
		t.Fatalf("value after another connection's SetValue and a renewal = %q", got)
	}
	// A re-entering attempt replaces the value, also with none.
	re := req("a", "")
	re.Reenter = true
	if _, err := b1.Acquire(ctx, re); err != nil {
		t.Fatal(err)
	}
	if info := inspectValue(t, ctx, b1, key); info.Value != nil {
		t.Fatalf("value after re-entering without one = %q", info.Value)
	}
	if err := b1.SetValue(ctx, key, "a", []byte("addr-a3")); err != nil {
		t.Fatal(err)
	}

	// The release hands the key to the queued place, with its value.
	if err := b1.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-ctx.Done():
		t.Fatal("the waiter was not woken")
	}
	if _, err := b2.Acquire(ctx, queued); err != nil {
		t.Fatal(err)
	}
	if info := inspectValue(t, ctx, b1, key); string(info.Value) != "addr-b" || info.Owner != "b" {
		t.Fatalf("Inspect after the handover = %+v, want b with addr-b", info)
	}
	if err := b1.SetValue(ctx, key, "a", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by the former holder = %v, want ErrNotHeld", err)
	}
	if err := b2.SetValue(ctx, key, "b", nil); err != nil {
		t.Fatal(err)
	}
	if info := inspectValue(t, ctx, b1, key); info.Value != nil {
		t.Fatalf("value after SetValue(nil) = %q", info.Value)
	}
	if err := b2.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	if err := b2.SetValue(ctx, key, "b", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue after the release = %v, want ErrNotHeld", err)
	}
}

// A node written by an older version (the TTL alone) reads as a grant without a
// value, and SetValue through a connection that does not hold it works on it.
func TestValueOldFormat(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, drivertest.Wait)
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	const key = "old-format"
	if _, err := raw.Create(lockPath(key), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Create(lockPath(key)+"/lock-old-"+strings.Repeat("ab", 16)+"-", []byte("45000"),
		zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	info := inspectValue(t, ctx, b, key)
	if info.Owner != "old" || info.Value != nil || info.TTL <= 0 || info.TTL > 45*time.Second {
		t.Fatalf("Inspect of an old node = %+v", info)
	}
	if err := b.SetValue(ctx, key, "old", []byte("v")); err != nil {
		t.Fatal(err)
	}
	info = inspectValue(t, ctx, b, key)
	if string(info.Value) != "v" || info.TTL <= 0 || info.TTL > 45*time.Second {
		t.Fatalf("Inspect after SetValue = %+v", info)
	}
}
