package zklock

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// WatchHolder implements driver.HolderWatcher with ZooKeeper watches on the
// backend's session: one on the children of key's lock node (on its existence
// while it does not exist), which fires when a contender comes or goes and so when
// the holder changes, and one on the data of the holder's node (of each of a
// semaphore's holders), which fires when its value is set (and at every renewal,
// which writes the TTL). ZooKeeper watches
// fire once; the watch sets them again on each event, reading the queue or the
// holder's data as it does, and sends only when the holder or its value differs
// from what it saw: a contender joining the queue or a renewal costs each watch one
// read, and its observer nothing. It sends one after every reconnection and
// session expiry (the client library sets the watches again on a reconnection and
// the server fires those whose nodes changed meanwhile; an expiry ends them, and
// the watch sets new ones on the next session). It sets its watches before
// returning, so no change made after that is missed. Stop ends its goroutine; the
// watches it leaves on the server fire once more into nothing (ZooKeeper has no
// way to cancel them in this client library) or go with the session.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	wctx, cancel := context.WithCancel(context.Background())
	w := &holderWatch{b: b, key: key, parent: b.LockPath(key), c: make(chan struct{}, 1),
		session: make(chan struct{}, 1), cancel: cancel, quit: wctx.Done(), done: make(chan struct{}),
		data: make(chan zk.Event, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return nil, driver.ErrClosed
	}
	b.holders[w] = true
	b.mu.Unlock()
	st := holderState{armed: make(map[string]bool), values: make(map[string][]byte)}
	if _, err := w.rearm(ctx, &st); err != nil {
		w.forget()
		cancel()
		return nil, wrap("watch holder", key, err)
	}
	if !b.async(func() { defer close(w.done); w.run(wctx, st) }) {
		w.forget()
		cancel()
		return nil, driver.ErrClosed
	}
	return w, nil
}

type holderWatch struct {
	b           *Backend
	key, parent string
	c           chan struct{}
	session     chan struct{} // a reconnection or expiry (signalHoldersLocked)
	cancel      context.CancelFunc
	quit        <-chan struct{} // closed by Stop
	done        chan struct{}   // closed when run returns
	data        chan zk.Event   // the holders' data watches' events (forward)
	once        sync.Once
}

// holderState is what a holder watch has set and seen. A nil channel, and a holder
// not armed, is a watch to set again.
type holderState struct {
	children <-chan zk.Event   // the lock node's children, or its existence
	holders  []string          // the holders' node names, oldest first
	armed    map[string]bool   // holders whose data watch is set and has not fired
	values   map[string][]byte // the value in each holder's node when last read
}

func (w *holderWatch) C() <-chan struct{} { return w.c }

// Stop implements driver.HolderWatch.
func (w *holderWatch) Stop() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.forget()
	})
}

func (w *holderWatch) forget() {
	w.b.mu.Lock()
	delete(w.b.holders, w)
	w.b.mu.Unlock()
}

func (w *holderWatch) notify() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// signalHoldersLocked tells every holder watch that the session reconnected or
// expired. Called with b.mu held.
func (b *Backend) signalHoldersLocked() {
	for w := range b.holders {
		select {
		case w.session <- struct{}{}:
		default:
		}
	}
}

// Bounds of the pause before a holder watch tries again to set its watches after
// an error (a disconnection: the client library sends nothing until it reconnects).
const (
	rearmMin = 50 * time.Millisecond
	rearmMax = time.Second
)

// run waits for the watches of st to fire, sets them again and sends when the
// holder or its value changed, until ctx ends (Stop) or the backend closes.
func (w *holderWatch) run(ctx context.Context, st holderState) {
	b := w.b
	var retry <-chan time.Time
	backoff := rearmMin
	broken := false // setting the watches failed: try again, and send once it works
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.closing:
			return
		case <-w.session:
			w.notify()
			if !broken {
				continue
			}
		case ev := <-st.children:
			st.children = nil
			if ev.Type == zk.EventNotWatching {
				clear(st.armed) // the session's watches are all gone
			}
		case ev := <-w.data:
			delete(st.armed, pathBase(ev.Path))
			if ev.Type == zk.EventNotWatching {
				st.children = nil
				clear(st.armed)
			}
		case <-retry:
		}
		retry = nil
		changed, err := w.rearm(ctx, &st)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !broken {
				b.log.Debug("zklock: holder watch: could not set the watches; trying again", "key", w.key, "err", err)
			}
			broken = true
			retry = time.After(backoff)
			backoff = min(2*backoff, rearmMax)
			continue
		}
		if changed || broken {
			w.notify()
		}
		broken, backoff = false, rearmMin
	}
}

// rearm sets the watches of st that are not set: it lists the lock node's children
// with a watch (or watches for its creation) and, for each holder not armed (a new
// one, or one whose data watch fired), reads its data with a watch. changed
// reports another set of holders or another value.
func (w *holderWatch) rearm(ctx context.Context, st *holderState) (changed bool, err error) {
	b := w.b
	if st.children == nil {
		var names []string
		var ch <-chan zk.Event
		for try := 0; ; try++ {
			err := b.call(ctx, func() error {
				var err error
				names, _, ch, err = b.conn.ChildrenW(w.parent)
				return err
			})
			if !errors.Is(err, zk.ErrNoNode) {
				if err != nil {
					return changed, err
				}
				break
			}
			// No lock node: watch for its creation.
			var exists bool
			err = b.call(ctx, func() error {
				var err error
				exists, _, ch, err = b.conn.ExistsW(w.parent)
				return err
			})
			if err != nil {
				return changed, err
			}
			if !exists {
				names = nil
				break
			}
			if try == 2 {
				return changed, errors.New("the lock node kept coming and going")
			}
		}
		st.children = ch
		q := queue(names)
		holders := make([]string, 0, holding(q))
		for _, c := range q[:cap(holders)] {
			holders = append(holders, c.name)
		}
		if !slices.Equal(holders, st.holders) {
			changed = true
			st.holders = holders
			for h := range st.values {
				if !slices.Contains(holders, h) {
					delete(st.values, h)
					delete(st.armed, h)
				}
			}
		}
	}
	for _, h := range st.holders {
		if st.armed[h] {
			continue
		}
		var data []byte
		var ch <-chan zk.Event
		err := b.call(ctx, func() error {
			var err error
			data, _, ch, err = b.conn.GetW(w.parent + "/" + h)
			return err
		})
		switch {
		case errors.Is(err, zk.ErrNoNode):
			// Gone already: the children watch, set before, fires for it.
			delete(st.values, h)
			changed = true
			continue
		case err != nil:
			return changed, err
		}
		if !b.async(func() { w.forward(ch) }) {
			return changed, driver.ErrClosed
		}
		st.armed[h] = true
		if v, ok := st.values[h]; !ok || !bytes.Equal(v, decodeData(data).value) {
			changed = true
			st.values[h] = decodeData(data).value
		}
	}
	return changed, nil
}

// forward passes the event of one data watch on to run.
func (w *holderWatch) forward(ch <-chan zk.Event) {
	select {
	case ev := <-ch:
		select {
		case w.data <- ev:
		case <-w.quit:
		case <-w.b.closing:
		}
	case <-w.quit:
	case <-w.b.closing:
	}
}
