package redlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// SetValue implements driver.Valuer: it replaces the value on every node where
// owner holds the key (one script per node, comparing the owner and keeping the
// TTL) and succeeds if a majority did. It returns an error matching ErrNotHeld when
// the owner provably holds no majority, and a QuorumError otherwise; nodes that
// took the new value then keep it, and Inspect reads whichever value a majority
// holds.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	keys := b.valueKeys(key)
	args := []any{owner}
	if len(value) > 0 {
		args = append(args, value)
	}
	r := fanoutFor(ctx, b, driver.Holder{Key: key, Owner: owner}, b.all(), func(ctx context.Context, n *node) (int64, error) {
		return setValueScript.Run(ctx, n.rdb, keys, args...).Int64()
	})
	ok, failed := 0, 0
	for i := range b.nodes {
		switch {
		case r.errs[i] != nil:
			failed++
		case r.vals[i] == valueSet:
			ok++
		}
	}
	if ok >= b.quorum {
		b.setValue(key, owner, value)
		return nil
	}
	qe := &QuorumError{Op: "set value", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	qe.notHeld = ok+failed < b.quorum
	return qe
}

// ForceRelease implements driver.ForceReleaser: it deletes the lock on every node,
// whatever its owner. The old holder learns at its next renewal; the next grant's
// token is larger, as for any grant.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	keys, prefix, nonce := b.releaseKeys(key), b.waiterPrefix(key), b.newNonce()
	r := fanoutFor(ctx, b, driver.Holder{Key: key}, b.all(), func(ctx context.Context, n *node) (int64, error) {
		return forceReleaseScript.Run(ctx, n.rdb, keys, prefix, nonce, key).Int64()
	})
	deletedOn, failed := 0, 0
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
		} else if r.vals[i] == deleted {
			deletedOn++
		}
	}
	if failed > len(b.nodes)-b.quorum {
		// The unanswered nodes could still hold a majority.
		return &QuorumError{Op: "force release", Key: key, OK: len(b.nodes) - failed, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	}
	if deletedOn == 0 {
		return fmt.Errorf("redlock: force release %q: %w", key, driver.ErrNotHeld)
	}
	return nil
}

// view is one node's answer to inspect.lua, or one reader's entry in it.
type view struct {
	owner   string
	tok     uint64
	value   string // "" for none
	pttl    int64
	wait    int64  // live waiters
	readers []view // the node's live readers (owner, tok, value, pttl)
}

// inspectNode runs inspect.lua on one node.
func (b *Backend) inspectNode(ctx context.Context, n *node, keys []string, prefix string) (view, error) {
	v, err := inspectScript.Run(ctx, n.rdb, keys, prefix).Slice()
	if err != nil {
		return view{}, err
	}
	if len(v) != 5 { // {value, pttl, counter, live waiters, readers}
		return view{}, fmt.Errorf("unexpected script reply %v", v)
	}
	var out view
	if s, ok := v[0].(string); ok { // "OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE"
		h, rest, _ := strings.Cut(s, tokenSep)
		out.owner = h
		out.tok, out.value = tokenValue(rest)
	}
	out.pttl, _ = v[1].(int64)
	out.wait, _ = v[3].(int64)
	rs, _ := v[4].([]any) // owner, "TOKEN" or "TOKEN VALUE", pttl; repeated
	for i := 0; i+2 < len(rs); i += 3 {
		owner, _ := rs[i].(string)
		data, _ := rs[i+1].(string)
		r := view{owner: owner}
		r.tok, r.value = tokenValue(data)
		r.pttl, _ = rs[i+2].(int64)
		out.readers = append(out.readers, r)
	}
	return out, nil
}

// tokenValue splits "TOKEN" or "TOKEN VALUE".
func tokenValue(s string) (uint64, string) {
	t, value, _ := strings.Cut(s, tokenSep)
	tok, _ := strconv.ParseUint(t, 10, 64)
	return tok, value
}

// Inspect implements driver.Inspector with the majority's view: the owner that holds
// the key on a majority of nodes (a writer, or else the reader with the smallest
// token among those that hold it on a majority, with Info.Shared set), its token,
// the time for which a majority still holds it, the value a majority of nodes holds
// with it, and the largest number of live waiters any node knows. When the owner
// holds a majority but no value does (a SetValue under way, or one that reached
// too few nodes) it returns a QuorumError.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	hs, err := b.readHolders(ctx, key, "inspect")
	if err != nil {
		return driver.Info{}, err
	}
	if len(hs) == 0 {
		return driver.Info{}, fmt.Errorf("redlock: inspect %q: %w", key, driver.ErrNotHeld)
	}
	return hs[0], nil
}

