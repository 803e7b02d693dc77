// Package dlock is a distributed lock with leases and fencing tokens, behind one
// small API, on several backends (Redis, Redlock, etcd, ZooKeeper, PostgreSQL, and an
// in-process reference backend).
//
// # Using it
//
// A backend registers its URL scheme when its package is imported: import
// github.com/dlockio/dlock/redislock (or one of the others) for its side effect, or
// github.com/dlockio/dlock/all for every backend.
//
//	import (
//		"github.com/dlockio/dlock"
//		_ "github.com/dlockio/dlock/redislock" // redis://, rediss://
//	)
//
//	c, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	err = c.Do(ctx, "nightly-report", func(ctx context.Context, l *dlock.Lease) error {
//		// ctx is cancelled the moment the lock may be lost.
//		return store.Write(ctx, l.Token(), report) // the store rejects stale tokens
//	})
//
// # The safety model, plainly
//
// A lock is a lease: the server keeps it for a TTL unless the holder renews it. The
// client renews in the background (every TTL/3 by default). The client also keeps a
// local validity deadline, start + TTL - drift, measured on the monotonic clock from
// the moment the acquire (or the last successful renewal) was sent; for a key that
// the previous holder's release handed straight to a waiter, from the moment that
// waiter last asked the server, which is before the server granted. When a renewal is
// refused, or the deadline passes without a successful renewal, the lease is lost:
// Lease.Done closes and Lease.Context is cancelled with cause ErrLeaseLost. Because
// the deadline is earlier than the server's expiry by the drift allowance, the holder
// learns of the loss before the server can grant the lock to anyone else, provided
// the two clocks run at about the same rate and the holder's process is not paused.
//
// A process can be paused at any moment (garbage collection, swapping, SIGSTOP), and
// then no timing rule helps: it may resume and act after its lease expired. That is
// what fencing tokens are for. Every grant carries a Token that is larger than the
// token of every earlier grant of the same key (as far as the backend can promise;
// each backend's documentation says how far). Pass the token to the resource you
// protect and have it reject any token lower than the highest it has seen: then a
// paused, stale holder cannot do damage. A token of 0 means the backend cannot fence.
//
// What each backend adds or takes away (replication, persistence, clocks) is written
// in its package documentation.
//
// # Owners and reentrancy
//
// Every grant has an owner id. By default each Lock call uses a new random 128-bit
// owner, so two goroutines exclude each other like with sync.Mutex. Presenting the
// owner id of the current holder (WithOwner, e.g. with Lease.Owner) to the same
// Client re-enters the lock: the call succeeds at once with the same token, and the
// lock is freed only when every such lease has been released. The count lives in the
// Client and never reaches the server.
//
// Another Client or process that presents the same owner id is refused while the key
// is held, like any other owner: TryLock returns ErrLocked, Lock waits (by its
// fallback timer: nothing wakes a waiter refused this way), and the refused attempt
// changes nothing on the server (no TTL extension, no token, no place in a queue), so
// it can neither keep a crashed holder's grant alive nor free it. Two processes that
// share an owner id therefore never hold the key at once. A process restarted with a
// stable owner id takes over the grant its previous run still holds only with
// WithResume; that asserts that no other live process uses the id, since if one does
// both hold at once with one token and fencing cannot separate them.
//
// When the ctx of a waiting Lock ends, the error matches both ErrLocked and ctx.Err(),
// whether it ended between attempts or during a request to the server. A request cut
// short may still have been granted on the server; when the call's owner id was
// generated (its own), the client gives that grant back in the background, at most
// four such releases at once per Client, so that a storm of calls cut short cannot
// queue a connection each on the server; a release that does not get its turn
// within two seconds is dropped (the grant then expires after its TTL), and one
// that does has two seconds from then. A TTL too short for the time a request takes
// (grants that keep arriving after their validity) is ErrValidityTooShort.
//
// # Waiting
//
// Lock waits until the key is free or ctx ends. Backends that can notify wake waiters
// (pub/sub, watches, LISTEN/NOTIFY) and the core falls back to a bounded timer only in
// case a wake-up is lost; other backends are polled with jittered exponential backoff.
// A queueing backend may hand a released key directly to the first waiter, so that
// its Lock returns without another request (see driver.Waiter).
//
// # Lock types
//
// Beside the mutex: a semaphore (WithLimit: up to n holders of a key, each with its
// own lease and token), a read-write lock (WithShared: readers together, a writer
// alone, FIFO so that readers cannot starve a writer), a multi-key lock (LockAll:
// several keys all or nothing, one MultiLease for the set, taken in sorted key order
// so that callers cannot deadlock one another), and leader election (Campaign, an
// election being the lock of its name, with the token as the epoch). Each is an
// optional driver capability; a backend without it returns an error matching
// ErrUnsupported, except LockAll, which every backend can do key by key.
//
// # Administration
//
// Client.Inspect reads who holds a key (owner id, token, time left, waiters), and
// Client.ForceRelease frees a key whoever holds it, on backends that can (others
// return an error matching ErrUnsupported). A force-released holder is not told and
// may still run until its next renewal fails: only fencing tokens keep the resource
// safe from it.
package dlock
