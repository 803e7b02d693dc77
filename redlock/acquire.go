package redlock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dlockio/dlock/driver"
)

// maxCommitRounds bounds the phase-two rounds of one acquire.
const maxCommitRounds = 3

// notQueued is acquire.lua's rank of an owner that is not in the wait set.
const notQueued = -1

// acqReply is one node's reply to acquire.lua (see its header).
type acqReply struct {
	status  int64 // statusHeld, statusFresh or statusReentry
	counter uint64
	x       int64 // token (fresh, re-entry) or pttl (held)
	rank    int64 // held: the owner's place in the wait set, notQueued if not there
	// shortest, held with the owner recorded as a waiter: the shortest TTL (ms)
	// any place in the wait set asked for (lib.lua's enqueue), else -1.
	shortest int64
}

func parseAcq(v any, err error) (acqReply, error) {
	if err != nil {
		return acqReply{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 3 || len(a) > 5 {
		return acqReply{}, fmt.Errorf("unexpected script reply %v", v)
	}
	n := [5]int64{3: notQueued, 4: -1} // {status, counter, x, rank, shortest}; the last two only when held
	for i := range a {
		if n[i], ok = a[i].(int64); !ok {
			return acqReply{}, fmt.Errorf("unexpected script reply %v", v)
		}
	}
	return acqReply{status: n[0], counter: uint64(max(n[1], 0)), x: n[2], rank: n[3], shortest: n[4]}, nil
}

// attempt is one Acquire: phase one's replies, sorted by what each node said.
type attempt struct {
	b        *Backend
	req      driver.Request
	keys     []string // lock, fence, wait set
	start    time.Time
	proposal uint64 // the token proposed in phase one, 0 for none
	// requeue, for a waiting writer's attempt that may be handed the lock, is
	// release.lua's optional arguments: a grant the attempt gives back keeps the
	// waiter's place (and is handed to the oldest waiter) on that node.
	requeue []any
	woken   uint64 // the wait's wake-ups when phase one was sent (see queued)
	wid     uint64 // the wait's number (see handoff.go), 0 for none
	r       results[acqReply]
	// outcome, when phase one returned early (see race), carries whether the
	// attempt succeeded to the handling of the late replies.
	outcome  chan bool
	decided1 bool // decide was called

	granted []int   // nodes that granted (fresh or re-entry)
	unknown []int   // nodes whose reply is unknown
	held    []int64 // pttl of nodes held by another owner
	maxSeen uint64  // the largest counter or token any node reported
	ahead   int64   // the least rank in the wait sets of the held nodes, -1 if none
	// shortest is the shortest TTL a place asked for in the wait sets of the held
	// nodes (acqReply.shortest), 0 if none said.
	shortest time.Duration
}

// Acquire implements driver.Backend: phase one on all nodes, then, unless the
// proposal settled the token, commit rounds on the nodes that granted.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if g, ok := b.takeHanded(req); ok {
		return g, nil
	}
	if err := b.answerLocally(req); err != nil {
		return driver.Grant{}, err
	}
	a := &attempt{b: b, req: req, keys: b.keys(req.Key), start: time.Now(), proposal: b.guess(req.Key), ahead: -1}
	defer a.decide(false) // unless decided before
	a.phaseOne(ctx)
	a.sort()
	b.saw(req.Key, a.maxSeen)
	if len(a.granted) < b.quorum {
		return a.fail(ctx, "", a.r.errs)
	}
	if b.validity(req.TTL, a.start) <= 0 {
		return a.fail(ctx, usedUp(a.start), a.r.errs)
	}
	token, note, errs := a.settle(ctx)
	if token == 0 {
		return a.fail(ctx, note, errs)
	}
	if b.validity(req.TTL, a.start) <= 0 {
		return a.fail(ctx, usedUp(a.start), a.r.errs)
	}
	b.saw(req.Key, token)
	b.remember(req.Key, req.Owner, token, req.Value, req.Shared)
	a.withdrawElsewhere()
	a.decide(true)
	return driver.Grant{Token: token}, nil
}

// answerLocally returns the error of a waiting attempt answered without asking the
// nodes, or nil: a newcomer steps back for a waiter this client's release woke, and
// a waiter queued behind others stays queued (see stillQueued).
func (b *Backend) answerLocally(req driver.Request) error {
	if req.Wait && !b.isQueued(req.Key, req.Owner) {
		// A newcomer, not a waiter that was woken.
		if d := b.yieldFor(req.Key, req.Owner); d > 0 {
			return fmt.Errorf("redlock: acquire %q: stepping back for a waiter this client's release woke: %w",
				req.Key, &driver.HeldError{RetryAfter: d})
		}
	}
	if ahead, askIn, ok := b.stillQueued(req); ok {
		return fmt.Errorf("redlock: acquire %q: still queued, %d ahead: %w",
			req.Key, ahead, &driver.HeldError{Ahead: ahead, Queued: true, RetryAfter: askIn})
	}
	return nil
}

