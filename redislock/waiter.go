package redislock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// WatchFirst implements driver.WatchAdvisor: a wait registers before its first
// attempt only on a key this client found held in the last two seconds.
func (b *Backend) WatchFirst(key string) bool { return b.hot.Within(key) }

// Watch implements driver.Notifier. The first call subscribes this client to its
// wake-up channel; every later wait shares that one subscription. Registering a wait
// costs one atomic operation when it is the client's only one (the usual case, an
// uncontended Lock); others go to a map.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if !b.subscribed.Load() {
		if err := b.subscribe(ctx); err != nil {
			return nil, err
		}
	}
	w := &waiter{b: b, key: key, owner: owner}
	if b.recent.CompareAndSwap(nil, w) {
		return w, nil
	}
	b.mu.Lock()
	if old := b.recent.Swap(w); old != nil {
		b.waiters[driver.Holder{Key: old.key, Owner: old.owner}] = old
	}
	b.mu.Unlock()
	return w, nil
}

// waiter returns the registered waiter of (key, owner), or nil.
func (b *Backend) waiter(key, owner string) *waiter {
	if r := b.recent.Load(); r != nil && r.key == key && r.owner == owner {
		return r
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.recent.Load(); r != nil && r.key == key && r.owner == owner {
		return r // moved in meanwhile
	}
	return b.waiters[driver.Holder{Key: key, Owner: owner}]
}

// subscribe subscribes this client to its wake-up channel and starts reading it.
func (b *Backend) subscribe(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if b.ps != nil {
		return nil
	}
	ps := b.rdb.Subscribe(ctx, b.wakeCh)
	if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
		ps.Close()
		return fmt.Errorf("redislock: subscribe: %w", err)
	}
	b.ps = ps
	b.subscribed.Store(true)
	// Read messages on our own goroutine rather than through ps.Channel, which
	// adds a goroutine hop to every wake-up.
	b.listen.Go(func() {
		for {
			m, err := ps.Receive(context.Background())
			if err != nil {
				b.pubsubLost()
				if errors.Is(err, redis.ErrClosed) || b.closed.Load() {
					return
				}
				// go-redis reconnects on the next call; wake-ups lost meanwhile
				// are covered by the waiters' fallback timer, holder changes by
				// the notification sent when a holder channel is subscribed again.
				time.Sleep(50 * time.Millisecond)
				continue
			}
			switch m := m.(type) {
			case *redis.Message:
				if m.Channel != b.wakeCh {
					b.holderChanged(m.Channel)
				} else if b.dispatch(m.Payload) {
					// Let the waiter take its grant before this goroutine goes
					// back to reading (with one P, it would run first).
					runtime.Gosched()
				}
			case *redis.Subscription:
				if m.Kind == "subscribe" && m.Channel != b.wakeCh {
					b.subscribedTo(m.Channel)
				}
			case *redis.Pong:
				b.ponged(m.Payload)
			}
		}
	})
	return nil
}

