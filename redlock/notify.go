package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// Waiting by notification.
//
// An attempt that finds the key held on a node records the waiter there: its place
// in the key's wait set, ordered by when it started waiting (a time its client sends,
// the same to every node, so that the nodes agree on the order), and its client's
// wake-up channel, with the core's patience as expiry. A release then publishes, on
// each node, to the client of that node's oldest live waiter only. Each client
// subscribes once to its own channel on every node (one subscriber connection per
// node, opened on first contention), whatever the number of keys and waiters.
//
// Because that subscription starts after the first failed attempt, a release in
// between would be missed; so when the first node confirms the subscription, every
// local waiter is woken once to try again. From then on a waiter is subscribed
// before it is recorded anywhere, so no release can miss it.
//
// One release sends one message per node and per waiter it wakes (one, or a run of
// readers), with a nonce shared by its copies. The client wakes a local waiter that
// copies name when copies from a majority have named it (so that its attempt does
// not come before the release reached a majority), and the first waiter named
// wakeDelay after the first copy if they do not; so a release wakes each waiter it
// names at most once, and one more when nodes disagree. If the named waiter vanished
// without withdrawing (its process died), others wait for their fallback timer until
// its place lapses. A release that hands the lock to a writer (see handoff.go) sends
// its copies the same way, counted the same way, except that the first waiter named
// is woken handoffDelay after the first copy: the nodes that did not hand it the
// lock either freed it or handed it to another waiter, and its attempt claims what
// it was handed either way.

const (
	subscribeTimeout = time.Second
	listenBackoff    = 100 * time.Millisecond
	recentReleases   = 64
	// wakeDelay bounds how long a waiter named by a release waits for copies from a
	// majority of nodes before it is woken anyway (see wake).
	wakeDelay = 5 * time.Millisecond
)

type waiter struct {
	b          *Backend
	key, owner string
	since      int64 // ms, when the wait started, on this client's clock
	c          chan struct{}
	id         uint64 // the wait's number (WID, see handoff.go)

	// Guarded by Backend.mu.
	attempts                     // numbers and send times of its latest attempts
	handed   map[int]handedGrant // by node index: grants handed to this wait
	gaveBack string              // the nonce of its latest attempt's give-back
	queued   bool                // recorded as a waiter on some node
	local    bool                // attempts may be answered without a request (see stillQueued)
	until    time.Time           // attempts are answered locally until then (see stillQueued)
	ahead    int                 // the places ahead of it at its last attempt
	woken    uint64              // how often signal was called
	keep     time.Duration       // how long its places and handed grants may last
}

// recheck bounds how long the attempts of a waiter that is queued behind others on
// a majority are answered without a request, and is added to the patience its
// places are recorded with on the nodes, so that they outlive those attempts.
// Without it, every waiter's fallback attempt (the core's guard against a lost
// wake-up, every few seconds) ran a script on every node: at a few thousand
// waiters, tens of thousands of scripts a second, which starved the holder's calls
// past the node timeout. The price: the place of a waiter whose process died
// without withdrawing lapses recheck later, and until then the releases that pick
// it wake nobody; the key is then free, and taken at the next attempt that asks the
// nodes (the first waiter in line does, see localWindow).
const recheck = 15 * time.Second

// localWindow is how long after an attempt that found ahead places before the
// waiter its next attempts are answered locally: recheck, or less when the
// attempt learnt how soon a lease could lapse (lapse: the lease it found, or the
// shortest lease a place in the queue asked for if that is shorter). The places
// ahead may leave without a release that reaches this waiter: the first of them
// granted (by a handoff, or its own attempt) and then gone without releasing (a
// crash, a pause) lets its lease lapse, and the waiter behind it, now first in
// line, must then ask the nodes itself. So a waiter with one place ahead asks
// again after lapse, one with more after that times log2 of their number (about
// one lease per place that may leave that way before it is first), and none later
// than recheck: a queued waiter asks the nodes about once per such lease, or per
// recheck if that is sooner.
func localWindow(ahead int, lapse time.Duration) time.Duration {
	if lapse <= 0 {
		return recheck // unknown: a reader's lease, or only queued writers ahead
	}
	return min(recheck, lapse*time.Duration(max(bits.Len(uint(ahead)), 1)))
}