// phaseOne runs acquire.lua on every node.
func (a *attempt) phaseOne(ctx context.Context) {
	b, req := a.b, a.req
	wa := b.waitArgs(req)
	a.woken, a.wid = wa.woken, wa.wid
	wait, since, wid, seq := wa.wait, wa.since, wa.wid, wa.seq
	ttl, patience, prefix := ms(req.TTL), ms(req.Patience), b.waiterPrefix(req.Key)
	if req.Wait {
		// The place must outlive the attempts answered locally (see recheck).
		patience = ms(req.Patience + recheck)
	}
	reenter := "0"
	if req.Reenter {
		reenter = "1"
	}
	shared := "0"
	if req.Shared {
		shared = "1"
	}
	keys := a.keys // not a: the closure would move it to the heap
	args := make([]any, 12, 13)
	args[0], args[1], args[2], args[3], args[4] = req.Owner, ttl, a.proposal, wait, patience
	args[5], args[6], args[7], args[8], args[9] = prefix, b.wakeCh, since, reenter, shared
	args[10], args[11] = wid, seq
	if len(req.Value) > 0 {
		args = append(args, req.Value)
	}
	if wid > 0 {
		a.requeue = []any{since, patience, b.wakeCh, wid, seq, ttl}
		if len(req.Value) > 0 {
			a.requeue = append(a.requeue, req.Value)
		}
	}
	h := driver.Holder{Key: req.Key, Owner: req.Owner}
	call := func(ctx context.Context, n *node) (acqReply, error) {
		return parseAcq(acquireScript.Run(ctx, n.rdb, keys, args...).Result())
	}
	if a.proposal == 0 {
		a.r = race(ctx, b, h, b.all(), call, nil, nil, callAcquire)
		return
	}
	a.outcome = make(chan bool, 1)
	a.r = race(ctx, b, h, b.all(), call, a.decided, a.late, callAcquire)
}

// decided reports whether phase one's replies so far settle the grant, so that
// Acquire need not wait for the slowest nodes: a majority granted the lock fresh
// with the proposal as token, and no node answered anything but that or "held".
// (Anything else, and a re-entry, is settled with every reply, as before.)
func (a *attempt) decided(r *results[acqReply]) bool {
	ok := 0
	for i, v := range r.vals {
		switch {
		case r.errs[i] != nil:
		case v.status == statusFresh && v.x > 0 && uint64(v.x) == a.proposal:
			ok++
		case v.status != statusHeld:
			return false
		}
	}
	return ok >= a.b.quorum
}

// undoWakes is release.lua's wake argument for giving back a grant of this attempt
// on a node, given its outcome: no wake-up when the attempt succeeded (its own
// release will wake) or when another owner holds a majority (whose release will);
// otherwise the node's waiters may have queued behind this attempt's grant alone,
// and one is woken, as by any release, but not handed the lock: a node handed to a
// writer while others go to readers woken by the same release would keep both
// from a majority.
func (a *attempt) undoWakes(ok bool) string {
	if ok || len(a.held) >= a.b.quorum {
		return wakeNone
	}
	return wakeOnly
}

// decide passes the attempt's outcome to the handling of phase one's late replies,
// once (the first call wins); it must come before anything that waits for them.
func (a *attempt) decide(ok bool) {
	if a.outcome != nil && !a.decided1 {
		a.decided1 = true
		a.outcome <- ok
	}
}

// late handles a phase-one reply that came after decided returned true, once the
// attempt's outcome is known: a grant there is released if the attempt failed after
// all (if it succeeded, the node holds the owner's lock like the others, though
// perhaps with no token or an earlier one in its value: the token is the one the
// majority accepted), and a waiter that was granted is
// withdrawn from a node that recorded it as a waiter (see withdrawElsewhere).
func (a *attempt) late(i int, v acqReply, err error) {
	b, req := a.b, a.req
	ok := <-a.outcome
	a.outcome <- ok // for the next late reply
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.nodeTimeout)
	defer cancel()
	n := b.nodes[i]
	switch {
	case err == nil && v.status != statusHeld:
		// Granted, fresh or re-entered: kept if the attempt succeeded (the node
		// holds the owner's lock, as after a restore), else given back.
		b.saw(req.Key, max(v.counter, uint64(max(v.x, 0))))
		if !ok {
			_ = releaseScript.Run(ctx, n.rdb, b.releaseKeys(req.Key), req.Owner, b.waiterPrefix(req.Key), b.newNonce(), req.Key,
				a.undoWakes(ok)).Err()
		}
	case err == nil && v.status == statusHeld:
		b.saw(req.Key, v.counter)
		fallthrough
	default:
		if ok && req.Wait {
			_ = b.withdrawOn(ctx, n, req.Key, req.Owner, b.newNonce(), "", false)
		}
	}
}

