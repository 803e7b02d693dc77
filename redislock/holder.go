package redislock

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// Watching holders (driver.HolderWatcher).
//
// The scripts publish an empty message on a key's holder channel at every change of
// its holder or value they make. A watch subscribes to that channel on the client's
// one pub/sub connection, the one its wake-ups use, so watches cost no connection of
// their own: the first watch of a key subscribes, the last one to stop unsubscribes,
// and the listener passes each message to every watch of the key.
//
// WatchHolder returns once the server has the subscription: after SUBSCRIBE it
// sends PING with a payload of its own on the same connection and waits for that
// pong, which the server sends only after it ran the SUBSCRIBE (replies come in
// order); it pings again if the connection broke meanwhile. go-redis reconnects a
// broken connection and subscribes again to every channel before anything else;
// the confirmation of a key's channel then notifies the key's watches once, since
// changes may have been missed while the connection was down.

// pubsubWriteTimeout bounds a write on the shared pub/sub connection. Writes there
// do not take the caller's context: a write cut short by a caller's deadline would
// break the connection for every watch and wait of the client.
const pubsubWriteTimeout = 5 * time.Second

// retryPing is how long WatchHolder waits before it pings again after a failed
// write (the connection is being re-established).
const retryPing = 50 * time.Millisecond

// holderSub is the subscription to one holder channel, shared by the watches of
// the key on this client; guarded by Backend.hmu.
type holderSub struct {
	watches map[*holderWatch]struct{}
	ready   bool          // the server confirmed the subscription
	done    chan struct{} // closed when ready, or when subscribing failed
}

// holderWatch is one watch; it implements driver.HolderWatch.
type holderWatch struct {
	b    *Backend
	ch   string
	c    chan struct{}
	stop sync.Once
}

// holderChannel returns the channel the scripts publish key's changes on.
func (b *Backend) holderChannel(key string) string { return b.LockKey(key) + holderSuffix }

// WatchHolder implements driver.HolderWatcher. It subscribes to the key's holder
// channel on the client's pub/sub connection (opening it if no wait has yet) and
// returns when the server has the subscription; another watch of the same key on
// this client shares it.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if !b.subscribed.Load() {
		if err := b.subscribe(ctx); err != nil {
			return nil, err
		}
	}
	w := &holderWatch{b: b, ch: b.holderChannel(key), c: make(chan struct{}, 1)}
	for {
		b.hmu.Lock()
		s := b.holders[w.ch]
		if s == nil {
			s = &holderSub{watches: map[*holderWatch]struct{}{w: {}}, done: make(chan struct{})}
			b.holders[w.ch] = s
			err := b.pubsubWrite(func(ctx context.Context) error { return b.ps.Subscribe(ctx, w.ch) })
			b.hmu.Unlock()
			if err == nil {
				err = b.confirm(ctx)
			}
			b.hmu.Lock()
			if err == nil {
				s.ready = true
			} else {
				delete(b.holders, w.ch)
				// go-redis keeps the channel to subscribe again after a reconnect
				// even when SUBSCRIBE failed: take it off.
				_ = b.pubsubWrite(func(ctx context.Context) error { return b.ps.Unsubscribe(ctx, w.ch) })
			}
			close(s.done)
			b.hmu.Unlock()
			if err != nil {
				if b.closed.Load() {
					err = driver.ErrClosed
				}
				return nil, wrap("watch holder", key, err)
			}
			return w, nil
		}
		if s.ready {
			s.watches[w] = struct{}{}
			b.hmu.Unlock()
			return w, nil
		}
		// Another watch of the key is subscribing: wait for it, then look again.
		done := s.done
		b.hmu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, wrap("watch holder", key, ctx.Err())
		}
	}
}

// pubsubWrite runs f, a write on the pub/sub connection, with a context of its own.
func (b *Backend) pubsubWrite(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), pubsubWriteTimeout)
	defer cancel()
	return f(ctx)
}

// confirm returns once the server has run the commands this client sent on the
// pub/sub connection before the call: it sends PING with a payload of its own and
// waits for its pong, and pings again when the connection broke meanwhile (go-redis
// subscribes again on a new connection before the PING).
func (b *Backend) confirm(ctx context.Context) error {
	for {
		if b.closed.Load() {
			return driver.ErrClosed
		}
		b.hmu.Lock()
		b.pingSeq++
		id := "holder " + strconv.FormatUint(b.pingSeq, 10)
		pong := make(chan struct{})
		b.pings[id] = pong
		lost := b.lost
		b.hmu.Unlock()
		err := b.pubsubWrite(func(ctx context.Context) error { return b.ps.Ping(ctx, id) })
		switch {
		case errors.Is(err, redis.ErrClosed):
			err = driver.ErrClosed
		case err != nil:
			// The connection is being re-established: ping again shortly.
			err = sleep(ctx, retryPing)
		default:
			select {
			case <-pong:
				return nil
			case <-lost:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		b.hmu.Lock()
		delete(b.pings, id)
		b.hmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// sleep waits for d or until ctx ends, and returns ctx's error if it ended.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pubsubLost is called by the listener when reading the pub/sub connection failed:
// pings sent on it may never be answered.
func (b *Backend) pubsubLost() {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	close(b.lost)
	b.lost = make(chan struct{})
}

// ponged takes the pong of a PING sent by confirm.
func (b *Backend) ponged(payload string) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if c := b.pings[payload]; c != nil {
		close(c)
		delete(b.pings, payload)
	}
}

// holderChanged notifies the watches of the holder channel ch.
func (b *Backend) holderChanged(ch string) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if s := b.holders[ch]; s != nil {
		for w := range s.watches {
			w.notify()
		}
	}
}

// subscribedTo is called when the server confirms a subscription to ch. For a
// holder channel already confirmed, that is go-redis subscribing again after a
// reconnect: changes may have been missed, so its watches are notified.
func (b *Backend) subscribedTo(ch string) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if s := b.holders[ch]; s != nil && s.ready {
		for w := range s.watches {
			w.notify()
		}
	}
}

func (w *holderWatch) notify() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// C implements driver.HolderWatch.
func (w *holderWatch) C() <-chan struct{} { return w.c }

// Stop implements driver.HolderWatch: the last watch of a key on this client
// unsubscribes from its channel.
func (w *holderWatch) Stop() {
	w.stop.Do(func() {
		b := w.b
		b.hmu.Lock()
		defer b.hmu.Unlock()
		s := b.holders[w.ch]
		if s == nil {
			return
		}
		delete(s.watches, w)
		if len(s.watches) == 0 && s.ready {
			delete(b.holders, w.ch)
			if !b.closed.Load() {
				_ = b.pubsubWrite(func(ctx context.Context) error { return b.ps.Unsubscribe(ctx, w.ch) })
			}
		}
	})
}
