package checker

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// p4 is the token order check. Per key, a grant whose acquire ended before
// another's attempt began must have the smaller token, and no two grants share a
// token (a fencing token that two holders carry tells them apart from nobody),
// except two readers of a read-write lock whose acquires overlapped, which hold
// together anyway (Redlock's readers may: see driver.Grant).
// Token 0 means the backend cannot fence; such grants are not checked.
//
// It runs twice: a sweep in O(n log n) counts the offending grants (each grant
// once, with the earlier grant it contradicts), and porcupine checks that the OK
// acquires of each key are linearizable as operations of a register that only
// accepts a token larger than the last (Call = Attempt, Return = End, output =
// token). Both decide the same thing: a linearization must put every grant that
// ended before another began first, so one exists exactly when sorting the grants
// by token respects that order and no token repeats. Porcupine is the
// independent verdict; the sweep gives the count and the examples.
//
// What it misses: grants whose [Attempt, End] intervals overlap are never
// ordered, so an inversion between them is not seen.
//
// Both verdicts are in one function (about 110 lines) so that they read side by
// side over the same per-key grant lists.
func (c *run) p4() {
	p := &c.r.P4
	if c.h.Meta.Limit > 1 {
		// Waiters promoted together (etcd, ZooKeeper) hold tokens from when they
		// queued and learn of their permits in any order.
		c.note("P4: a semaphore's permits are granted together and learnt of in any order: token order was not checked")
		p.Porcupine = VerdictSkipped
		return
	}
	rw := c.h.Meta.RW
	type flag struct {
		b, a *Lease
		dup  bool
	}
	var flags []flag
	grantsByKey := map[string][]*Lease{}
	for _, k := range c.keys {
		var gs []*Lease // by acquire End
		for _, l := range c.byKey[k] {
			if l.Token == 0 {
				p.ZeroToken++
				continue
			}
			gs = append(gs, l)
		}
		p.Grants += len(gs)
		if len(gs) == 0 {
			continue
		}
		grantsByKey[k] = gs
		flagged := map[*Lease]bool{}
		byAttempt := slices.Clone(gs)
		slices.SortStableFunc(byAttempt, byCall)
		next := 0
		// The largest token among grants that ended before the attempt, and
		// among writers' only: in a read-write lock, readers promoted together
		// hold tokens from when they queued and learn of their grants in any
		// order, so a reader is checked against earlier writers alone.
		var top, topWriter *Lease
		for _, b := range byAttempt {
			for next < len(gs) && gs[next].Acquire.End < b.Attempt() {
				if top == nil || gs[next].Token > top.Token {
					top = gs[next]
				}
				if !gs[next].Acquire.Shared && (topWriter == nil || gs[next].Token > topWriter.Token) {
					topWriter = gs[next]
				}
				next++
			}
			against := top
			if rw && b.Acquire.Shared {
				against = topWriter
			}
			if against != nil && against.Token >= b.Token {
				flags = append(flags, flag{b: b, a: against})
				flagged[b] = true
			}
		}
		byToken := slices.Clone(gs)
		slices.SortStableFunc(byToken, func(x, y *Lease) int { return cmp.Or(cmp.Compare(x.Token, y.Token), byCall(x, y)) })
		// Grants sharing a token: each after the first is flagged, unless it and
		// every earlier one of them are readers whose acquires overlapped.
		for i := 0; i < len(byToken); {
			j := i + 1
			for j < len(byToken) && byToken[j].Token == byToken[i].Token {
				j++
			}
			for _, b := range byToken[i+1 : j] {
				for _, a := range byToken[i:j] {
					if a == b {
						break
					}
					if !flagged[b] && !(rw && overlappingReaders(a, b)) {
						flags = append(flags, flag{b: b, a: a, dup: true})
						flagged[b] = true
					}
				}
			}
			i = j
		}
	}
	slices.SortStableFunc(flags, func(x, y flag) int { return cmp.Compare(x.b.Acquire.End, y.b.Acquire.End) })
	for _, f := range flags {
		v := Violation{
			Check: CheckP4, Key: f.b.Key, Time: f.b.Acquire.End,
			Processes: []int{f.b.Process, f.a.Process},
			Leases:    []int{f.b.Lease, f.a.Lease},
			Tokens:    []uint64{f.b.Token, f.a.Token},
		}
		if f.dup {
			v.Detail = fmt.Sprintf("Key %s was granted with the same token %d to %s between %s and %s and to %s between %s and %s.",
				f.b.Key, f.b.Token, who(f.a), c.ms(f.a.Attempt()), c.ms(f.a.Acquire.End), who(f.b), c.ms(f.b.Attempt()), c.ms(f.b.Acquire.End))
		} else {
			v.Detail = fmt.Sprintf("Key %s was granted to %s between %s and %s, after %s had been granted it by %s: the later grant has the smaller or equal token.",
				f.b.Key, who(f.b), c.ms(f.b.Attempt()), c.ms(f.b.Acquire.End), who(f.a), c.ms(f.a.Acquire.End))
		}
		p.add(c.opts.MaxExamples, v)
	}

	if rw {
		c.note("P4: porcupine was not run on read-write locks (its register orders every pair); the sweep checks readers against writers and writers against all")
		p.Porcupine = VerdictSkipped
		return
	}
	if c.opts.PorcupineTimeout < 0 {
		p.Porcupine = VerdictSkipped
		return
	}
	parts, partOf := tokenPartitions(c.keys, grantsByKey)
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(tokenModel(parts), concat(parts), c.opts.PorcupineTimeout)
	p.PorcupineTime = time.Since(start)
	switch res {
	case porcupine.Ok:
		p.Porcupine = VerdictOK
	case porcupine.Illegal:
		p.Porcupine = VerdictViolation
	default:
		p.Porcupine = VerdictTimeout
		c.note("P4: porcupine gave no verdict within %v; the sweep's count stands alone", c.opts.PorcupineTimeout)
	}
	if (p.Porcupine == VerdictOK && p.Count > 0) || (p.Porcupine == VerdictViolation && p.Count == 0) {
		c.note("P4: porcupine (%s) and the sweep (%d violations) disagree: this is a checker bug", p.Porcupine, p.Count)
	}
	if p.Porcupine == VerdictViolation && c.opts.PorcupineHTML != "" {
		// Show only the partitions with the first offending grants.
		var bad [][]porcupine.Operation
		seen := map[int]bool{}
		for _, f := range flags {
			if i := partOf[f.b]; !seen[i] && len(bad) < c.opts.MaxExamples {
				seen[i] = true
				bad = append(bad, parts[i])
			}
		}
		if len(bad) == 0 {
			bad = parts
		}
		m := tokenModel(bad)
		_, info := porcupine.CheckOperationsVerbose(m, concat(bad), c.opts.PorcupineTimeout)
		if err := porcupine.VisualizePath(m, info, c.opts.PorcupineHTML); err != nil {
			c.note("P4: writing porcupine's visualization: %v", err)
		} else {
			p.PorcupineHTML = c.opts.PorcupineHTML
		}
	}
}