// stillQueued reports whether a waiting attempt can be answered "locked" without a
// request, how many places are ahead, and when to ask the nodes again: the
// waiter's last attempt found it recorded behind others on a majority of nodes,
// its local window (see localWindow) has not ended, nothing woke it since, and
// every node's wake-up subscription is up (so its wake-up, when it becomes first
// in line, is not lost).
func (b *Backend) stillQueued(req driver.Request) (ahead int, askIn time.Duration, ok bool) {
	if !req.Wait {
		return 0, 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
	if w == nil || !w.local || w.ahead < 1 {
		return 0, 0, false
	}
	askIn = time.Until(w.until)
	if askIn <= 0 {
		return 0, 0, false
	}
	for _, n := range b.nodes {
		if !n.psUp {
			return 0, 0, false
		}
	}
	return w.ahead, askIn, true
}

// release counts the copies of one release's message; guarded by Backend.mu.
type release struct {
	nonce string
	named []*named // the local waiters its copies named, the first named first
}

// named is a local waiter that copies of one release named: one for a mutex's
// release, several when it woke a run of readers (or the nodes disagreed).
type named struct {
	w      *waiter
	copies int
	woken  bool // w was signalled
}

// Watch implements driver.Notifier. It only registers the waiter locally: an
// uncontended Lock costs no network call for it.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	w := &waiter{b: b, key: key, owner: owner, id: b.seq.Add(1), since: time.Now().UnixMilli(), c: make(chan struct{}, 1)}
	b.waiters[driver.Holder{Key: key, Owner: owner}] = w
	return w, nil
}

// waitArgs is what an attempt about to be sent needs of its wait.
type waitArgs struct {
	wait  string // the acquire script's wait flag
	since int64  // the waiting-since time
	// wid and seq are, for a writer's registered wait, its number and the number
	// of this attempt, noted now (see handoff.go); 0 and 0 otherwise.
	wid, seq uint64
	woken    uint64 // the wait's wake-ups so far (see queued)
}

// waitArgs returns req's waitArgs.
func (b *Backend) waitArgs(req driver.Request) waitArgs {
	if !req.Wait {
		return waitArgs{wait: waitNo}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
	if w == nil {
		return waitArgs{wait: waitRecord, since: time.Now().UnixMilli()}
	}
	wa := waitArgs{wait: waitRecord, since: w.since, woken: w.woken}
	if w.queued {
		wa.wait = waitRecorded
	}
	if !req.Shared {
		wa.wid, wa.seq = w.id, w.attempt()
	}
	// A place lasts its patience and recheck from this attempt (see phaseOne);
	// a grant handed to it, its TTL from the handoff.
	w.keep = max(w.keep, req.Patience+recheck+req.TTL)
	return wa
}

// queued is called when an attempt with Wait found the key held: the waiter is now
// recorded on the nodes, ahead places before it, and the client must be subscribed.
// local says the attempt found it recorded on a majority, which lets the next
// attempts be answered locally (see stillQueued) for the local window of ahead and
// lapse (the time until a lease could lapse, see localWindow; 0 if unknown),
// unless the wait was woken since the attempt was sent (woken is its count of
// wake-ups then): that wake-up came after the attempt's replies were made, and the
// next attempt must ask the nodes.
func (b *Backend) queued(key, owner string, ahead int, lapse time.Duration, local bool, woken uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if w := b.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil {
		w.queued = true
		w.local, w.until, w.ahead = local && w.woken == woken, time.Now().Add(localWindow(ahead, lapse)), ahead
	}
	b.startListening()
}

// startListening starts the subscriber connections, once; called with Backend.mu
// held.
func (b *Backend) startListening() {
	if b.notify {
		return
	}
	b.notify = true
	for _, n := range b.nodes {
		n.ps = n.rdb.Subscribe(context.Background()) // no network call yet
		b.bg.Go(func() { b.listen(n) })
	}
}

// listen subscribes to the client's channel on one node and reads it until Close.
func (b *Backend) listen(n *node) {
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	// On failure go-redis still remembers the channel and subscribes again when
	// Receive reconnects.
	_ = n.ps.Subscribe(ctx, b.wakeCh)
	cancel()
	for {
		m, err := n.ps.Receive(context.Background())
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			// The node is down or the connection broke; go-redis reconnects and
			// resubscribes on the next call. Wake-ups lost meanwhile come from the
			// other nodes or the waiters' fallback timers, which ask the nodes
			// again until the subscription is confirmed.
			b.subscriptionDown(n)
			t := time.NewTimer(listenBackoff)
			select {
			case <-t.C:
			case <-b.closing:
				t.Stop()
				return
			}
			continue
		}
		switch m := m.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind != "subscribe":
			case m.Channel == b.wakeCh:
				b.confirmed(n)
			default:
				b.holderSubscribed(n, m.Channel)
			}
		case *redis.Message:
			if m.Channel == b.wakeCh {
				b.wake(n, m.Payload)
			} else {
				b.holderChanged(m.Channel)
			}
		}
	}
}

