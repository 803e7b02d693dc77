package redlock

import (
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
)

// A release's record says, node by node, whether the release found the owner
// holding there and freed it (released, or handed on, or woke a waiter): only
// then may a late copy of a handoff from that node be left alone. A node that
// did not hold, or failed, or has not answered yet, is not freed, and freedOn
// waits for every node's answer. Records older than keepReleases go.
func TestReleaseRecord(t *testing.T) {
	b := &Backend{nodes: make([]*node, 5), releases: map[driver.Holder]*releaseRecord{}, closing: make(chan struct{})}
	h := driver.Holder{Key: "k", Owner: "o"}
	rec := b.recordRelease(h)
	rec.answer(0, int64(released), nil)
	rec.answer(1, int64(0), nil) // not held there
	rec.answer(2, "+w", nil)     // handed on
	rec.answer(3, "r", nil)      // woke a waiter
	got := make(chan bool, 1)
	go func() { got <- rec.freedOn(0, b.closing) }()
	select {
	case <-got:
		t.Fatal("freedOn answered before every node did")
	case <-time.After(20 * time.Millisecond):
	}
	rec.answer(4, nil, errors.New("timeout"))
	if !<-got {
		t.Fatal("node 0 released: want freed")
	}
	for i, want := range []bool{true, false, true, true, false} {
		if f := rec.freedOn(i, b.closing); f != want {
			t.Errorf("node %d: freed %v, want %v", i, f, want)
		}
	}
	if b.releases[h] != rec {
		t.Fatal("record not kept")
	}
	rec.at = time.Now().Add(-2 * keepReleases)
	other := driver.Holder{Key: "k", Owner: "p"}
	b.recordRelease(other)
	if _, ok := b.releases[h]; ok || len(b.releaseOrder) != 1 {
		t.Fatalf("an old record kept: %d records, %d in order", len(b.releases), len(b.releaseOrder))
	}
	// A closing backend answers false without waiting.
	pending := b.recordRelease(h)
	close(b.closing)
	if pending.freedOn(0, b.closing) {
		t.Fatal("freed on a node that never answered")
	}
}

// A settling wait is done once every node it had not heard from sends a copy.
func TestSettlingHeard(t *testing.T) {
	s := &settling{rest: map[int]bool{1: true, 3: true}, done: make(chan struct{})}
	s.heard(0) // not waited for
	s.heard(1)
	select {
	case <-s.done:
		t.Fatal("done with node 3 not heard from")
	default:
	}
	s.heard(3)
	s.heard(3) // twice: no second close
	select {
	case <-s.done:
	default:
		t.Fatal("not done after every node was heard from")
	}
}
