package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// member returns the member key of owner in key's range, or fails.
func member(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key, owner string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(context.Background(), b.LockPrefix(key), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if v := string(kv.Value); v == owner || strings.HasPrefix(v, owner+"\x00") {
			return kv
		}
	}
	t.Fatalf("no member of %s in %q", owner, key)
	return nil
}

func wantValue(t *testing.T, b driver.Backend, key, owner, value string) {
	t.Helper()
	info, err := b.(driver.Inspector).Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Owner != owner || string(info.Value) != value || (value == "" && info.Value != nil) {
		t.Fatalf("Inspect = owner %s value %q; want %s, %q", info.Owner, info.Value, owner, value)
	}
}

// Values live in the member keys: owner 0x00 value, or the owner alone without
// one. A queued place keeps its value into the grant; SetValue changes the
// holder's only, keeps its lease, and works for the owner's grant made through
// another client; a re-entry replaces the value; a resumed grant with a value is
// released by the client that resumed it.
func TestValues(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	b2 := open(t, srv.URL("dlock"))
	defer b2.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	req := func(owner, value string) driver.Request {
		r := driver.Request{Key: key, Owner: owner, TTL: time.Minute}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}

	g, err := b.Acquire(ctx, req("alice", "addr-1"))
	if err != nil {
		t.Fatal(err)
	}
	if m := member(t, cli, b, key, "alice"); string(m.Value) != "alice\x00addr-1" {
		t.Fatalf("member value %q", m.Value)
	}
	wantValue(t, b, key, "alice", "addr-1")

	// A queued place carries its value; SetValue of an owner that only queues
	// changes nothing.
	w, err := b2.Watch(ctx, key, "bob")
	if err != nil {
		t.Fatal(err)
	}
	breq := req("bob", "addr-2")
	breq.Wait, breq.Patience = true, time.Minute
	if _, err := b2.Acquire(ctx, breq); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("queued Acquire = %v", err)
	}
	if err := b2.SetValue(ctx, key, "bob", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue of a queued owner = %v, want ErrNotHeld", err)
	}
	if m := member(t, cli, b, key, "bob"); string(m.Value) != "bob\x00addr-2" {
		t.Fatalf("queued member value %q after a refused SetValue", m.Value)
	}

	// SetValue keeps the lease; a Refresh still finds the grant.
	before := member(t, cli, b, key, "alice")
	if err := b.SetValue(ctx, key, "alice", []byte("addr-1b")); err != nil {
		t.Fatal(err)
	}
	if m := member(t, cli, b, key, "alice"); m.Lease != before.Lease || m.CreateRevision != before.CreateRevision {
		t.Fatalf("SetValue moved the member: %+v, was %+v", m, before)
	}
	wantValue(t, b, key, "alice", "addr-1b")
	if err := b.Refresh(ctx, key, "alice", time.Minute); err != nil {
		t.Fatalf("Refresh after SetValue: %v", err)
	}
	// A re-entry replaces the value, with the same token; nil removes it.
	re := req("alice", "addr-1c")
	re.Reenter = true
	if g2, err := b.Acquire(ctx, re); err != nil || g2.Token != g.Token {
		t.Fatalf("re-entry = %+v, %v", g2, err)
	}
	wantValue(t, b, key, "alice", "addr-1c")
	re.Value = nil
	if _, err := b.Acquire(ctx, re); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, key, "alice", "")
	if m := member(t, cli, b, key, "alice"); string(m.Value) != "alice" {
		t.Fatalf("member value without a value %q, want the owner alone", m.Value)
	}

	// The handoff carries the queued place's value.
	if err := b.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("queued waiter not woken")
	}
	if _, err := b2.Acquire(ctx, breq); err != nil {
		t.Fatalf("woken Acquire: %v", err)
	}
	_ = w.Stop(ctx, true)
	wantValue(t, b, key, "bob", "addr-2")
	// SetValue and Release of bob's grant through a client that did not make it.
	if err := b.SetValue(ctx, key, "bob", []byte("addr-2b")); err != nil {
		t.Fatalf("SetValue through another client: %v", err)
	}
	wantValue(t, b, key, "bob", "addr-2b")
	if err := b.Release(ctx, key, "bob"); err != nil {
		t.Fatalf("Release through another client: %v", err)
	}
	if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after release = %v", err)
	}
	if err := b2.SetValue(ctx, key, "bob", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue after release = %v, want ErrNotHeld", err)
	}

	// A resumed grant (another process, same owner id) takes the resuming
	// request's value, and its client releases it.
	if _, err := b2.Acquire(ctx, req("job-7", "old")); err != nil {
		t.Fatal(err)
	}
	res := req("job-7", "new")
	res.Reenter, res.Resume = true, true
	if _, err := b.Acquire(ctx, res); err != nil {
		t.Fatalf("resume: %v", err)
	}
	wantValue(t, b, key, "job-7", "new")
	if err := b.SetValue(ctx, key, "job-7", []byte("newer")); err != nil {
		t.Fatalf("SetValue of the resumed grant: %v", err)
	}
	if err := b.Release(ctx, key, "job-7"); err != nil {
		t.Fatalf("Release of the resumed grant: %v", err)
	}
	if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after release = %v", err)
	}
}