// dispatch delivers a handoff message, "OWNER TOKEN SEQ TTL KEY", to its waiter, and
// reports whether it found the waiter.
func (b *Backend) dispatch(payload string) bool {
	owner, rest, _ := strings.Cut(payload, " ")
	tok, rest, _ := strings.Cut(rest, " ")
	seq, rest, _ := strings.Cut(rest, " ")
	ttl, key, ok := strings.Cut(rest, " ")
	if !ok {
		return false
	}
	h := handoff{}
	var err1, err2, err3 error
	h.token, err1 = strconv.ParseUint(tok, 10, 64)
	h.seq, err2 = strconv.ParseUint(seq, 10, 64)
	h.ttl, err3 = strconv.ParseInt(ttl, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	if key, ok = b.unpart(key); !ok {
		return false
	}
	w := b.waiter(key, owner)
	if w == nil {
		return false
	}
	w.deliver(h)
	return true
}

// waiter is one wait of (key, owner) on this client. It numbers its waiting
// attempts and notes when each was sent, so that a grant handed over at release,
// which names the attempt the server last saw, gets a safe Age.
type waiter struct {
	b          *Backend
	key, owner string

	mu     sync.Mutex
	c      chan struct{}           // made when first needed
	first  uint64                  // the number of this wait's first attempt; 0 before it
	seqs   [4]uint64               // the latest attempts' numbers, modulo 4,
	sent   [4]int64                // and when each was sent (see mono)
	tried  atomic.Bool             // a waiting attempt was sent: the server may hold a place or a grant for us
	queued atomic.Bool             // a waiting attempt's reply said it queued
	handed atomic.Pointer[handoff] // a grant handed to us, not yet returned by Acquire
}

// handoff is a grant a release made to a waiter.
type handoff struct {
	token, seq uint64
	ttl        int64 // ms
	sent       int64 // when attempt seq was sent (see mono): the grant's TTL started later
}

// epoch is the origin of mono.
var epoch = time.Now()

// mono reads the monotonic clock, in nanoseconds since epoch.
func mono() int64 { return int64(time.Since(epoch)) }

// chanLocked returns the wake-up channel, making it if needed.
func (w *waiter) chanLocked() chan struct{} {
	if w.c == nil {
		w.c = make(chan struct{}, 1)
	}
	return w.c
}

// take returns the grant handed to the waiter, if there is one for ttl.
func (w *waiter) take(ttl int64) (driver.Grant, bool) {
	h := w.handed.Swap(nil)
	if h == nil || h.ttl != ttl {
		return driver.Grant{}, false
	}
	return driver.Grant{Token: h.token, Age: time.Duration(max(mono()-h.sent, 1))}, true
}

// attempt numbers a new waiting attempt and notes when it is sent (now); it returns
// the queue flag and the number to send with it.
func (w *waiter) attempt() (flag byte, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seq = w.b.seq.Add(1)
	if w.first == 0 {
		w.first = seq
	}
	i := seq % uint64(len(w.seqs))
	w.seqs[i], w.sent[i] = seq, mono()
	w.tried.Store(true)
	flag = '-'
	if w.queued.Load() {
		flag = 'q'
	}
	return flag, seq
}

// deliver takes a handoff message and wakes the waiter.
func (w *waiter) deliver(h handoff) {
	w.mu.Lock()
	if w.first == 0 || h.seq < w.first {
		// For an earlier wait of the same key and owner, whose Stop passes
		// the grant on.
		w.mu.Unlock()
		return
	}
	if i := h.seq % uint64(len(w.seqs)); w.seqs[i] == h.seq {
		h.sent = w.sent[i]
		w.handed.Store(&h)
	}
	// Otherwise the attempt is too old to be remembered: the wake-up alone makes
	// the next attempt ask the server, which finds the key is ours.
	c := w.chanLocked()
	w.mu.Unlock()
	select {
	case c <- struct{}{}:
	default:
	}
}

// C implements driver.Waiter.
func (w *waiter) C() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.chanLocked()
}

// Stop implements driver.Waiter. A wait that did not acquire withdraws its place
// and passes on a grant handed to it, whether Acquire returned it or not, and one
// still on its way: the withdrawal runs after any handoff the server made to it.
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	if !b.recent.CompareAndSwap(w, nil) {
		b.mu.Lock()
		if h := (driver.Holder{Key: w.key, Owner: w.owner}); b.waiters[h] == w {
			delete(b.waiters, h)
		}
		b.mu.Unlock()
	}
	if acquired || !w.tried.Load() {
		return nil
	}
	if err := withdrawScript.Run(ctx, b.rdb, []string{b.LockKey(w.key)}, w.owner, b.prefix, b.wakeCh).Err(); err != nil {
		return wrap("withdraw waiter", w.key, err)
	}
	return nil
}
