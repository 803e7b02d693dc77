package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

// threeClients starts a ZooKeeper and opens three backends on it, the third
// through a proxy (URL query q), closed when the test ends.
func threeClients(t *testing.T, q string) (ctx context.Context, px *proxy, hb, b1, b2 *zklock.Backend) {
	srv := testserver.StartZooKeeper(t)
	px = newProxy(t, srv.Addr())
	ctx = ctxT(t, 60*time.Second)
	hb, b1 = open(t, srv.URL("/dlock")), open(t, srv.URL("/dlock"))
	b2 = open(t, "zk://"+px.Addr()+"/dlock"+q)
	for _, b := range []*zklock.Backend{hb, b1, b2} {
		t.Cleanup(func() { b.Close() })
	}
	return ctx, px, hb, b1, b2
}

// waitingReq returns a waiting attempt's request on key for an owner.
func waitingReq(key string) func(owner string) driver.Request {
	return func(owner string) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute}
	}
}

// A queued waiter whose watch on its predecessor is in place answers its fallback
// attempts without a request (each would list the whole queue: at thousands of
// waiters, those listings saturated the server and the holder's session went), and
// says how many are ahead of it. The proof that no request is made: the attempt is
// answered while the waiter's connection is partitioned away. The chain then still
// passes the key down once the partition heals.
func TestQueuedWaiterAnswersLocally(t *testing.T) {
	const key = "local-answers"
	ctx, px, hb, b1, b2 := threeClients(t, "?session_timeout=20s")
	req := waitingReq(key)
	if _, err := hb.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w1, err := b1.Watch(ctx, key, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Stop(ctx, false)
	w2, err := b2.Watch(ctx, key, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop(ctx, false)
	queued := func(b driver.Backend, owner string, ahead int) {
		t.Helper()
		_, err := b.Acquire(ctx, req(owner))
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("waiting attempt of %s = %v, want a HeldError", owner, err)
		}
		if held.Ahead != ahead {
			t.Fatalf("waiting attempt of %s: Ahead = %d, want %d", owner, held.Ahead, ahead)
		}
	}
	queued(b1, "w1", 0)
	queued(b2, "w2", 1)

	px.Partition()
	for range 3 {
		queued(b2, "w2", 1) // a request could not get through
	}
	px.Heal()
	eventually(t, "the waiter's backend reconnects", func() bool {
		return px.Accepted() >= 2 && b2.Conn().State() == zk.StateHasSession
	})

	if err := hb.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w1.C():
	case <-ctx.Done():
		t.Fatal("the first waiter was not woken by the release")
	}
	if _, err := b1.Acquire(ctx, req("w1")); err != nil {
		t.Fatalf("first waiter after the release: %v", err)
	}
	if err := b1.Release(ctx, key, "w1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w2.C():
	case <-ctx.Done():
		t.Fatal("the second waiter was not woken by the release")
	}
	if _, err := b2.Acquire(ctx, req("w2")); err != nil {
		t.Fatalf("second waiter after the release: %v", err)
	}
	if err := b2.Release(ctx, key, "w2"); err != nil {
		t.Fatal(err)
	}
}

