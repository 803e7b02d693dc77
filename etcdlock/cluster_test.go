package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// checker sees every grant as it is made and every holder as it leaves, and records
// violations: a grant while another holder's lease context is still live (two holders
// at once), or a token not above the previous grant's.
type checker struct {
	mu         sync.Mutex
	holders    map[*dlock.Lease]bool
	last       dlock.Token
	grants     int
	violations []string
	lastAt     time.Time
	maxGap     time.Duration
}

func (c *checker) enter(l *dlock.Lease) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for h := range c.holders {
		if h.Context().Err() == nil {
			c.violations = append(c.violations, fmt.Sprintf("token %d granted while token %d was still held", l.Token(), h.Token()))
		}
	}
	if l.Token() <= c.last {
		c.violations = append(c.violations, fmt.Sprintf("token %d after %d", l.Token(), c.last))
	}
	c.last = l.Token()
	if !c.lastAt.IsZero() {
		c.maxGap = max(c.maxGap, time.Since(c.lastAt))
	}
	c.lastAt = time.Now()
	c.holders[l] = true
	c.grants++
	return c.grants
}

func (c *checker) exit(l *dlock.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.holders, l)
}

// The leader of a 3-member cluster crashes while the lock is held and contended, and
// later comes back: no two holders overlap, tokens keep rising, and the lock keeps
// being handed over.
func TestClusterLeaderCrash(t *testing.T) {
	cl := testserver.StartEtcdCluster(t, 3, 50, 500)
	const workers, before, during, after = 4, 15, 15, 10
	chk := &checker{holders: map[*dlock.Lease]bool{}}
	var crashed *testserver.EtcdMember
	var crashedAt, restartedAt atomic.Int64
	var waiting atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	done := make(chan struct{})
	var closeDone sync.Once
	var transient atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		c, err := dlock.Open(ctx, cl.URL("dlock"), dlock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				waiting.Add(1)
				lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
				l, err := c.Lock(lctx, "k")
				lcancel()
				waiting.Add(-1)
				if err != nil {
					if ctx.Err() != nil {
						t.Errorf("worker %d: %v", w, err)
						return
					}
					transient.Add(1)
					t.Logf("worker %d: Lock: %v (retrying)", w, err)
					continue
				}
				n := chk.enter(l)
				switch {
				case n == before:
					// Crash the leader while holding the lock, with others queued.
					for waiting.Load() == 0 {
						time.Sleep(time.Millisecond)
					}
					crashed = cl.Leader(10 * time.Second)
					if crashed == nil {
						t.Error("no leader")
						closeDone.Do(func() { close(done) })
					} else {
						t.Logf("grant %d (token %d): killing leader %s", n, l.Token(), crashed.Name())
						start := time.Now()
						crashed.Kill()
						t.Logf("killed in %v", time.Since(start))
						crashedAt.Store(int64(n))
					}
				case n == before+during && crashed != nil:
					t.Logf("grant %d (token %d): restarting %s", n, l.Token(), crashed.Name())
					if err := crashed.Restart(); err != nil {
						t.Error(err)
					}
					restartedAt.Store(int64(n))
				case n >= before+during+after:
					closeDone.Do(func() { close(done) })
				}
				select {
				case <-l.Done():
				case <-time.After(2 * time.Millisecond):
				}
				chk.exit(l)
				if err := l.Release(ctx); err != nil && !errors.Is(err, dlock.ErrLeaseLost) {
					t.Logf("worker %d: Release: %v", w, err)
				}
			}
		})
	}
	wg.Wait()
	chk.mu.Lock()
	defer chk.mu.Unlock()
	for _, v := range chk.violations {
		t.Error(v)
	}
	if crashedAt.Load() == 0 || restartedAt.Load() == 0 {
		t.Fatalf("the leader was not crashed and restarted (grants: %d)", chk.grants)
	}
	t.Logf("%d grants, last token %d, longest gap between grants %v, %d transient Lock errors", chk.grants, chk.last, chk.maxGap, transient.Load())
}

// A holder watch on a member that loses the leader (etcd cancels the watch) is
// started again once the cluster has a leader again, notifies once then (changes
// may have been made meanwhile through other members), and sees later changes.
func TestHolderWatchLeaderLoss(t *testing.T) {
	cl := testserver.StartEtcdCluster(t, 3, 50, 500)
	leader := cl.Leader(10 * time.Second)
	if leader == nil {
		t.Fatal("no leader")
	}
	var follower *testserver.EtcdMember
	var others []*testserver.EtcdMember
	for _, m := range cl.Members {
		if m != leader && follower == nil {
			follower = m
		} else {
			others = append(others, m)
		}
	}
	b := open(t, "etcd://"+follower.Endpoint()+"/dlock")
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	w, err := b.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// A watch of the test's own on the follower tells when it cancels the watches
	// that require a leader.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	probe := rawClient(t, follower.Endpoint()).Watch(clientv3.WithRequireLeader(pctx), "probe", clientv3.WithCreatedNotify())
	<-probe

	var wg sync.WaitGroup
	for _, m := range others {
		wg.Go(m.Stop)
	}
	wg.Wait()
	select {
	case <-probe: // cancelled, with ErrNoLeader
	case <-time.After(drivertest.Wait):
		t.Fatal("the follower kept a watch that requires a leader")
	}
	select {
	case <-w.C():
	default:
	}
	errs := make([]error, len(others))
	for i, m := range others {
		wg.Go(func() { errs[i] = m.Restart() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("no notification once the watch was back")
	}
	other := open(t, cl.URL("dlock"))
	defer other.Close()
	if _, err := other.Acquire(ctx, driver.Request{Key: key, Owner: "o", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("no notification of a grant after the watch came back")
	}
}
