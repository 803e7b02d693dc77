package zklock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// expectNotice waits for a notification of hw.
func expectNotice(t testing.TB, ctx context.Context, hw driver.HolderWatch, what string) {
	t.Helper()
	select {
	case <-hw.C():
	case <-ctx.Done():
		t.Fatalf("no notification after %s", what)
	}
}

// drain empties hw's channel of what is there already.
func drain(hw driver.HolderWatch) {
	select {
	case <-hw.C():
	default:
	}
}

// The holder watch sends on a grant, a SetValue, a release, a handover, a force
// release and a reconnection; not on a renewal (the data watch fires, the value has
// not changed).
func TestHolderWatch(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	ctx := ctxT(t, drivertest.Wait)
	wb := open(t, "zk://"+px.Addr()+"/dlock?session_timeout=6s")
	defer wb.Close()
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	const key = "holder-watch"
	hw, err := wb.WatchHolder(ctx, key) // no lock node yet
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	req := func(owner string) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Value: []byte("v-" + owner)}
	}
	if _, err := b.Acquire(ctx, req("a")); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the first grant")
	if err := b.Refresh(ctx, key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hw.C():
		t.Fatal("a notification after a renewal")
	case <-time.After(300 * time.Millisecond):
	}
	if err := b.SetValue(ctx, key, "a", []byte("changed")); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "SetValue")

	waiting := req("b")
	waiting.Wait, waiting.Patience = true, time.Minute
	w, err := b.Watch(ctx, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	if _, err := b.Acquire(ctx, waiting); !errors.Is(err, driver.ErrLocked) {
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the release")
	<-w.C()
	if _, err := b.Acquire(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	if info := inspectValue(t, ctx, wb, key); info.Owner != "b" {
		t.Fatalf("holder %q, want b", info.Owner)
	}
	drain(hw)
	if err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the force release")

	drain(hw)
	px.Cut()
	expectNotice(t, ctx, hw, "a reconnection")
	eventually(t, "the watcher reconnects", func() bool { return wb.Conn().State() == zk.StateHasSession })
	// The watches still work on the reconnected session.
	drain(hw)
	if _, err := b.Acquire(ctx, req("c")); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "a grant after the reconnection")
	if err := b.Release(ctx, key, "c"); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "a release after the reconnection")
}

// A holder watch whose session expires sends, and watches again on the new session.
func TestHolderWatchSessionExpiry(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	ctx := ctxT(t, drivertest.Wait)
	wb := open(t, "zk://"+px.Addr()+"/dlock")
	defer wb.Close()
	b := open(t, srv.URL("/dlock"))
	defer b.Close()
	const key = "holder-watch-expiry"
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	hw, err := wb.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	sid, pw := px.Session()
	if err := closeSessionFromOutside(srv.Addr(), sid, pw); err != nil {
		t.Fatal(err)
	}
	expectNotice(t, ctx, hw, "the session expired")
	eventually(t, "a new session", func() bool {
		return wb.Conn().State() == zk.StateHasSession && wb.Conn().SessionID() != sid
	})
	// Let the watch set its watches on the new session, then change the holder.
	deadline := time.Now().Add(drivertest.Wait)
	for {
		drain(hw)
		if err := b.SetValue(ctx, key, "a", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
			t.Fatal(err)
		}
		select {
		case <-hw.C():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no notification of a SetValue on the new session")
		}
	}
}