// overlappingReaders reports whether two shared grants' acquires overlapped in time
// (neither ended before the other began): such readers may share a token (Redlock's
// readers draw theirs together, see driver.Grant), since neither is earlier.
func overlappingReaders(a, b *Lease) bool {
	return a.Acquire.Shared && b.Acquire.Shared && a.Attempt() <= b.Acquire.End && b.Attempt() <= a.Acquire.End
}

func byCall(x, y *Lease) int {
	return cmp.Or(cmp.Compare(x.Attempt(), y.Attempt()), cmp.Compare(x.Acquire.End, y.Acquire.End),
		cmp.Compare(x.Process, y.Process), cmp.Compare(x.Lease, y.Lease))
}

// partSize is roughly how many grants one porcupine partition holds: its search
// keeps a bitset of the partition per visited state, so partitions stay small.
const partSize = 1000

// tokenPartitions splits each key's grants into porcupine partitions. A key's
// grants split into independent pieces at every quiescent moment (every grant
// before it ended before every grant after it began): in the model the state
// after a legal piece is its largest token, so a piece that starts a partition
// gets a first "floor" operation, before all of its grants, whose token is the
// largest of the key's earlier grants. Pieces are packed into partitions of
// about partSize grants. partOf maps each grant to its partition.
func tokenPartitions(keys []string, grants map[string][]*Lease) (parts [][]porcupine.Operation, partOf map[*Lease]int) {
	partOf = map[*Lease]int{}
	for _, k := range keys {
		gs := slices.Clone(grants[k])
		if len(gs) == 0 {
			continue
		}
		slices.SortStableFunc(gs, byCall)
		var cur []porcupine.Operation
		var floor uint64
		maxRet := int64(0)
		for i, g := range gs {
			quiet := i == 0 || g.Attempt() > maxRet
			if quiet && len(cur) >= partSize {
				parts = append(parts, cur)
				cur = nil
			}
			if cur == nil && floor > 0 {
				cur = append(cur, porcupine.Operation{
					Input: "floor", Call: g.Attempt() - 1, Return: g.Attempt() - 1, Output: floor,
				})
			}
			cur = append(cur, porcupine.Operation{
				ClientId: max(g.Process-1, 0),
				Input:    fmt.Sprintf("w%d l%d", g.Process, g.Lease),
				Call:     g.Attempt(), Return: g.Acquire.End, Output: g.Token,
			})
			partOf[g] = len(parts)
			floor = max(floor, g.Token)
			maxRet = max(maxRet, g.Acquire.End)
		}
		parts = append(parts, cur)
	}
	return parts, partOf
}

func concat(parts [][]porcupine.Operation) []porcupine.Operation {
	var out []porcupine.Operation
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// tokenModel is the per-key model: the state is the largest token granted so
// far, and a grant is legal when its token is larger.
func tokenModel(parts [][]porcupine.Operation) porcupine.Model {
	return porcupine.Model{
		Partition: func([]porcupine.Operation) [][]porcupine.Operation { return parts },
		Init:      func() any { return uint64(0) },
		Step: func(state, _, output any) (bool, any) {
			if t := output.(uint64); t > state.(uint64) {
				return true, t
			}
			return false, state
		},
		Hash:              func(state any) uint64 { return state.(uint64) },
		DescribeOperation: func(in, out any) string { return fmt.Sprintf("%v: token %d", in, out) },
		DescribeState:     func(state any) string { return fmt.Sprintf("max token %d", state) },
	}
}