// sort sorts the nodes by their phase-one reply.
func (a *attempt) sort() {
	for i := range a.b.nodes {
		v := a.r.vals[i]
		switch {
		case a.r.errs[i] != nil:
			a.unknown = append(a.unknown, i)
		case v.status == statusHeld:
			a.held = append(a.held, v.x)
			a.maxSeen = max(a.maxSeen, v.counter)
			if v.rank >= 0 && (a.ahead < 0 || v.rank < a.ahead) {
				a.ahead = v.rank
			}
			if d := time.Duration(v.shortest) * time.Millisecond; d > 0 && (a.shortest == 0 || d < a.shortest) {
				a.shortest = d
			}
		default:
			a.granted = append(a.granted, i)
			a.maxSeen = max(a.maxSeen, v.counter, uint64(max(v.x, 0)))
		}
	}
}

// settle returns the grant's token: the one every granting node recorded (a
// re-entry that nothing later overtook), the proposal if a majority accepted it, or
// one settled by commit rounds. It returns 0, a note and the node errors (indexed
// like b.nodes) when no token was settled.
func (a *attempt) settle(ctx context.Context) (uint64, string, []error) {
	reentry, fresh := true, true
	var recorded uint64
	for _, i := range a.granted {
		v := a.r.vals[i]
		if v.status != statusReentry || v.x <= 0 || (recorded != 0 && uint64(v.x) != recorded) {
			reentry = false
		}
		if v.status == statusReentry && v.x > 0 {
			recorded = uint64(v.x)
		}
		if v.status != statusFresh || uint64(v.x) != a.proposal || a.proposal == 0 {
			fresh = false
		}
	}
	switch {
	case reentry && a.maxSeen == recorded:
		return recorded, "", nil // every granting node holds this grant; nothing later completed
	case fresh:
		return a.proposal, "", nil // a majority accepted the proposal in phase one
	}
	var t uint64
	var cerrs []error
	var note string
	if a.req.Shared {
		t = a.maxSeen // above every counter a granting node had, unless one re-entered
		for _, i := range a.granted {
			if a.r.vals[i].status == statusReentry {
				t = a.maxSeen + 1 // it drew nothing: its counter may be a later grant's token
				break
			}
		}
		t, cerrs, note = a.b.raise(ctx, a.req, a.granted, t, a.start)
	} else {
		t, cerrs, note = a.b.commit(ctx, a.req, a.b.grantKeys(a.req.Key), a.granted, a.maxSeen+1, a.start)
	}
	if t == 0 {
		errs := slices.Clone(a.r.errs)
		for i, err := range cerrs {
			if err != nil {
				errs[i] = err
			}
		}
		return 0, note, errs
	}
	return t, "", nil
}

// fail gives back what the attempt may have taken and returns its QuorumError, which
// matches driver.ErrLocked. nodeErrs are indexed like b.nodes.
func (a *attempt) fail(ctx context.Context, note string, nodeErrs []error) (driver.Grant, error) {
	b, req := a.b, a.req
	a.decide(false) // before releaseOn, which waits for the late replies
	// Give back fresh grants and nodes whose reply was lost. A re-entered node held
	// the owner's earlier grant before this attempt, so it is left as it was.
	// Without Reenter, a node whose reply was lost may hold a grant of the same
	// owner id made by another client or process (which refused this attempt): it
	// is left to expire.
	var undo []int
	for _, i := range a.granted {
		if a.r.vals[i].status == statusFresh {
			undo = append(undo, i)
		}
	}
	if req.Reenter {
		undo = append(undo, a.unknown...)
	}
	if len(undo) > 0 {
		a.giveBack(context.WithoutCancel(ctx), undo)
	}
	he := &driver.HeldError{RetryAfter: b.retryAfter(a.held)}
	if req.Wait && (len(a.held) > 0 || len(a.unknown) > 0) {
		// A node whose reply was lost (the call cut short, say) may have recorded
		// the waiter too: marked queued, it is withdrawn when it gives up, and its
		// next attempt removes the place if granted. Left behind, a writer's place
		// would keep every new reader out until it lapsed.
		he.Ahead, he.Queued = int(max(a.ahead, 0)), a.ahead >= 0
		// The key may change hands before this waiter's turn: to a place that
		// asked for a lease shorter than the one found, which may then lapse.
		lapse := he.RetryAfter
		if a.shortest > 0 && (lapse <= 0 || a.shortest < lapse) {
			lapse = a.shortest
		}
		b.queued(req.Key, req.Owner, he.Ahead, lapse, len(a.held) >= b.quorum && a.ahead >= 0 && len(a.granted) == 0, a.woken)
	}
	return driver.Grant{}, &QuorumError{Op: "acquire", Key: req.Key, OK: len(a.granted), Need: b.quorum,
		Nodes: len(b.nodes), Held: len(a.held), Note: note, Err: b.nodeErrors(nodeErrs), held: he}
}

