// Package drivertest is the conformance suite and the shared benchmarks that every
// dlock backend runs against a real server. A guarantee is stated once, here, and
// checked on every backend.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Harness tells the suite how to reach a backend.
type Harness struct {
	// Open returns a new, independent connection to the same server (a separate
	// client, as another process would have). The suite closes it.
	Open func(t testing.TB) driver.Backend
	// Expire makes the server drop key's current grant now, as TTL expiry or a
	// server that lost its data would (a crashed holder).
	Expire func(t testing.TB, key string)
	// Options are added to every client the suite makes.
	Options []dlock.Option
	// Fencing is true when the backend issues fencing tokens (non-zero).
	Fencing bool
	// FIFO is true when the backend hands a released key to the longest waiter.
	FIFO bool
	// RoundTrip, optional, makes the cheapest request the server answers (PING);
	// benchmarks use it to express latencies in round trips.
	RoundTrip func(ctx context.Context) error
	// Namespace opens a new connection to the same server whose locks live in the
	// namespace ns: the key prefix, root path or table that ns names (a root path
	// is "/" and ns). It returns an error matching driver.ErrInvalid if the backend
	// refuses ns as a namespace. The suite closes the backend. Nil only for a
	// backend without namespaces on one server (memlock, whose stores are apart).
	Namespace func(t testing.TB, ns string) (driver.Backend, error)
	// Ops, optional, returns a running total of the operations the server has
	// served (Redis commandstats calls, ZooKeeper packets received, ...), read on a
	// connection of its own; the cost tests and benchmarks report operations per
	// handoff with it.
	Ops func(ctx context.Context) (int64, error)
	// Floor, optional, takes and releases key the cheapest way the server allows,
	// without dlock (the least correct lock): the baseline BenchCycle compares the
	// backend with.
	Floor func(ctx context.Context, key string) error
}

// Wait bounds every "eventually" in the suite; it is a safety net against a hang,
// not a speed requirement.
const Wait = 20 * time.Second

// Key returns a key unique to this test run, so tests on a shared server do not meet.
func Key(t testing.TB, name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + name + "." + hex.EncodeToString(b[:])
}

// Client opens a client on a fresh connection, closed at the end of the test.
func (h Harness) Client(t testing.TB, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.New(h.Open(t), append(append([]dlock.Option{}, h.Options...), opts...)...)
	if err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	t.Cleanup(cancel)
	return ctx
}

// MustLock locks key with c, failing the test if it cannot: a helper for backend
// tests of their own.
func MustLock(t testing.TB, ctx context.Context, c *dlock.Client, key string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	l, err := c.Lock(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	return l
}

// MustRelease releases l, failing the test if the release fails.
func MustRelease(t testing.TB, ctx context.Context, l *dlock.Lease) {
	t.Helper()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", l.Key(), err)
	}
}

func (h Harness) checkToken(t testing.TB, tok dlock.Token) {
	t.Helper()
	if h.Fencing && tok == 0 {
		t.Fatalf("token is 0 on a fencing backend")
	}
	if !h.Fencing && tok != 0 {
		t.Fatalf("token %d on a backend declared non-fencing", tok)
	}
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	t.Run("TryLockHeld", h.testTryLockHeld)
	t.Run("NotOwner", h.testNotOwner)
	t.Run("CrashedHolderExpires", h.testCrashedHolderExpires)
	t.Run("TTLExpiresOnServer", h.testTTLExpiresOnServer)
	t.Run("TokensIncrease", h.testTokensIncrease)
	t.Run("Reentrancy", h.testReentrancy)
	t.Run("Resume", h.testResume)
	t.Run("SameOwnerElsewhere", h.testSameOwnerElsewhere)
	t.Run("WaiterDeadlines", h.testWaiterDeadlines)
	t.Run("CancelledWaiter", h.testCancelledWaiter)
	t.Run("CancelDuringHandoff", h.testCancelDuringHandoff)
	t.Run("CancelRace", h.testCancelRace)
	t.Run("Handoff", h.testHandoff)
	t.Run("MutualExclusion", h.testMutualExclusion)
	t.Run("DoneOnServerDrop", h.testDoneOnServerDrop)
	t.Run("Bound", h.testBound)
	t.Run("Keys", h.testKeys)
	t.Run("Do", h.testDo)
	t.Run("CloseReleases", h.testCloseReleases)
	t.Run("Inspect", h.testInspect)
	t.Run("ForceRelease", h.testForceRelease)
	t.Run("HandoffCost", h.testHandoffCost)
	t.Run("Namespaces", h.testNamespaces)
	t.Run("ManyWaiters", h.testManyWaiters)
	t.Run("Values", h.testValues)
	t.Run("HolderWatch", h.testHolderWatch)
	t.Run("Observe", h.testObserve)
	t.Run("ResignRetry", h.testResignRetry)
	t.Run("SemaphoreLimit", h.testSemaphoreLimit)
	t.Run("SemaphoreExclusion", h.testSemaphoreExclusion)
	t.Run("SemaphoreCrash", h.testSemaphoreCrash)
	t.Run("RWLock", h.testRWLock)
	t.Run("RWNoStarvation", h.testRWNoStarvation)
	t.Run("RWExclusion", h.testRWExclusion)
	t.Run("Queue", h.testQueue)
	t.Run("List", h.testList)
	t.Run("AcquireAll", h.testAcquireAll)
	t.Run("MultiKey", h.testMultiKey)
	t.Run("MultiKeyNoDeadlock", h.testMultiKeyNoDeadlock)
	t.Run("MultiKeyCancel", h.testMultiKeyCancel)
	t.Run("MultiKeyLoss", h.testMultiKeyLoss)
	if h.FIFO {
		t.Run("FIFO", h.testFIFO)
	}
}
