package redlock

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Direct handoff (see driver.Waiter).
//
// A writer's waiting attempt records with its place on each node the wait's number
// (WID, unique in this client), the attempt's number (SEQ) and the TTL and value it
// asks for. A release that frees the lock on a node whose oldest live waiter is
// such a writer grants it the lock there and then (wake.lua's handOff): the node
// draws the token (its counter + 1), sets the lock value with the place's TTL and
// value, marks the grant as handed to "CHANNEL WID", and publishes the grant on the
// waiter's channel. The waiter's client records each copy (handedCopy). Once copies
// from a majority of nodes carry one token, the waiter's next Acquire returns that
// token without a request (takeHanded): the handoff costs the release alone, where
// a woken waiter's attempt costs a round on every node.
//
// The token: every node of that majority drew the same token T, one above its
// counter, and now holds T as its counter. A grant that completed before had its
// token at or below the counter of a majority, which shares a node with this one,
// so T is above it; a later grant must pass the counter of a node of this majority,
// so its token is above T. This is the register's argument (see Fencing in the
// package documentation), as for readers' drawn tokens. Copies that carry
// different tokens, or too few copies, are not used: the waiter asks the nodes,
// and a node that handed the lock to this wait gives it to the attempt as a free
// lock (acquire.lua claims it), so the attempt settles a token as any other does,
// and gives the grant back if it fails.
//
// Validity: the node started the grant's TTL after the attempt SEQ had run there,
// hence after this client sent it; Grant.Age is the time since the oldest of the
// majority's attempts was sent, so the core's lease ends before any of those nodes
// lets another holder in.
//
// What makes a recorded copy trustworthy: a grant handed to a wait leaves its node
// only by the TTL (Age covers it), by a force release, or by this wait's own calls:
// an attempt (which claims it as a free lock, or gives back what it claimed), or the
// withdrawal when the wait stops. An attempt clears the copies before it is sent and
// drops those of earlier attempts (below), and a stopped wait has no copies to use;
// so the copies takeHanded finds were all handed after the wait's latest attempt
// ran on their nodes, and are still there unless the TTL or an operator removed
// them.
//
// Stale copies: a copy of an attempt older than the wait's latest is dropped (the
// latest attempt may have claimed, and given back, the grant it announces); an
// attempt clears the copies recorded before it. Dropping a copy is always safe:
// the grant it announces is claimed by the next attempt, or given back when the
// wait stops (withdraw.lua, with the wait's mark), so a waiter that gives up leaves
// nothing behind, even a grant still on its way to it. When the withdrawal cannot
// reach a node, it is tried again in the background while the place may live there
// (retryWithdraw), and a copy that reaches a client whose wait is over, and which
// does not hold the key, is given back (handedCopy), unless the owner's release
// found the owner holding on that node and freed it there (settle.go). A wait that
// took a handed grant withdraws its places from the nodes whose copies had not come
// yet, unless they come within settleDelay (settle.go). A waiter whose process
// dies holds a handed grant until its TTL lapses, as a holder that dies does.

// handoffDelay is wakeDelay for a release that handed the lock to the waiter on
// some node: how long it waits for copies from a majority of nodes before its next
// attempt claims the grants it has (the copies of one release arrive within a
// fraction of a millisecond of each other on a healthy network).
const handoffDelay = time.Millisecond

// handedGrant is one node's copy of a handoff to a local wait.
type handedGrant struct {
	token uint64
	ttl   int64     // ms, as the place asked
	sent  time.Time // when the attempt that wrote the place was sent
}

// attempts numbers a wait's attempts and notes when the latest were sent.
type attempts struct {
	seqs [4]uint64
	sent [4]time.Time
	last uint64 // the latest attempt's number
}

// attempt numbers the attempt about to be sent, notes the time and clears the
// copies recorded before it. Called with Backend.mu held.
func (w *waiter) attempt() uint64 {
	seq := w.b.seq.Add(1)
	i := seq % uint64(len(w.seqs))
	w.seqs[i], w.sent[i], w.last = seq, time.Now(), seq
	w.handed = nil
	return seq
}

// sentAt returns when attempt seq of the wait was sent, if it is the latest or one
// of the few before it that are still noted.
func (w *waiter) sentAt(seq uint64) (time.Time, bool) {
	i := seq % uint64(len(w.seqs))
	if seq == 0 || w.seqs[i] != seq {
		return time.Time{}, false
	}
	return w.sent[i], true
}

// mark is the HANDED mark of a grant handed to this wait (see lib.lua).
func (w *waiter) mark() string { return w.b.handedMark(w.id) }

// handedMark is the HANDED mark of a grant handed to this client's wait wid.
func (b *Backend) handedMark(wid uint64) string {
	return b.wakeCh + " " + strconv.FormatUint(wid, 10)
}