// A mutex's waiter second in line (only the holder below its child at its last
// listing) is granted without a request once the holder's child is deleted: no
// child can come below it later. One further back is not: its predecessor, a
// waiter that gave up, was not the holder, and its next attempt lists the queue
// and is refused.
func TestSecondInLineGrantedWithoutListing(t *testing.T) {
	const key = "second-in-line"
	ctx, px, hb, b1, b2 := threeClients(t, "")
	req := waitingReq(key)
	wake := func(w driver.Waiter, who string) {
		t.Helper()
		select {
		case <-w.C():
		case <-ctx.Done():
			t.Fatalf("%s was not woken", who)
		}
	}
	if _, err := hb.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w1, err := b1.Watch(ctx, key, "w1")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := b2.Watch(ctx, key, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop(ctx, false)
	for _, q := range []struct {
		b     driver.Backend
		owner string
	}{{b1, "w1"}, {b2, "w2"}} {
		if _, err := q.b.Acquire(ctx, req(q.owner)); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("waiting attempt of %s = %v, want ErrLocked", q.owner, err)
		}
	}
	// w1, in front of w2, gives up: w2 is woken, lists, and is still refused.
	if err := w1.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	wake(w2, "the waiter behind one that gave up")
	if _, err := b2.Acquire(ctx, req("w2")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("attempt after the waiter ahead gave up = %v, want ErrLocked", err)
	}
	// Now second in line: the holder's release grants the key without a request.
	if err := hb.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	wake(w2, "the waiter second in line")
	before := px.Requests()
	g, err := b2.Acquire(ctx, req("w2"))
	if err != nil {
		t.Fatalf("second in line after the release: %v", err)
	}
	if n := px.Requests() - before; n != 0 {
		t.Errorf("the grant took %d requests, want none", n)
	}
	if in, err := hb.Inspect(ctx, key); err != nil || in.Owner != "w2" || in.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v; want w2 with token %d", in, err, g.Token)
	}
	if err := b2.Release(ctx, key, "w2"); err != nil {
		t.Fatal(err)
	}
}

// A waiting Lock whose ZooKeeper session ends fails promptly, with an error that is
// not ErrLocked, rather than wait on a queued place that is gone: when the session
// is closed from outside (the backend learns of the expiry on reconnection), and
// when the connection is cut for longer than the session timeout (it never hears
// from the ensemble again).
func TestWaiterSessionLoss(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, px *proxy)
	}{
		{"expired", func(t *testing.T, px *proxy) {
			sid, pw := px.Session()
			if err := closeSessionFromOutside(srv.Addr(), sid, pw); err != nil {
				t.Fatal(err)
			}
		}},
		{"partitioned", func(t *testing.T, px *proxy) { px.Partition() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := newProxy(t, srv.Addr())
			ctx := ctxT(t, 2*drivertest.Wait)
			holder := newClient(t, open(t, srv.URL("/dlock")), dlock.WithTTL(time.Minute))
			wb := open(t, "zk://"+px.Addr()+"/dlock?session_timeout=2s")
			waiter := newClient(t, wb, dlock.WithTTL(time.Minute))
			key := "session-loss-" + tc.name
			l, err := holder.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			errc := make(chan error, 1)
			queued := make(chan struct{}, 1)
			go func() {
				// Queued: the attempt that queued it has returned (its watch on
				// the holder's node is set).
				l2, err := waiter.Lock(ctx, key, dlock.WithQueueReport(func(int) {
					select {
					case queued <- struct{}{}:
					default:
					}
				}))
				if err == nil {
					_ = l2.Release(ctx)
				}
				errc <- err
			}()
			select {
			case <-queued:
			case err := <-errc:
				t.Fatalf("waiting Lock before its session ended: %v", err)
			}
			tc.end(t, px)
			select {
			case err := <-errc:
				if err == nil || errors.Is(err, dlock.ErrLocked) {
					t.Fatalf("waiting Lock after its session ended = %v, want an error that is not ErrLocked", err)
				}
				t.Logf("waiting Lock: %v", err)
			case <-time.After(drivertest.Wait):
				t.Fatal("the waiting Lock did not fail when its session ended")
			}
			// The place is gone from the queue (with the session, or deleted).
			px.Heal()
			eventually(t, "the lost place leaves the queue", func() bool { return len(children(t, raw, key)) == 1 })
			// A new session, or the old one if the ensemble had not expired it
			// yet when the partition healed (the place was then deleted).
			eventually(t, "the backend reconnects", func() bool { return wb.Conn().State() == zk.StateHasSession })
			// The backend carries on: a new Lock queues and is granted.
			go func() {
				l2, err := waiter.Lock(ctx, key)
				if err == nil {
					err = l2.Release(ctx)
				}
				errc <- err
			}()
			eventually(t, "a new waiter queues", func() bool { return len(children(t, raw, key)) == 2 })
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("Lock after the session was lost: %v", err)
			}
		})
	}
}
