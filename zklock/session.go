package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// markHeard records that a request sent at sent reached the leader.
func (b *Backend) markHeard(sent time.Time, session int64) {
	b.mu.Lock()
	if session == b.session && sent.After(b.heard) {
		b.heard = sent
	}
	b.mu.Unlock()
}

func (b *Backend) currentSession() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session
}

// sessionValidity is how long after a request reached the leader the session is
// certainly alive: half the session timeout, less 1% for clock-rate drift and 2ms.
func sessionValidity(timeout time.Duration) time.Duration {
	return timeout/2 - timeout/100 - 2*time.Millisecond
}

// onConnectResponse is called by the connection wrapper with the server's answer to
// a (re)connection, just before the library announces the session.
func (b *Backend) onConnectResponse(sid int64, timeout time.Duration) {
	b.mu.Lock()
	b.wireSession, b.wireTimeout = sid, timeout
	b.mu.Unlock()
}

func (b *Backend) onDialError(err error) {
	b.mu.Lock()
	b.dialErr = err
	b.mu.Unlock()
}

// onEvent receives every session and watch event from the library's goroutines. It
// must not block.
func (b *Backend) onEvent(ev zk.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev.Type {
	case zk.EventSession:
		switch ev.State {
		case zk.StateConnected:
			b.dialedAt = time.Now()
			b.dialErr = nil
		case zk.StateHasSession:
			sid := b.wireSession
			if b.session != 0 && sid != b.session {
				b.sessionGoneLocked(errors.New("replaced by a new session"))
			}
			if b.readyClosed {
				b.signalHoldersLocked() // a reconnection: watch events may have been missed
			}
			if sid != b.session {
				b.heard = b.dialedAt
			} else if b.dialedAt.After(b.heard) {
				b.heard = b.dialedAt // revalidated by the ensemble on reconnection
			}
			b.session = sid
			if b.wireTimeout > 0 {
				b.timeout = b.wireTimeout
			}
			if !b.readyClosed {
				b.readyClosed = true
				close(b.ready)
			}
		case zk.StateExpired:
			b.log.Warn("zklock: ZooKeeper session expired; its locks are lost", "server", ev.Server)
			b.sessionGoneLocked(zk.ErrSessionExpired)
			b.session = 0
			b.signalHoldersLocked()
		case zk.StateAuthFailed:
			b.dialErr = zk.ErrAuthFailed
		}
	case zk.EventNodeDeleted, zk.EventNotWatching:
		if e := b.byPath[ev.Path]; e != nil && ev.Type == zk.EventNodeDeleted {
			b.dropLocked(e, false)
		}
		for w := range b.predOf[ev.Path] {
			if ev.Type == zk.EventNodeDeleted && w.solo != "" {
				w.promoted = w.solo
			}
			b.unwatchLocked(w)
			w.signal()
		}
	case zk.EventNodeDataChanged:
		// A semaphore's queued place took a permit (see queue), or wrote its
		// value: the waiter behind it looks again.
		for w, data := range b.predOf[ev.Path] {
			if data {
				b.unwatchLocked(w)
				w.signal()
			}
		}
	}
}

// sessionGoneLocked drops every entry: the session that owned their children is
// gone, and with it the watches that would have told us about them. A waiter
// whose queued place went with it fails its next attempt (see placeLost).
func (b *Backend) sessionGoneLocked(why error) {
	if len(b.entries) > 0 {
		b.log.Debug("zklock: session gone", "why", why)
	}
	for _, e := range b.entries {
		b.losePlaceLocked(e, why)
		b.dropLocked(e, false)
	}
	for _, w := range b.waiters {
		b.unwatchLocked(w)
		w.signal()
	}
}

// losePlaceLocked marks the waiter of e, if e is a queued place rather than a grant,
// as having lost its place for the reason why. An entry whose create has not
// returned yet is not marked: a create that did not reach the ensemble before the
// session ended is made again on the next session, and an attempt that queued it
// there goes on waiting.
func (b *Backend) losePlaceLocked(e *entry, why error) {
	if e.dead || e.granted || e.path == "" {
		return
	}
	if w := b.waiters[driver.Holder{Key: e.key, Owner: e.owner}]; w != nil && w.lost == nil {
		w.lost = fmt.Errorf("zklock: acquire %q: the queued place was lost with the ZooKeeper session: %w", e.key, why)
		w.signal()
	}
}

