package redlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Late copies of a handoff.
//
// A waiter takes a handed grant once copies from a majority of nodes carry one
// token (takeHanded); the copies from the other nodes of the same release usually
// follow within a fraction of a millisecond. Two clean-ups used to run on those
// nodes for every handoff, nearly always for nothing: the withdrawal of the
// wait's places there (a node that had not handed the lock to the wait yet still
// had its place), and, for each copy that came after the owner's release had
// begun, the give-back of that copy's grant (a node where the release ran before
// the handoff keeps a grant for a wait that is over). On a hot key those were about
// 40 of the 140 commands of an acquisition over five nodes. Now each is skipped
// where the node's own reply shows it is not needed:
//
//   - settling: after takeHanded, the wait's places on the nodes not heard from
//     are withdrawn only if no copy from that node comes within settleDelay. A
//     copy means that the node handed the lock to the wait, which consumed the
//     place there; the grant it announces is the owner's, which the owner's
//     release frees (or, if the release ran there first, the copy's give-back
//     below).
//   - releaseRecord: a copy that comes for a wait that is over, while the owner no
//     longer holds the key, is given back unless the owner's latest release found
//     the owner holding on that node and freed it there. A handoff to the wait on
//     that node before the release is then freed by it; one after it would need a
//     place of the wait there, and the wait left none: a handoff or a granting
//     attempt consumed it, and the withdrawals (the one above, or the wait's own
//     when it stopped without the key, and their retries, which give back what is
//     handed to the wait) removed it everywhere else. Anything missed is held by
//     no one until its TTL lapses, as a dead waiter's grant is; the other nodes
//     still make a majority.

// settleDelay is how long a waiter that took a handed grant waits for copies from
// the other nodes before it withdraws its places there.
const settleDelay = 5 * time.Millisecond

// settling is a wait that took a handed grant before every node's copy came: the
// nodes not heard from yet.
type settling struct {
	rest map[int]bool
	done chan struct{} // closed when rest is empty
}

// settleLater withdraws wait wid of owner from the nodes rest, in the background,
// unless each sends a copy of the handoff within settleDelay (see settling). keep
// bounds the retries of nodes the withdrawal cannot reach (retryWithdraw).
func (b *Backend) settleLater(key, owner string, rest []int, wid uint64, keep time.Duration) {
	s := &settling{rest: make(map[int]bool, len(rest)), done: make(chan struct{})}
	for _, i := range rest {
		s.rest[i] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if w := b.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil && w.id == wid {
		// Copies that came since takeHanded took the grant's.
		for i := range w.handed {
			s.heard(i)
		}
	}
	if len(s.rest) == 0 {
		return
	}
	b.settles[wid] = s
	b.bg.Go(func() {
		t := time.NewTimer(settleDelay)
		select {
		case <-s.done:
		case <-t.C:
		case <-b.closing:
		}
		t.Stop()
		b.mu.Lock()
		delete(b.settles, wid)
		idx := make([]int, 0, len(s.rest))
		for i := range s.rest {
			idx = append(idx, i)
		}
		b.mu.Unlock()
		if len(idx) == 0 {
			return
		}
		slices.Sort(idx)
		if failed, _ := b.withdraw(context.Background(), key, owner, idx, "", false); len(failed) > 0 {
			b.retryWithdraw(key, owner, failed, b.handedMark(wid), keep)
		}
	})
}

// heard records a copy from node i. Called with Backend.mu held.
func (s *settling) heard(i int) {
	if s.rest[i] {
		delete(s.rest, i)
		if len(s.rest) == 0 {
			close(s.done)
		}
	}
}

// releaseRecord is what a release found on each node: kept for a while after it,
// for copies of a handoff that come late (see the top of this file).
type releaseRecord struct {
	h     driver.Holder
	at    time.Time
	mu    sync.Mutex
	freed []bool        // by node: the owner held there, and the release freed it
	left  int           // nodes that have not answered
	done  chan struct{} // closed when every node answered
}

// keepReleases is how long a release's record is kept after it began: copies of a
// handoff come within a millisecond of it on a healthy network. A copy that comes
// later is given back, the cautious way.
const keepReleases = 100 * time.Millisecond

// recordRelease starts the record of a release of h, replacing an earlier one, and
// drops the records older than keepReleases (releaseOrder holds them oldest first).
func (b *Backend) recordRelease(h driver.Holder) *releaseRecord {
	now := time.Now()
	rec := &releaseRecord{h: h, at: now, freed: make([]bool, len(b.nodes)), left: len(b.nodes), done: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, old := range b.releaseOrder {
		if now.Sub(old.at) <= keepReleases {
			break
		}
		if b.releases[old.h] == old {
			delete(b.releases, old.h)
		}
		n++
	}
	b.releaseOrder = append(b.releaseOrder[n:], rec)
	b.releases[h] = rec
	return rec
}

// answer records node i's reply to the release (release.lua's, or the error).
func (rec *releaseRecord) answer(i int, v any, err error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if err == nil {
		_, handed := v.(string) // the waiter woken, or handed the lock
		rec.freed[i] = handed || v == any(int64(released))
	}
	if rec.left--; rec.left == 0 {
		close(rec.done)
	}
}

// freedOn reports whether the release found the owner holding on node i and freed
// it there, once that node answered; false if the backend closes first.
func (rec *releaseRecord) freedOn(i int, closing <-chan struct{}) bool {
	select {
	case <-rec.done:
	case <-closing:
		return false
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.freed[i]
}