// ListHolders implements driver.HolderLister: the writer that holds key on a
// majority of nodes, or every reader that does, the smallest token first, each as
// Inspect reports it; none when the key is free.
func (b *Backend) ListHolders(ctx context.Context, key string) ([]driver.Info, error) {
	return b.readHolders(ctx, key, "list holders")
}

// readHolders reads every node's view of key and returns the writer that holds it
// on a majority, or the readers that do, the smallest token first; a QuorumError
// (for operation op) when too many nodes failed to tell, or when a holder's nodes
// agree on no value.
func (b *Backend) readHolders(ctx context.Context, key, op string) ([]driver.Info, error) {
	keys, prefix := b.keys(key), b.waiterPrefix(key)
	r := fanoutFor(ctx, b, driver.Holder{Key: key}, b.all(), func(ctx context.Context, n *node) (view, error) {
		return b.inspectNode(ctx, n, keys, prefix)
	})
	byOwner := make(map[string][]view)
	byReader := make(map[string][]view)
	failed := 0
	var waiters int64
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
			continue
		}
		v := r.vals[i]
		waiters = max(waiters, v.wait)
		if v.owner != "" {
			byOwner[v.owner] = append(byOwner[v.owner], v)
		}
		for _, rv := range v.readers {
			byReader[rv.owner] = append(byReader[rv.owner], rv)
		}
	}
	best := 0
	for owner, vs := range byOwner {
		best = max(best, len(vs))
		if len(vs) >= b.quorum {
			info, err := b.holderInfo(op, key, owner, vs, int(waiters), false, r.errs)
			if err != nil {
				return nil, err
			}
			return []driver.Info{info}, nil
		}
	}
	var out []driver.Info
	for owner, vs := range byReader {
		best = max(best, len(vs))
		if len(vs) < b.quorum {
			continue
		}
		info, err := b.holderInfo(op, key, owner, vs, int(waiters), true, r.errs)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	if len(out) == 0 && best+failed >= b.quorum {
		return nil, &QuorumError{Op: op, Key: key, OK: len(b.nodes) - failed, Need: b.quorum, Nodes: len(b.nodes),
			Note: "too many nodes failed to tell who holds it", Err: b.nodeErrors(r.errs)}
	}
	slices.SortFunc(out, func(a, c driver.Info) int {
		return cmp.Or(cmp.Compare(a.Token, c.Token), strings.Compare(a.Owner, c.Owner))
	})
	return out, nil
}

// holderInfo describes an owner that holds the key on the nodes of vs, a majority:
// its token, the time for which a majority still holds it (the quorum-th largest
// TTL), and the value a majority holds, or a QuorumError (for operation op) when no
// value does. A writer's token is the one a majority of nodes carries, as the
// holder's Lock took it (nodes outside that majority may carry another: one the node
// drew in a handoff, or 0 while the grant's commit is on its way), and a
// QuorumError while no token has a majority yet; a reader's is the largest its
// nodes report.
func (b *Backend) holderInfo(op, key, owner string, vs []view, waiters int, shared bool, errs []error) (driver.Info, error) {
	slices.SortFunc(vs, func(a, c view) int { return int(c.pttl - a.pttl) })
	var tok uint64
	votes := make(map[string]int, 1)
	toks := make(map[uint64]int, 1)
	for _, v := range vs {
		tok = max(tok, v.tok)
		votes[v.value]++
		if v.tok != 0 {
			toks[v.tok]++
		}
	}
	if !shared {
		tok = 0
		for t, n := range toks {
			if n >= b.quorum {
				tok = t
			}
		}
		if tok == 0 {
			return driver.Info{}, &QuorumError{Op: op, Key: key, OK: len(vs), Need: b.quorum, Nodes: len(b.nodes),
				Note: "no majority of nodes agrees on the holder's token yet (a grant settling)", Err: b.nodeErrors(errs)}
		}
	}
	info := driver.Info{Key: key, Owner: owner, Token: tok, Shared: shared,
		TTL: time.Duration(max(vs[b.quorum-1].pttl, 0)) * time.Millisecond, Waiters: waiters}
	for value, n := range votes {
		if n >= b.quorum {
			if value != "" {
				info.Value = []byte(value)
			}
			return info, nil
		}
	}
	return driver.Info{}, &QuorumError{Op: op, Key: key, OK: len(vs), Need: b.quorum, Nodes: len(b.nodes),
		Note: "no majority of nodes agrees on the value", Err: b.nodeErrors(errs)}
}