// handedCopy handles node n's copy of a handoff, "NONCE OWNER TOKEN SEQ TTL WID KEY"
// (the leading "+" taken off).
func (b *Backend) handedCopy(n *node, p string) {
	f := strings.SplitN(p, " ", 7)
	if len(f) != 7 {
		return
	}
	nonce, owner, key := f[0], f[1], f[6]
	token, err1 := strconv.ParseUint(f[2], 10, 64)
	seq, err2 := strconv.ParseUint(f[3], 10, 64)
	ttl, err3 := strconv.ParseInt(f[4], 10, 64)
	wid, err4 := strconv.ParseUint(f[5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return
	}
	b.saw(key, token)
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.settles[wid]; s != nil {
		s.heard(n.idx) // the wait took a grant: its place here is consumed (settle.go)
	}
	h := driver.Holder{Key: key, Owner: owner}
	w := b.waiters[h]
	if w == nil || w.id != wid {
		// The wait is over. Unless it got the key (then a grant handed to it
		// here too is the owner's, and its release frees it), the grant goes
		// back: the wait's withdrawal may not have reached this node, and the
		// lock would stay with a place no one waits on for its TTL. A release
		// of the owner's that found it holding here freed it already (see
		// settle.go).
		if _, held := b.grants[h]; !held && !b.closed {
			mark, rec := b.handedMark(wid), b.releases[h]
			b.bg.Go(func() {
				if rec != nil && rec.freedOn(n.idx, b.closing) {
					return
				}
				_, _ = b.withdraw(context.Background(), key, owner, []int{n.idx}, mark, true)
			})
		}
		return
	}
	if seq < w.last {
		return // stale (see above); the latest attempt is under way or done
	}
	if sent, ok := w.sentAt(seq); ok {
		if w.handed == nil {
			w.handed = make(map[int]handedGrant, len(b.nodes))
		}
		w.handed[n.idx] = handedGrant{token: token, ttl: ttl, sent: sent}
		if len(w.handed) >= b.quorum {
			// Enough to return the grant, whatever releases the copies came
			// from: the wake-up of the release that sent the first ones may
			// have been spent on an attempt that came too early.
			w.signal()
		}
	}
	if nonce != w.gaveBack {
		b.countCopy(w, nonce, handoffDelay)
	}
}

// giveBack releases what a failed attempt took on the nodes idx. A waiting writer
// keeps its place there (see attempt.requeue), so the lock is handed to the oldest
// waiter, perhaps itself; copies of that handoff to itself do not wake it (they
// would make it attempt again at once, in a loop while no majority can be had),
// though they count towards the grant it may take when another release wakes it.
func (a *attempt) giveBack(ctx context.Context, idx []int) {
	b, req := a.b, a.req
	if a.requeue == nil {
		b.releaseOn(ctx, idx, req.Key, req.Owner, a.undoWakes(false))
		return
	}
	nonce := b.newNonce()
	b.mu.Lock()
	if w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]; w != nil {
		// Queued now, if it was not: Stop withdraws it, and gives back what
		// the give-back hands it.
		w.gaveBack, w.queued = nonce, true
	}
	b.mu.Unlock()
	b.releaseRace(ctx, idx, req.Key, req.Owner, nonce, wakeHandOff, nil, nil, a.requeue...)
}

// takeHanded returns the grant handed to req's wait when copies from a majority of
// nodes carry one token, the TTL asked for and time left; ok is false otherwise,
// and the attempt that follows asks the nodes. The copies are used once.
func (b *Backend) takeHanded(req driver.Request) (driver.Grant, bool) {
	if !req.Wait || req.Shared {
		return driver.Grant{}, false
	}
	b.mu.Lock()
	w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
	var hs map[int]handedGrant
	var wid uint64
	if w != nil {
		hs, w.handed, wid = w.handed, nil, w.id
	}
	b.mu.Unlock()
	if len(hs) < b.quorum {
		return driver.Grant{}, false
	}
	var token uint64
	var oldest time.Time
	for _, g := range hs {
		if (token != 0 && g.token != token) || g.ttl != ms(req.TTL) {
			return driver.Grant{}, false
		}
		token = g.token
		if oldest.IsZero() || g.sent.Before(oldest) {
			oldest = g.sent
		}
	}
	if token == 0 || b.validity(req.TTL, oldest) <= 0 {
		return driver.Grant{}, false
	}
	b.remember(req.Key, req.Owner, token, req.Value, false)
	// The places on the other nodes go; a grant handed there later is the
	// owner's, freed by its release.
	var rest []int
	for i := range b.nodes {
		if _, ok := hs[i]; !ok {
			rest = append(rest, i)
		}
	}
	if len(rest) > 0 {
		b.settleLater(req.Key, req.Owner, rest, wid, req.Patience+recheck+req.TTL)
	}
	return driver.Grant{Token: token, Age: time.Since(oldest)}, true
}
