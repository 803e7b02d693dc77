package redlock

import (
	"context"

	"github.com/dlockio/dlock/driver"
)

// HandedCopies returns how many nodes' copies of a handoff the wait of owner on key
// has recorded (see handoff.go).
func (b *Backend) HandedCopies(key, owner string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil {
		return len(w.handed)
	}
	return 0
}

// Subscribed reports whether every node confirmed the client's wake-up subscription.
func (b *Backend) Subscribed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.nodes {
		if !n.psUp {
			return false
		}
	}
	return true
}

// WaitMark returns the HANDED mark of the wait of owner on key ("" if none).
func (b *Backend) WaitMark(key, owner string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil {
		return w.mark()
	}
	return ""
}

// WithdrawAs withdraws owner's place on key from every node as the wait of the
// given mark does (see withdraw).
func (b *Backend) WithdrawAs(ctx context.Context, key, owner, mark string) error {
	_, err := b.withdraw(ctx, key, owner, b.all(), mark, false)
	return err
}
