package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// flaky wraps the reference backend so a test can make refreshes fail.
type flaky struct {
	*memlock.Backend
	refreshErr atomic.Pointer[error]
	refreshes  atomic.Int64
}

func (f *flaky) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	f.refreshes.Add(1)
	if e := f.refreshErr.Load(); e != nil {
		return *e
	}
	return f.Backend.Refresh(ctx, key, owner, ttl)
}

func setup(t *testing.T, opts ...dlock.Option) (*dlock.Client, *flaky, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	st := memlock.NewStore(clk)
	fb := &flaky{Backend: st.Backend()}
	c, err := dlock.New(fb, append([]dlock.Option{dlock.WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, fb, clk
}

func serverTTL(t *testing.T, fb *flaky, key string) time.Duration {
	t.Helper()
	info, err := fb.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return info.TTL
}

// waitLost waits (in real time, bounded) for lease l to end, and fails with msg if
// it does not, or if it ended otherwise than lost.
func waitLost(t *testing.T, l *dlock.Lease, msg string) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
}

// waitRefreshes waits (in real time, bounded) for the renewal goroutine to finish n
// refreshes after a clock advance.
func waitRefreshes(t *testing.T, fb *flaky, n int64) {
	t.Helper()
	waitAtLeast(t, &fb.refreshes, n, "refreshes")
}

// waitAtLeast waits (in real time, bounded) until counter v reaches n.
func waitAtLeast(t *testing.T, v *atomic.Int64, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for v.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s, want %d", v.Load(), what, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRenewsEveryThirdOfTTL(t *testing.T) {
	c, fb, clk := setup(t, dlock.WithTTL(9*time.Second))
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i <= 5; i++ {
		clk.BlockUntil(1) // the renewal timer is armed
		clk.Advance(3 * time.Second)
		waitRefreshes(t, fb, i)
		// The refresh restored the server TTL although 3s*i have passed.
		for serverTTL(t, fb, "k") != 9*time.Second {
			time.Sleep(time.Millisecond)
		}
		if l.Err() != nil {
			t.Fatalf("lease lost after %d renewals: %v", i, l.Err())
		}
	}
	want := clk.Now().Add(9*time.Second - (90*time.Millisecond + 2*time.Millisecond))
	if got := l.Expiry(); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want %v", got, want)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// When renewals fail transiently, the lease is declared lost at the local validity
// deadline, start + TTL - drift: strictly before the server would let anyone else in.
func TestLostAtDeadlineBeforeServerExpiry(t *testing.T) {
	c, fb, clk := setup(t, dlock.WithTTL(10*time.Second), dlock.WithDrift(0.05, 10*time.Millisecond))
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	transient := errors.New("connection reset")
	fb.refreshErr.Store(&transient)
	validity := 10*time.Second - (500*time.Millisecond + 10*time.Millisecond)
	if got := l.Expiry(); !got.Equal(t0.Add(validity)) {
		t.Fatalf("Expiry = %v, want start+%v", got, validity)
	}
	// Walk the clock in small steps up to just before the deadline.
	for clk.Now().Before(t0.Add(validity - 100*time.Millisecond)) {
		clk.BlockUntil(1)
		clk.Advance(100 * time.Millisecond)
	}
	if l.Err() != nil {
		t.Fatalf("lost before the deadline: %v", l.Err())
	}
	clk.BlockUntil(1)
	clk.Set(t0.Add(validity))
	waitLost(t, l, "Done not closed at the validity deadline")
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !strings.Contains(l.Err().Error(), "deadline") {
		t.Fatalf("Err = %v, want ErrLeaseLost for the deadline", l.Err())
	}
	// The server still holds the grant: nobody else can have it yet.
	if ttl := serverTTL(t, fb, "k"); ttl <= 0 {
		t.Fatalf("server grant already gone when the lease was declared lost")
	}
	if _, err := c.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock right after local loss = %v, want ErrLocked", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
}

func TestLostAtOnceWhenRenewalRefused(t *testing.T) {
	c, fb, clk := setup(t, dlock.WithTTL(9*time.Second))
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	fb.Store().Expire("k")
	clk.BlockUntil(1)
	clk.Advance(3 * time.Second)
	waitLost(t, l, "Done not closed after a refused renewal")
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) || !errors.Is(l.Err(), dlock.ErrNotHeld) {
		t.Fatalf("cause = %v, want ErrLeaseLost wrapping ErrNotHeld", l.Err())
	}
}

// A waiter for a key whose holder crashed sleeps until the grant's expiry (the
// backend's hint), then gets it; no busy loop in between.
func TestWaiterWakesAtExpiryOfCrashedHolder(t *testing.T) {
	c, fb, clk := setup(t)
	ctx := context.Background()
	if _, err := fb.Acquire(ctx, driver.Request{Key: "k", Owner: "crashed", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	got := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, "k", dlock.WithRetry(time.Millisecond, time.Minute))
		attempts.Store(1)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	clk.BlockUntil(1) // the waiter sleeps on one timer
	clk.Advance(4 * time.Second)
	select {
	case err := <-got:
		t.Fatalf("waiter returned before the holder's TTL ran out: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	clk.BlockUntil(1)
	clk.Advance(time.Second + time.Millisecond)
	if err := <-got; err != nil {
		t.Fatalf("Lock after expiry: %v", err)
	}
}

// Many goroutines of one client with fresh owners exclude each other; with one
// shared owner they re-enter.
func TestGoroutinesExcludeUnlessSameOwner(t *testing.T) {
	c, _, _ := setup(t)
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
			t.Errorf("other goroutine: %v, want ErrLocked", err)
		}
		l2, err := c.TryLock(ctx, "k", dlock.WithOwner(l.Owner()))
		if err != nil {
			t.Errorf("same owner: %v", err)
			return
		}
		_ = l2.Release(ctx)
	}()
	<-done
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCloseStopsWaiters(t *testing.T) {
	c, fb, _ := setup(t)
	ctx := context.Background()
	if _, err := fb.Acquire(ctx, driver.Request{Key: "k", Owner: "other", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Lock(ctx, "k")
		errc <- err
	}()
	for fb.Store().Waiters("k") == 0 {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	if err := <-errc; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("waiting Lock after Close = %v, want ErrClosed", err)
	}
}

// lossy hands out grants with a Lost channel, as session-based backends do.
type lossy struct {
	*memlock.Backend
	lost chan struct{}
}

func (b *lossy) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	g.Lost = b.lost
	return g, err
}

func TestBackendReportsLoss(t *testing.T) {
	b := &lossy{Backend: memlock.NewStore(clock.Real).Backend(), lost: make(chan struct{})}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	released, err := c.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil { // its watcher must stop too
		t.Fatal(err)
	}
	close(b.lost)
	waitLost(t, l, "Done not closed when the backend reported the grant lost")
}

// handing reports every grant as handed over Age before the call, as a backend does
// for a grant a release made to a queued waiter (driver.Grant.Age).
type handing struct {
	*memlock.Backend
	age      time.Duration
	handed   atomic.Int64 // grants reported as handed
	attempts atomic.Int64
}

func (b *handing) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.attempts.Add(1)
	g, err := b.Backend.Acquire(ctx, req)
	if err == nil && b.handed.Add(1) == 1 {
		g.Age = b.age // only the first: the next attempt asks the server
	}
	return g, err
}

// A handed grant's validity starts when the server may have started its TTL, Age
// before the attempt, and its first renewal is due one renew interval after that.
func TestHandedGrantValidityStartsEarlier(t *testing.T) {
	clk := clock.NewFake(t0)
	fb := &handing{Backend: memlock.NewStore(clk).Backend(), age: 2 * time.Second}
	c, err := dlock.New(fb, dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	validity := 9*time.Second - (90*time.Millisecond + 2*time.Millisecond)
	if got, want := l.Expiry(), t0.Add(-2*time.Second+validity); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want the attempt time - Age + validity = %v", got, want)
	}
	if n := fb.attempts.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1 (a young handed grant is used as it is)", n)
	}
	// The first renewal is due at t0 - 2s + 3s.
	clk.BlockUntil(1)
	clk.Advance(999 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if n := serverTTLOf(t, fb.Backend, "k"); n != 9*time.Second-999*time.Millisecond {
		t.Fatalf("renewed before it was due (server TTL %v)", n)
	}
	clk.Advance(time.Millisecond)
	for serverTTLOf(t, fb.Backend, "k") != 9*time.Second {
		time.Sleep(time.Millisecond)
	}
	if got, want := l.Expiry(), t0.Add(time.Second+validity); !got.Equal(want) {
		t.Fatalf("Expiry after the first renewal = %v, want %v", got, want)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant handed over longer ago than the renew interval is not trusted as it is:
// the core asks the server again at once, which re-enters the owner's grant, and
// the validity counts from that attempt.
func TestOldHandedGrantIsAskedAgain(t *testing.T) {
	clk := clock.NewFake(t0)
	fb := &handing{Backend: memlock.NewStore(clk).Backend(), age: 3 * time.Second}
	c, err := dlock.New(fb, dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := fb.attempts.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	validity := 9*time.Second - (90*time.Millisecond + 2*time.Millisecond)
	if got, want := l.Expiry(), t0.Add(validity); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want %v", got, want)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func serverTTLOf(t *testing.T, b *memlock.Backend, key string) time.Duration {
	t.Helper()
	info, err := b.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return info.TTL
}

// advising is the reference backend with a WatchAdvisor that says what first says,
// counting the calls the core makes.
type advising struct {
	*memlock.Backend
	first            bool
	watches, acquire atomic.Int64
	waits            atomic.Int64 // attempts with Wait set
}

func (b *advising) WatchFirst(string) bool { return b.first }

func (b *advising) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	b.watches.Add(1)
	return b.Backend.Watch(ctx, key, owner)
}

func (b *advising) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.acquire.Add(1)
	if req.Wait {
		b.waits.Add(1)
	}
	return b.Backend.Acquire(ctx, req)
}

// With a WatchAdvisor that expects the key free, a waiting Lock tries once without
// registering; only if the key is held does it register and queue, at once.
func TestWatchAdvisor(t *testing.T) {
	st := memlock.NewStore(clock.Real)
	ab := &advising{Backend: st.Backend()}
	c, err := dlock.New(ab)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if w, a, q := ab.watches.Load(), ab.acquire.Load(), ab.waits.Load(); w != 0 || a != 1 || q != 0 {
		t.Fatalf("uncontended Lock: %d watches, %d attempts (%d waiting), want 0, 1, 0", w, a, q)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := c.Lock(ctx, "k")
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	for st.Waiters("k") == 0 {
		time.Sleep(time.Millisecond)
	}
	if w, a, q := ab.watches.Load(), ab.acquire.Load(), ab.waits.Load(); w != 1 || a != 3 || q != 1 {
		t.Fatalf("contended Lock: %d watches, %d attempts (%d waiting), want 1, 3, 1", w, a, q)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// Advised that the key is contended, the wait registers first.
	ab.first = true
	ab.watches.Store(0)
	ab.acquire.Store(0)
	ab.waits.Store(0)
	l, err = c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if w, a, q := ab.watches.Load(), ab.acquire.Load(), ab.waits.Load(); w != 1 || a != 1 || q != 1 {
		t.Fatalf("Lock advised to watch first: %d watches, %d attempts (%d waiting), want 1, 1, 1", w, a, q)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The grants of one client renew on one timer, each on its own schedule, and a
// released grant leaves the schedule.
func TestRenewalsShareOneTimer(t *testing.T) {
	c, fb, clk := setup(t)
	ctx := context.Background()
	var leases []*dlock.Lease
	for i, ttl := range []time.Duration{3 * time.Second, 6 * time.Second, 9 * time.Second} {
		l, err := c.Lock(ctx, "k"+strconv.Itoa(i), dlock.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if n := clk.Pending(); n != 1 {
		t.Fatalf("%d clock timers for 3 grants, want 1", n)
	}
	if err := leases[1].Release(ctx); err != nil { // k1 leaves before its first renewal
		t.Fatal(err)
	}
	// k0 renews every second, k2 every 3 seconds.
	for _, want := range []int64{1, 2, 4, 5} {
		clk.BlockUntil(1)
		clk.Advance(time.Second)
		waitRefreshes(t, fb, want)
	}
	time.Sleep(20 * time.Millisecond)
	if n := fb.refreshes.Load(); n != 5 {
		t.Fatalf("%d refreshes, want 5", n)
	}
	for _, l := range []*dlock.Lease{leases[0], leases[2]} {
		if l.Err() != nil {
			t.Fatalf("lease %s lost: %v", l.Key(), l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d clock timers with no grant left, want 0", n)
	}
}

// bounding is the reference backend as a driver.Bounder whose grants live on a
// session that the test keeps alive by moving its end.
type bounding struct {
	*memlock.Backend
	clk       *clock.Fake
	until     atomic.Int64 // session end, ns on the fake clock
	refreshes atomic.Int64
}

func (b *bounding) Bound(key, owner string) (time.Duration, bool) {
	return time.Duration(b.until.Load() - b.clk.Now().UnixNano()), true
}

func (b *bounding) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	defer b.refreshes.Add(1)
	return b.Backend.Refresh(ctx, key, owner, ttl)
}

// A grant on a session the backend keeps alive is valid only while the session is:
// the core's deadline is cut to the backend's bound, after the acquire and after
// each renewal, and the lease is lost at that deadline if the session was not kept
// alive meanwhile, however young the grant.
func TestBoundCutsValidity(t *testing.T) {
	clk := clock.NewFake(t0)
	fb := &bounding{Backend: memlock.NewStore(clk).Backend(), clk: clk}
	fb.until.Store(t0.Add(4 * time.Second).UnixNano())
	c, err := dlock.New(fb, dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Expiry(), t0.Add(4*time.Second); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want the session's end %v", got, want)
	}

	// The session is kept alive before the first renewal (due at 3s): the renewal
	// moves the deadline to the new end of the session, not to 3s + the validity.
	fb.until.Store(t0.Add(10 * time.Second).UnixNano())
	clk.BlockUntil(1)
	clk.Advance(3 * time.Second)
	for fb.refreshes.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	for !l.Expiry().Equal(t0.Add(10 * time.Second)) {
		time.Sleep(time.Millisecond)
	}

	// Now it is not: renewals come closer together as the end nears, and the lease
	// is lost there, before the server drops the session.
	clk.BlockUntil(1)
	clk.Advance(6*time.Second + 900*time.Millisecond) // 9.9s
	select {
	case <-l.Done():
		t.Fatalf("lost at 9.9s, before the session's end: %v", l.Err())
	case <-time.After(20 * time.Millisecond):
	}
	if !l.Expiry().Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("Expiry = %v, want %v", l.Expiry(), t0.Add(10*time.Second))
	}
	// The renewal at 9.9s found the end still at 10s and set the next for 9.975s.
	clk.BlockUntil(1)
	clk.Advance(101 * time.Millisecond) // 10.001s
	waitLost(t, l, "not lost after the session's end")
}

// lateFirst is the reference backend whose first grant's reply comes after the
// validity has passed (the fake clock jumps during the call), counting releases.
type lateFirst struct {
	*memlock.Backend
	clk      *clock.Fake
	attempts atomic.Int64
	releases atomic.Int64
}

func (b *lateFirst) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	if b.attempts.Add(1) == 1 {
		b.clk.Advance(10 * time.Second)
	}
	return g, err
}

func (b *lateFirst) Release(ctx context.Context, key, owner string) error {
	b.releases.Add(1)
	return b.Backend.Release(ctx, key, owner)
}

// A grant whose reply came too late to be trusted is re-entered at once by the same
// owner, not released: a release of that owner still on its way could delete the
// grant the next attempt makes.
func TestLateGrantIsReenteredNotReleased(t *testing.T) {
	clk := clock.NewFake(t0)
	fb := &lateFirst{Backend: memlock.NewStore(clk).Backend(), clk: clk}
	c, err := dlock.New(fb, dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := fb.attempts.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2 (the late grant, then its re-entry)", n)
	}
	if got, want := l.Expiry(), t0.Add(10*time.Second+9*time.Second-92*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Expiry = %v, want the re-entry's time + validity %v", got, want)
	}
	time.Sleep(20 * time.Millisecond) // room for a stray release to run
	if n := fb.releases.Load(); n != 0 {
		t.Fatalf("%d releases before the lease was released", n)
	}
	info, err := fb.Inspect(ctx, "k")
	if err != nil || info.Owner != l.Owner() {
		t.Fatalf("server holder %+v, %v; want the lease's owner", info, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiting Lock reports its place in the server's queue when the backend tells.
func TestQueueReport(t *testing.T) {
	c, fb, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := fb.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var done sync.WaitGroup
	defer func() { cancel(); done.Wait() }()
	for want := range 2 {
		places := make(chan int, 16)
		done.Add(1)
		go func() {
			defer done.Done()
			_, err := c.Lock(ctx, "k", dlock.WithQueueReport(func(ahead int) { places <- ahead }))
			if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.Canceled) {
				t.Errorf("Lock after cancel: %v", err)
			}
		}()
		select {
		case got := <-places:
			if got != want {
				t.Fatalf("waiter %d reported %d ahead, want %d", want+1, got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d reported no place", want+1)
		}
	}
	if _, err := c.Lock(ctx, "k", dlock.WithQueueReport(nil)); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil report function: %v, want ErrInvalid", err)
	}
}