// withdrawElsewhere withdraws a granted waiter, in the background, from the nodes
// that did not grant (not yet released there, or failed): they may have recorded the
// owner as a waiter, and a release there would wake it in vain until its place
// lapsed.
func (a *attempt) withdrawElsewhere() {
	if !a.req.Wait || len(a.granted) == len(a.b.nodes) {
		return
	}
	var rest []int
	for i := range a.b.nodes {
		if a.r.errs[i] == errPending {
			continue // late: see late
		}
		if a.r.errs[i] != nil || a.r.vals[i].status == statusHeld {
			rest = append(rest, i)
		}
	}
	a.b.withdrawAsync(a.req.Key, a.req.Owner, rest, a.wid, a.req.Patience+recheck+a.req.TTL)
}

// commit offers token t to the granting nodes until a majority accepts one, within
// the validity and a few rounds. It returns the accepted token, or 0 with the node
// errors of the last round (indexed like b.nodes) and a note.
func (b *Backend) commit(ctx context.Context, req driver.Request, keys []string, nodes []int, t uint64, start time.Time) (uint64, []error, string) {
	var errs []error
	for range maxCommitRounds {
		if err := ctx.Err(); err != nil {
			return 0, errs, "cancelled while settling the fencing token: " + err.Error()
		}
		if b.validity(req.TTL, start) <= 0 {
			return 0, errs, "validity used up while settling the fencing token"
		}
		r := fanoutFor(ctx, b, driver.Holder{Key: req.Key, Owner: req.Owner}, nodes, func(ctx context.Context, n *node) (int64, error) {
			return commitScript.Run(ctx, n.rdb, keys, req.Owner, t, "0").Int64()
		})
		errs = r.errs
		accepted := 0
		var next []int // the nodes that may still hold the grant
		maxC := t
		for _, i := range nodes {
			switch v := r.vals[i]; {
			case r.errs[i] != nil:
				next = append(next, i)
			case v == commitAccepted:
				accepted++
				next = append(next, i)
			case v == commitLost:
				// The owner lost the lock here: not asked again.
			case v > 0: // rejected: the node's counter
				maxC = max(maxC, uint64(v))
				next = append(next, i)
			}
		}
		if accepted >= b.quorum {
			return t, nil, ""
		}
		if len(next) < b.quorum {
			return 0, errs, fmt.Sprintf("the lock vanished from granting nodes while settling the fencing token (%d accepted)", accepted)
		}
		b.saw(req.Key, maxC)
		t, nodes = maxC+1, next
	}
	return 0, errs, "no fencing token accepted by a majority after several rounds"
}

// raise settles a reader's token when phase one did not: t, the largest token the
// granting nodes drew or accepted (a.maxSeen covers them all; one above it when a
// node re-entered, drawing nothing), is recorded on them and their counters raised
// to it (commit.lua, raise), in one round that never rejects. Once a majority holds
// a counter of at least t, every grant that starts later gets a larger token, as
// with the register's rule; readers that overlap may share one. It returns t, or 0
// with the node errors (indexed like b.nodes) and a note.
func (b *Backend) raise(ctx context.Context, req driver.Request, nodes []int, t uint64, start time.Time) (uint64, []error, string) {
	keys := b.grantKeys(req.Key)
	r := fanoutFor(ctx, b, driver.Holder{Key: req.Key, Owner: req.Owner}, nodes, func(ctx context.Context, n *node) (int64, error) {
		return commitScript.Run(ctx, n.rdb, keys, req.Owner, t, "1").Int64()
	})
	accepted := 0
	for _, i := range nodes {
		if r.errs[i] == nil && r.vals[i] == commitAccepted {
			accepted++
		}
	}
	switch {
	case accepted < b.quorum:
		return 0, r.errs, fmt.Sprintf("the reader's grant vanished from granting nodes while settling the fencing token (%d raised)", accepted)
	case b.validity(req.TTL, start) <= 0:
		return 0, r.errs, "validity used up while settling the fencing token"
	}
	return t, nil, ""
}

// retryAfter estimates when enough held nodes free up for a majority: with held
// sorted by remaining TTL, the one whose expiry completes a majority.
func (b *Backend) retryAfter(held []int64) time.Duration {
	need := b.quorum - (len(b.nodes) - len(held))
	if need <= 0 {
		return 0
	}
	s := slices.Clone(held)
	slices.Sort(s)
	if s[need-1] <= 0 {
		return 0
	}
	return time.Duration(s[need-1]) * time.Millisecond
}