// monitor heartbeats while the backend has children and ends every grant when the
// session may have expired (see the package documentation).
func (b *Backend) monitor() {
	defer b.wg.Done()
	var lastBeat time.Time
	for {
		b.mu.Lock()
		beatEvery := b.timeout / 6
		next := beatEvery
		if len(b.entries) > 0 && !b.hbRunning {
			next = max(time.Until(lastBeat.Add(beatEvery)), 0)
		}
		if b.granted > 0 {
			next = min(next, time.Until(b.heard.Add(sessionValidity(b.timeout))))
		}
		if at, ok := b.placesLapseLocked(); ok {
			next = min(next, time.Until(at))
		}
		b.mu.Unlock()
		t := time.NewTimer(max(next, time.Millisecond))
		select {
		case <-b.closing:
			t.Stop()
			return
		case <-t.C:
		}
		now := time.Now()
		b.mu.Lock()
		if b.granted > 0 && !now.Before(b.heard.Add(sessionValidity(b.timeout))) {
			b.log.Warn("zklock: no reply from the ZooKeeper leader for half the session timeout; the session may have expired, ending its leases",
				"session_timeout", b.timeout, "last_heard", b.heard)
			for _, e := range b.entries {
				if e.granted {
					b.dropLocked(e, true)
				}
			}
		}
		if at, ok := b.placesLapseLocked(); ok && !now.Before(at) {
			b.log.Warn("zklock: no reply from the ZooKeeper ensemble for the session timeout; the session has most likely expired, failing its waiters",
				"session_timeout", b.timeout, "last_heard", b.heard)
			why := fmt.Errorf("nothing heard from the ensemble for the session timeout (%v)", b.timeout)
			for _, e := range b.entries {
				if !e.granted && !e.placed.IsZero() && !now.Before(b.placeLapseLocked(e)) {
					b.losePlaceLocked(e, why)
					b.dropLocked(e, true)
				}
			}
		}
		start := len(b.entries) > 0 && !b.hbRunning && !now.Before(lastBeat.Add(beatEvery)) && !b.closed
		if start {
			b.hbRunning = true
			b.wg.Add(1)
		}
		sess := b.session
		b.mu.Unlock()
		if start {
			lastBeat = now
			go b.heartbeat(beatEvery, sess)
		}
	}
}

// placeLapseLocked is when the queued place of e is taken for lost with the session:
// a whole session timeout after the later of the last request known to have
// reached the leader and the attempt that found e queued. By then the ensemble has
// most likely expired the session; if it has not, the child is deleted (dropLocked)
// rather than left as a contender nobody waits for.
func (b *Backend) placeLapseLocked(e *entry) time.Time {
	from := b.heard
	if e.placed.After(from) {
		from = e.placed
	}
	return from.Add(b.timeout)
}

// placesLapseLocked returns the earliest placeLapseLocked of the queued entries;
// ok is false when there is none.
func (b *Backend) placesLapseLocked() (at time.Time, ok bool) {
	for _, e := range b.entries {
		if e.granted || e.placed.IsZero() {
			continue
		}
		if t := b.placeLapseLocked(e); !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	return at, ok
}

// heartbeat sends a sync, which goes through the leader, and records it as heard.
func (b *Backend) heartbeat(limit time.Duration, sess int64) {
	defer b.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	sent := time.Now()
	err := b.call(ctx, func() error { _, err := b.conn.Sync(b.rootPath()); return err })
	if err == nil {
		b.markHeard(sent, sess)
	}
	b.mu.Lock()
	b.hbRunning = false
	b.mu.Unlock()
}

// Close implements driver.Backend: it ends the session, which deletes every child the
// backend still has, and stops its goroutines.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	for _, e := range b.entries {
		b.dropLocked(e, false)
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	b.shutdown()
	return nil
}

// shutdown closes the connection and waits for the library's goroutines, whose last
// act is closing the event channel, and for the backend's, kept ones included.
func (b *Backend) shutdown() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	b.mu.Unlock()
	b.conn.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
drain:
	for {
		select {
		case _, ok := <-b.events:
			if !ok {
				break drain
			}
		case <-t.C:
			b.log.Warn("zklock: the ZooKeeper client did not stop within 10s")
			break drain
		}
	}
	b.wg.Wait()
	b.callers.Close()
}
