package redlock

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlockio/dlock/driver"
)

// Watching holders (driver.HolderWatcher).
//
// Every script that changes a lock on a node publishes an empty message on the
// lock's holder channel there. A watch subscribes to that channel on every node,
// on the client's subscriber connections (the ones wake-ups use: one per node,
// whatever the number of watches; the watches of one key share one subscription),
// and is notified when any node publishes.
//
// WatchHolder returns once a majority of nodes confirmed the subscription. After
// that, every confirmation of the channel by a node notifies the key's watches: a
// node that confirms late (it was slow, down, or its connection broke and go-redis
// subscribed again) may have changed the lock while it was not heard, and the read
// that the notification causes sees that change. So no change made after
// WatchHolder returns is missed: a node that makes it either publishes it to us or
// confirms the subscription later. (A confirmation can also be the late answer to a
// SUBSCRIBE followed by an UNSUBSCRIBE of an earlier watch; the watch then counts a
// node too early, and the next confirmation, of its own SUBSCRIBE, notifies it.)

// holderSub is the subscription to one holder channel on every node, shared by the
// watches of the key on this client; guarded by Backend.mu.
type holderSub struct {
	watches   map[*holderWatch]struct{}
	confirmed map[*node]bool
	ready     chan struct{} // closed once a majority of nodes confirmed
	isReady   bool
}

// holderWatch is one watch; it implements driver.HolderWatch.
type holderWatch struct {
	b       *Backend
	key, ch string
	c       chan struct{}
	stopped bool // guarded by Backend.subMu
}

// WatchHolder implements driver.HolderWatcher. It subscribes to the key's holder
// channel on every node (starting the subscriber connections if no wait has) and
// returns once a majority confirmed, or an error when ctx ends or the dial timeout
// passes first. Subscribing, and the last Stop of a key's watches unsubscribing,
// may wait for a node's subscriber connection to be dialled, up to the dial
// timeout.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	w := &holderWatch{b: b, key: key, ch: holderChannel(b.cfg.prefix, key), c: make(chan struct{}, 1)}
	b.subMu.Lock()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.subMu.Unlock()
		return nil, driver.ErrClosed
	}
	b.startListening()
	s := b.holders[w.ch]
	fresh := s == nil
	if fresh {
		s = &holderSub{watches: make(map[*holderWatch]struct{}), confirmed: make(map[*node]bool), ready: make(chan struct{})}
		b.holders[w.ch] = s
	}
	s.watches[w] = struct{}{}
	b.mu.Unlock()
	if fresh {
		b.eachNode(func(ctx context.Context, n *node) {
			if err := n.ps.Subscribe(ctx, w.ch); err != nil {
				// go-redis remembers the channel for its next connection, but a
				// failed write has just made one without it: once more.
				_ = n.ps.Subscribe(ctx, w.ch)
			}
		})
	}
	b.subMu.Unlock()
	wait, cancel := context.WithTimeout(ctx, b.cfg.dialTimeout)
	defer cancel()
	select {
	case <-s.ready:
		return w, nil
	case <-wait.Done():
	case <-b.closing:
	}
	w.Stop()
	switch {
	case b.isClosed():
		return nil, driver.ErrClosed
	case ctx.Err() != nil:
		return nil, fmt.Errorf("redlock: watch holder %q: %w", key, ctx.Err())
	}
	b.mu.Lock()
	ok := len(s.confirmed)
	b.mu.Unlock()
	return nil, &QuorumError{Op: "watch holder", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes),
		Note: fmt.Sprintf("the subscription was not confirmed within %v", b.cfg.dialTimeout)}
}

// eachNode runs f on every node at once, each with a context bounded by the dial
// timeout (f may have to connect), and waits for them all.
func (b *Backend) eachNode(f func(context.Context, *node)) {
	var wg sync.WaitGroup
	for _, n := range b.nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), b.cfg.dialTimeout)
			defer cancel()
			f(ctx, n)
		})
	}
	wg.Wait()
}

// holderSubscribed is called when node n confirms a subscription to ch.
func (b *Backend) holderSubscribed(n *node, ch string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.holders[ch]
	if s == nil {
		return
	}
	if s.isReady {
		s.notify()
		return
	}
	s.confirmed[n] = true
	if len(s.confirmed) >= b.quorum {
		s.isReady = true
		close(s.ready)
	}
}

// holderChanged notifies the watches of the holder channel ch.
func (b *Backend) holderChanged(ch string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.holders[ch]; s != nil {
		s.notify()
	}
}

// notify notifies every watch; called with Backend.mu held.
func (s *holderSub) notify() {
	for w := range s.watches {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
}

// C implements driver.HolderWatch.
func (w *holderWatch) C() <-chan struct{} { return w.c }

// Stop implements driver.HolderWatch: the last watch of a key on this client
// unsubscribes from its channel on every node.
func (w *holderWatch) Stop() {
	b := w.b
	b.subMu.Lock()
	defer b.subMu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	b.mu.Lock()
	s := b.holders[w.ch]
	delete(s.watches, w)
	last := len(s.watches) == 0
	if last {
		delete(b.holders, w.ch)
	}
	closed := b.closed
	b.mu.Unlock()
	if last && !closed {
		b.eachNode(func(ctx context.Context, n *node) { _ = n.ps.Unsubscribe(ctx, w.ch) })
	}
}
