package etcdlock

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlockio/dlock/driver"
)

// WatchHolder implements driver.HolderWatcher with one etcd watch on the lock's
// range (Backend.LockPrefix), on the backend's client and its shared watch stream.
// Every event in the range notifies: a grant, a release, a force release, a
// SetValue, a lease that expired or was revoked (etcd deletes its keys), but also a
// waiter that queues or leaves, which changes nothing a reader sees (the watch does
// not know which member holds the lock, so it cannot tell). WatchHolder returns once
// etcd has the watch in place, so no change after it returns is missed. If the watch
// ends (the history it needs was compacted, its member lost the leader), it is
// started again from the current revision, with a pause that grows to a second
// while that fails, and notifies once the new watch is in place. A broken stream is
// resumed by the etcd client itself, from the next revision, and misses nothing.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	wctx, cancel := context.WithCancel(b.ctx)
	hw := &holderWatch{c: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return nil, driver.ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()
	ready := make(chan error, 1)
	go func() {
		defer b.wg.Done()
		defer close(hw.done)
		b.watchHolder(wctx, b.LockPrefix(key), hw, ready)
	}()
	ctx, ocancel := b.opCtx(ctx)
	defer ocancel()
	select {
	case err := <-ready:
		if err == nil {
			return hw, nil
		}
		hw.Stop()
		return nil, wrap("watch holder", key, err)
	case <-ctx.Done():
		hw.Stop()
		return nil, wrap("watch holder", key, ctx.Err())
	}
}

// holderWatch is one watch started by WatchHolder.
type holderWatch struct {
	c      chan struct{}
	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutine returns
}

func (w *holderWatch) C() <-chan struct{} { return w.c }

// Stop ends the watch and waits for its goroutine.
func (w *holderWatch) Stop() {
	w.cancel()
	<-w.done
}

func (w *holderWatch) notify() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

const (
	holderRewatchMin = 50 * time.Millisecond
	holderRewatchMax = time.Second
)

// watchHolder keeps a watch on the range prefix until ctx ends. It sends on ready
// once, when the first watch is in place, or with the error that ended it first
// (when waiting will not help) or the backend's closing.
func (b *Backend) watchHolder(ctx context.Context, prefix string, hw *holderWatch, ready chan<- error) {
	started := false
	pause := holderRewatchMin
	for {
		created := false
		err := b.watchRange(ctx, prefix, func() {
			created = true
			if !started {
				started = true
				ready <- nil
			} else {
				hw.notify() // changes between the watches are not delivered
			}
		}, hw.notify)
		if ctx.Err() != nil {
			if !started {
				ready <- driver.ErrClosed
			}
			return
		}
		if !started && !retryable(err) {
			ready <- authErr(err)
			return
		}
		if created {
			pause = holderRewatchMin
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			if !started {
				ready <- driver.ErrClosed
			}
			return
		}
		pause = min(2*pause, holderRewatchMax)
	}
}

// errWatchClosed is the end of a watch that etcd's client closed without a reason:
// the client was closed, or the watch's context ended.
var errWatchClosed = errors.New("the etcd client closed the watch")

// watchRange runs one etcd watch on the range prefix, from the current revision,
// until it ends: created is called once etcd has it in place, changed for every
// response with events. WithRequireLeader: a member cut off from the leader ends the
// watch (and the next one may reach a member that has one) instead of keeping it
// open with nothing to deliver.
func (b *Backend) watchRange(ctx context.Context, prefix string, created, changed func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := b.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return watchErr(err) // also a cancelled watch, with etcd's reason
		}
		if resp.Created {
			created()
		}
		if len(resp.Events) > 0 {
			changed()
		}
	}
	return errWatchClosed
}

// watchErr returns err, the error that ended a watch, as the etcd error it names
// when the etcd client passes that on as text only (a watch that etcd cancelled
// with a reason: "rpc error: code = PermissionDenied desc = etcdserver: permission
// denied"), so that errors.Is, retryable and authErr know it.
func watchErr(err error) error {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return err
	}
	if _, desc, ok := strings.Cut(err.Error(), "desc = "); ok {
		if conv := rpctypes.Error(status.Error(codes.Unknown, desc)); errors.As(conv, &ee) {
			return ee
		}
	}
	return err
}