// A holder watch is told of changes in its lock only, ends with the backend, and
// cannot be started on a closed one.
func TestHolderWatchScope(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := open(t, srv.URL("dlock"))
	other := open(t, srv.URL("dlock"))
	defer other.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	w, err := b.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// A lock whose name starts with key's is another range.
	if _, err := other.Acquire(ctx, driver.Request{Key: key + "x", Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(ctx, driver.Request{Key: key, Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("no notification of the grant")
	}
	select {
	case <-w.C():
		t.Fatal("notified of another lock's grant")
	case <-time.After(200 * time.Millisecond):
	}
	if err := b.Close(); err != nil { // with the watch running
		t.Fatal(err)
	}
	w.Stop()
	if _, err := b.WatchHolder(ctx, key); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("WatchHolder on a closed backend = %v, want ErrClosed", err)
	}
}

// A waiting Lock and a waiting Campaign, with contexts without a deadline, whose
// session lease is revoked from another etcd client give up promptly (well within
// drivertest.Wait; the session notices at its next keep-alive, a third of the TTL)
// with ErrSessionLost, not ErrLocked; the client then locks afresh.
func TestSessionLossWaiting(t *testing.T) {
	srv := testserver.StartEtcd(t)
	h := harness(t, srv)
	cli := rawClient(t, srv.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 2*drivertest.Wait)
	defer cancel()
	holder, a := h.Client(t), h.Client(t)
	lockKey, electKey := drivertest.Key(t, "lock"), drivertest.Key(t, "elect")
	hl, err := holder.Lock(ctx, lockKey)
	if err != nil {
		t.Fatal(err)
	}
	he, err := holder.Campaign(ctx, electKey, []byte("h"))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() {
		_, err := a.Lock(context.Background(), lockKey)
		errs <- err
	}()
	go func() {
		_, err := a.Campaign(context.Background(), electKey, []byte("a"))
		errs <- err
	}()
	in := holder.Backend().(driver.Inspector)
	for _, k := range []string{lockKey, electKey} {
		for {
			if info, err := in.Inspect(ctx, k); err == nil && info.Waiters == 1 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The waiters' member keys are the second ones, on a's session lease.
	resp, err := cli.Get(ctx, a.Backend().(*etcdlock.Backend).LockPrefix(lockKey), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil || len(resp.Kvs) != 2 {
		t.Fatalf("members: %v, %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[1].Lease)); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for range 2 {
		select {
		case err := <-errs:
			if err == nil || errors.Is(err, dlock.ErrLocked) || !errors.Is(err, etcdlock.ErrSessionLost) {
				t.Fatalf("waiting call after its session was revoked = %v, want ErrSessionLost and not ErrLocked", err)
			}
			t.Logf("gave up after %v: %v", time.Since(revoked).Round(time.Millisecond), err)
		case <-time.After(drivertest.Wait):
			t.Fatal("a waiting call did not give up after its session lease was revoked")
		}
	}
	if hl.Err() != nil || he.Err() != nil {
		t.Fatalf("the holder's grants ended: %v, %v", hl.Err(), he.Err())
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := a.TryLock(ctx, lockKey)
	if err != nil {
		t.Fatalf("TryLock after the session loss: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := he.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