// confirmed records that node n confirmed the subscription, and wakes every local
// waiter the first time a node does, so that a release missed before it is not
// waited for.
func (b *Backend) confirmed(n *node) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n.psUp = true
	if b.subscribed {
		return
	}
	b.subscribed = true
	for _, w := range b.waiters {
		w.signal()
	}
}

// subscriptionDown records that node n's subscription broke: a release there may
// have been missed, so every waiter that answered its attempts locally asks the
// nodes at once, and until the subscription is confirmed again every attempt does.
func (b *Backend) subscriptionDown(n *node) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !n.psUp {
		return
	}
	n.psUp = false
	for _, w := range b.waiters {
		if w.local {
			w.signal()
		}
	}
}

// wake handles one node's copy of a release's message "NONCE OWNER COUNTER KEY".
//
// A named local waiter is woken once copies from a majority of nodes named it: an
// attempt sent earlier could reach nodes the release had not reached yet, find the
// key held there, and have to give back what it took elsewhere (a round trip and a
// wasted attempt per handoff when it happens). If a majority of copies does not
// name the first waiter named within wakeDelay of its first copy (the nodes named
// different waiters, or some are slow), it is woken anyway. The counter (the node's
// fencing counter) is recorded, so that the waiter's attempt proposes a token above
// the holder's and settles it in its one round.
//
// A handoff's copy ("+NONCE OWNER TOKEN SEQ TTL WID KEY") is counted the same way, once
// recorded with the waiter (see handed), so that its next attempt can return the
// grant without a request.
func (b *Backend) wake(n *node, payload string) {
	if p, ok := strings.CutPrefix(payload, "+"); ok {
		b.handedCopy(n, p)
		return
	}
	nonce, rest, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	owner, rest, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	counter, key, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	if c, err := strconv.ParseUint(counter, 10, 64); err == nil {
		b.saw(key, c)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[driver.Holder{Key: key, Owner: owner}]
	if w == nil {
		return
	}
	b.countCopy(w, nonce, wakeDelay)
}

// countCopy counts one copy of release nonce's message that named local waiter w, and
// wakes w when the copies settle it (see wake). Called with Backend.mu held.
func (b *Backend) countCopy(w *waiter, nonce string, delay time.Duration) {
	var r *release
	for _, x := range b.recent {
		if x.nonce == nonce {
			r = x
			break
		}
	}
	if r == nil {
		if len(b.recent) == recentReleases {
			b.recent = b.recent[1:]
		}
		r = &release{nonce: nonce}
		b.recent = append(b.recent, r)
	}
	var t *named
	for _, x := range r.named {
		if x.w == w {
			t = x
			break
		}
	}
	if t == nil {
		t = &named{w: w}
		r.named = append(r.named, t)
		if len(r.named) == 1 {
			// The first waiter named is woken after wakeDelay even without
			// copies from a majority.
			time.AfterFunc(delay, func() {
				b.mu.Lock()
				defer b.mu.Unlock()
				if !t.woken {
					t.woken = true
					w.signal()
				}
			})
		}
	}
	t.copies++
	if t.copies == b.quorum && !t.woken {
		t.woken = true
		w.signal()
	}
}

// signal wakes the waiter; its next attempt asks the nodes. Called with
// Backend.mu held.
func (w *waiter) signal() {
	w.local = false
	w.woken++
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// isQueued reports whether owner waits for key and an earlier attempt recorded it on
// the nodes.
func (b *Backend) isQueued(key, owner string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[driver.Holder{Key: key, Owner: owner}]
	return w != nil && w.queued
}

func (w *waiter) C() <-chan struct{} { return w.c }

// Stop implements driver.Waiter. A waiter that gives up is removed from the nodes'
// wait sets, so that no release wakes it in vain (best effort: a place left behind
// lapses after its patience).
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	b.mu.Lock()
	if b.waiters[driver.Holder{Key: w.key, Owner: w.owner}] == w {
		delete(b.waiters, driver.Holder{Key: w.key, Owner: w.owner})
	}
	queued, keep := w.queued, w.keep
	b.mu.Unlock()
	if acquired || !queued {
		return nil
	}
	// With the wait's mark, so that a grant handed to it is given back and
	// handed on. Nodes that could not be reached are tried again in the
	// background while the place or a grant handed to it may live there: a
	// release there would hand the lock to a place no one waits on, for the
	// place's TTL.
	failed, err := b.withdraw(ctx, w.key, w.owner, b.all(), w.mark(), false)
	if len(failed) > 0 {
		b.retryWithdraw(w.key, w.owner, failed, w.mark(), keep)
	}
	if err != nil {
		return fmt.Errorf("redlock: withdraw waiter %q: %w", w.key, err)
	}
	return nil
}

// withdraw removes owner's place from the wait sets of the given nodes. A place
// given up on a node where no writer holds the key wakes the waiters it held back
// (see withdraw.lua), with one nonce for every node. mark, when not empty, names
// the wait ("CHANNEL WID") whose handed grants are given back too; a waiter that got
// the lock passes none: a grant handed to it on another node is its own (its
// release frees it). With handedOnly, only such a grant is given back, and places
// are left alone. It returns the nodes that failed, and their errors.
func (b *Backend) withdraw(ctx context.Context, key, owner string, idx []int, mark string, handedOnly bool) ([]int, error) {
	nonce := b.newNonce()
	r := fanoutFor(ctx, b, driver.Holder{Key: key, Owner: owner}, idx, func(ctx context.Context, n *node) (int64, error) {
		return 0, b.withdrawOn(ctx, n, key, owner, nonce, mark, handedOnly)
	})
	var failed []int
	for _, i := range idx {
		if r.errs[i] != nil {
			failed = append(failed, i)
		}
	}
	return failed, b.nodeErrors(r.errs)
}

// withdrawOn removes owner's place from the wait set of node n (see withdraw).
func (b *Backend) withdrawOn(ctx context.Context, n *node, key, owner, nonce, mark string, handedOnly bool) error {
	only := "0"
	if handedOnly {
		only = "1"
	}
	return withdrawScript.Run(ctx, n.rdb, b.withdrawKeys(key), owner, b.waiterPrefix(key), nonce, key, mark, only).Err()
}

// withdrawAsync is withdraw in the background, without a mark, for wait wid of
// owner, which got the lock; Close waits for it. Nodes it cannot reach are tried
// again (retryWithdraw, for keep at most) with the wait's mark, so that a place of
// a later wait of the owner id is left alone: a writer's place left behind would
// keep every reader out there, and be handed the lock, until it lapsed.
func (b *Backend) withdrawAsync(key, owner string, idx []int, wid uint64, keep time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.bg.Go(func() {
		failed, _ := b.withdraw(context.Background(), key, owner, idx, "", false)
		if len(failed) > 0 {
			b.retryWithdraw(key, owner, failed, b.handedMark(wid), keep)
		}
	})
}

// Bounds of retryWithdraw's backoff.
const (
	retryWithdrawMin = 25 * time.Millisecond
	retryWithdrawMax = time.Second
)

// retryWithdraw withdraws a stopped wait from the nodes idx, which its Stop could
// not reach, in the background: again and again, with a growing pause, until every
// one of them answered, keep has passed (by then its place and any grant handed to
// it have lapsed) or the backend closes.
func (b *Backend) retryWithdraw(key, owner string, idx []int, mark string, keep time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	deadline := time.Now().Add(keep)
	b.bg.Go(func() {
		pause := retryWithdrawMin
		for len(idx) > 0 && time.Now().Before(deadline) {
			t := time.NewTimer(pause)
			select {
			case <-b.closing:
				t.Stop()
				return
			case <-t.C:
			}
			idx, _ = b.withdraw(context.Background(), key, owner, idx, mark, false)
			pause = min(2*pause, retryWithdrawMax)
		}
	})
}
