package redlock

import "github.com/dlockio/dlock/driver"

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
