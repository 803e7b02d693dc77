package redlock

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Refresh implements driver.Backend: it extends the lock on every node and succeeds
// if a majority did so within the validity. Nodes that lost the key get it back.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	start := time.Now()
	keys := b.grantKeys(key)
	g := b.grantOf(key, owner)
	tok, pttl := g.token, ms(ttl)
	h := driver.Holder{Key: key, Owner: owner}
	r := fanoutFor(ctx, b, h, b.all(), func(ctx context.Context, n *node) (int64, error) {
		return refreshScript.Run(ctx, n.rdb, keys, owner, pttl, tok, refreshOnly).Int64()
	})
	ok, failed := 0, 0
	var absent []int
	for i := range b.nodes {
		switch {
		case r.errs[i] != nil:
			failed++
		case r.vals[i] == refreshExtended:
			ok++
		case r.vals[i] == refreshAbsent:
			absent = append(absent, i)
		}
	}
	if ok >= b.quorum {
		if v := b.validity(ttl, start); v <= 0 {
			return &QuorumError{Op: "refresh", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes), Note: usedUp(start)}
		}
		if len(absent) > 0 {
			// A node that lost the key (restarted empty) would grant it to anyone:
			// close it again for the valid owner, with the grant's value if this
			// client knows it.
			shared := "0"
			if g.shared {
				shared = "1"
			}
			args := []any{owner, pttl, tok, refreshRestore, shared}
			if len(g.value) > 0 {
				args = append(args, g.value)
			}
			fanoutFor(ctx, b, h, absent, func(ctx context.Context, n *node) (int64, error) {
				return refreshScript.Run(ctx, n.rdb, keys, args...).Int64()
			})
		}
		return nil
	}
	qe := &QuorumError{Op: "refresh", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	if ok+failed < b.quorum {
		// Lost for good: free the minority that still has it, so others need not
		// wait for its TTL.
		qe.notHeld = true
		b.forget(key, owner)
		b.releaseOn(context.WithoutCancel(ctx), b.all(), key, owner, wakeHandOff)
	}
	return qe
}

// Release implements driver.Backend. It returns nil when a majority released the
// lock, an error matching ErrNotHeld when the owner provably held no majority, and a
// QuorumError otherwise (too many nodes failed to tell).
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	rec := b.recordRelease(driver.Holder{Key: key, Owner: owner}) // before forget: see handedCopy
	b.forget(key, owner)
	start := time.Now()
	// Return once a majority released it, unless a waiter was woken: the slowest
	// nodes finish in the background, and a waiter one of them names is yielded to
	// as well. A release that woke a waiter waits for every node, as the
	// releaser's step back (see yieldTo) is measured on the whole round: ended
	// sooner, its next Lock competed with the woken waiter more often. A release
	// that handed the lock over (see handoff.go) counts as one that released, and
	// is not stepped back for: the waiter holds the key already, and the
	// releaser's next Lock had better queue behind it at once.
	decided := func(r *results[any]) bool {
		n := 0
		for i, v := range r.vals {
			if r.errs[i] != nil {
				continue
			}
			w, ok := v.(string)
			if ok && !strings.HasPrefix(w, "+") {
				return false
			}
			if ok || v == any(int64(released)) {
				n++
			}
		}
		return n >= b.quorum
	}
	late := func(i int, v any, err error) {
		if w, ok := v.(string); ok && err == nil && !strings.HasPrefix(w, "+") {
			b.alsoYieldTo(key, w, min(max(2*time.Since(start), time.Millisecond), maxYield))
		}
		rec.answer(i, v, err)
	}
	r := b.releaseRace(ctx, b.all(), key, owner, "", wakeHandOff, decided, late)
	for i := range b.nodes {
		if r.errs[i] != errPending {
			rec.answer(i, r.vals[i], r.errs[i]) // the others come through late
		}
	}
	releasedOn, failed := 0, 0
	var woken []string
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
			continue
		}
		switch v := r.vals[i].(type) {
		case int64:
			if v == released {
				releasedOn++
			}
		case string: // the waiter woken, or "+" and the one handed the lock
			releasedOn++
			if !strings.HasPrefix(v, "+") && !slices.Contains(woken, v) {
				woken = append(woken, v)
			}
		}
	}
	if len(woken) > 0 {
		// Let the woken waiter take it before this client's next Lock barges in:
		// about one more round trip for the message and one for its attempt.
		b.yieldTo(key, woken, min(max(2*time.Since(start), time.Millisecond), maxYield))
	}
	if releasedOn >= b.quorum {
		return nil
	}
	qe := &QuorumError{Op: "release", Key: key, OK: releasedOn, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	qe.notHeld = releasedOn+failed < b.quorum
	return qe
}

// releaseRace runs release.lua on the given nodes, with one nonce for them all (a
// new one if nonce is empty), through race (decided and late may be nil); wake is
// the script's wake argument; requeue, if any, is its optional arguments for a
// waiter that gives back what its attempt took (see attempt.requeue).
func (b *Backend) releaseRace(ctx context.Context, idx []int, key, owner, nonce, wake string, decided func(*results[any]) bool, late func(int, any, error), requeue ...any) results[any] {
	keys, prefix := b.releaseKeys(key), b.waiterPrefix(key)
	if nonce == "" {
		nonce = b.newNonce()
	}
	args := append([]any{owner, prefix, nonce, key, wake}, requeue...)
	return race(ctx, b, driver.Holder{Key: key, Owner: owner}, idx, func(ctx context.Context, n *node) (any, error) {
		return releaseScript.Run(ctx, n.rdb, keys, args...).Result()
	}, decided, late, callRelease)
}

// releaseOn releases the owner's lock on the given nodes, ignoring failures (the
// lock expires by itself); wake is release.lua's wake argument.
func (b *Backend) releaseOn(ctx context.Context, idx []int, key, owner, wake string) {
	b.releaseRace(ctx, idx, key, owner, "", wake, nil, nil)
}

// newNonce returns an id for one release, the same on every node: this client's id
// and a counter.
func (b *Backend) newNonce() string {
	return b.id + "." + strconv.FormatUint(b.nonce.Add(1), 36)
}
