package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// holderLease returns the lease of the first member of key.
func holderLease(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(context.Background(), b.LockPrefix(key), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("no holder of %q: %v", key, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// When a client's session lease ends on the server, every lease of that session ends
// at once (without waiting for the next renewal), and a Lock of that client waiting
// in a queue gives up with ErrSessionLost.
func TestSessionLoss(t *testing.T) {
	srv := testserver.StartEtcd(t)
	h := harness(t, srv)
	cli := rawClient(t, srv.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Renewal every 2.5s: the loss must be noticed through the session, sooner.
	a := h.Client(t, dlock.WithTTL(3*time.Second), dlock.WithRenewInterval(2500*time.Millisecond))
	other := h.Client(t)
	la1, err := a.Lock(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	la2, err := a.Lock(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := other.Lock(ctx, "three")
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Lock(ctx, "three")
		waitErr <- err
	}()
	in := a.Backend().(driver.Inspector)
	for {
		if info, err := in.Inspect(ctx, "three"); err == nil && info.Waiters == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	b := a.Backend().(*etcdlock.Backend)
	revoked := time.Now()
	if _, err := cli.Revoke(ctx, holderLease(t, cli, b, "one")); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*dlock.Lease{la1, la2} {
		select {
		case <-l.Done():
		case <-time.After(2 * time.Second): // keep-alive every second with a 3s TTL
			t.Fatalf("lease %q still valid %v after its session lease was revoked", l.Key(), time.Since(revoked))
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLeaseLost) {
			t.Fatalf("lease %q ended with %v, want ErrLeaseLost", l.Key(), cause)
		}
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, etcdlock.ErrSessionLost) {
			t.Fatalf("waiting Lock = %v, want ErrSessionLost", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter did not give up after its session ended")
	}
	if lo.Err() != nil {
		t.Fatalf("another client's lease ended too: %v", lo.Err())
	}
	// The client recovers: a new session for new locks.
	l, err := a.TryLock(ctx, "one")
	if err != nil {
		t.Fatalf("TryLock after the session loss: %v", err)
	}
	if l.Token() <= la1.Token() {
		t.Fatalf("token %d after the loss, not above %d", l.Token(), la1.Token())
	}
	for _, l := range []*dlock.Lease{l, lo} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A restarted process with the same owner id that calls Lock (a waiting lock) with
// WithResume resumes its grant at once, with the same token, instead of queueing
// behind itself.
func TestResumeWaiting(t *testing.T) {
	srv := testserver.StartEtcd(t)
	h := harness(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := h.Client(t, dlock.WithOwner("job-7"))
	l, err := before.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	waiter := h.Client(t)
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := waiter.Lock(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	in := before.Backend().(driver.Inspector)
	for {
		if info, err := in.Inspect(ctx, "k"); err == nil && info.Waiters == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	after := h.Client(t, dlock.WithOwner("job-7"))
	l2, err := after.Lock(ctx, "k", dlock.WithResume())
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() != l.Token() {
		t.Fatalf("resumed token %d, want %d", l2.Token(), l.Token())
	}
	info, err := in.Inspect(ctx, "k")
	if err != nil || info.Owner != "job-7" || info.Waiters != 1 {
		t.Fatalf("after resuming: Inspect = %+v, %v; want owner job-7 and the one waiter", info, err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lw := <-got
	if lw == nil {
		t.FailNow()
	}
	if lw.Token() <= l.Token() {
		t.Fatalf("waiter's token %d not above %d", lw.Token(), l.Token())
	}
	if err := lw.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Member key names are reused from one grant to the next, whatever the owner, so
// etcd's index does not grow with every grant.
func TestMemberNamesReused(t *testing.T) {
	srv := testserver.StartEtcd(t)
	h := harness(t, srv)
	cli := rawClient(t, srv.Endpoint())
	ctx := context.Background()
	c := h.Client(t)
	b := c.Backend().(*etcdlock.Backend)
	names := map[string]bool{}
	for range 20 {
		l, err := c.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, b.LockPrefix("k"), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("members: %v %v", resp, err)
		}
		kv := resp.Kvs[0]
		if string(kv.Value) != l.Owner() || !strings.HasPrefix(string(kv.Key), b.LockPrefix("k")) {
			t.Fatalf("member %s = %s, want the owner %s", kv.Key, kv.Value, l.Owner())
		}
		names[string(kv.Key)] = true
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(names) != 1 {
		t.Fatalf("20 grants used %d member key names: %v", len(names), names)
	}
}
