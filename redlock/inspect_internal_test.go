package redlock

import (
	"errors"
	"testing"
)

// A writer's token in Inspect is the one a majority of nodes carries, as its Lock
// took it, not the largest any node reports (a node outside that majority may have
// drawn another in a handoff); while no token has a majority (a grant's commit on
// its way, token 0 on its other nodes) Inspect says so rather than report one.
func TestHolderToken(t *testing.T) {
	b := &Backend{nodes: make([]*node, 5), quorum: 3}
	views := func(toks ...uint64) []view {
		vs := make([]view, len(toks))
		for i, tok := range toks {
			vs[i] = view{owner: "o", tok: tok, pttl: 1000}
		}
		return vs
	}
	for _, c := range []struct {
		toks []uint64
		want uint64 // 0: a QuorumError
	}{
		{[]uint64{7, 7, 7, 7, 7}, 7},
		{[]uint64{7, 7, 7, 8, 8}, 7},
		{[]uint64{8, 7, 7, 7}, 7},
		{[]uint64{7, 7, 7}, 7},
		{[]uint64{0, 0, 7}, 0},
		{[]uint64{0, 0, 0, 7, 7}, 0},
		{[]uint64{7, 8, 9}, 0},
	} {
		info, err := b.holderInfo("inspect", "k", "o", views(c.toks...), 0, false, make([]error, 5))
		var qe *QuorumError
		switch {
		case c.want == 0 && !errors.As(err, &qe):
			t.Errorf("tokens %v: %+v, %v; want a QuorumError", c.toks, info, err)
		case c.want != 0 && (err != nil || info.Token != c.want):
			t.Errorf("tokens %v: token %d, %v; want %d", c.toks, info.Token, err, c.want)
		}
	}
	// A reader's token stays the largest its nodes report.
	info, err := b.holderInfo("inspect", "k", "o", views(7, 7, 8), 0, true, make([]error, 5))
	if err != nil || info.Token != 8 {
		t.Fatalf("reader: token %d, %v; want 8", info.Token, err)
	}
}
