package redlock

import (
	"slices"
	"time"

	"github.com/dlockio/dlock/driver"
)

// The client side of the majority register (see Fencing in the package
// documentation) and of the handoff to a woken waiter.

const (
	// maxFenceCache bounds the per-key maps below; each is only a shortcut, so a
	// full map is cleared (or pruned) rather than grown.
	maxFenceCache = 4096
	// maxYield bounds how long a client's waiting Lock steps back after its release
	// woke a waiter elsewhere.
	maxYield = 50 * time.Millisecond
)

// guess returns the proposal for key: one above the largest counter seen, or 0.
func (b *Backend) guess(key string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.fence[key]; ok {
		return c + 1
	}
	return 0
}

// saw records a counter seen for key.
func (b *Backend) saw(key string, c uint64) {
	if c == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.fence[key]; ok && old >= c {
		return
	}
	if len(b.fence) >= maxFenceCache {
		clear(b.fence) // the cache only saves a round trip
	}
	b.fence[key] = c
}

// remember records the token of a grant made here, for counter repair in Refresh.
func (b *Backend) remember(key, owner string, token uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.tokens) >= maxFenceCache {
		clear(b.tokens) // only used to repair counters; leases lost unnoticed leave entries
	}
	b.tokens[driver.Holder{Key: key, Owner: owner}] = token
}

// tokenOf returns the token of the owner's grant made here, or 0.
func (b *Backend) tokenOf(key, owner string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens[driver.Holder{Key: key, Owner: owner}]
}

func (b *Backend) forget(key, owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.tokens, driver.Holder{Key: key, Owner: owner})
}

// yielding makes this client's waiting Lock calls on a key step back for a moment
// after its release woke a waiter elsewhere, so that the woken waiter is not beaten
// to the key by the releaser's next Lock (a tight Lock/Release loop would otherwise
// keep the key to itself).
type yielding struct {
	until time.Time
	to    []string // the woken waiters, who must not yield
}

func (b *Backend) yieldTo(key string, woken []string, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.yield) >= maxFenceCache {
		now := time.Now()
		for k, y := range b.yield {
			if now.After(y.until) {
				delete(b.yield, k)
			}
		}
	}
	b.yield[key] = yielding{until: time.Now().Add(d), to: woken}
}

// yieldFor returns how long a waiting attempt by owner should step back, or 0.
func (b *Backend) yieldFor(key, owner string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	y, ok := b.yield[key]
	if !ok {
		return 0
	}
	left := time.Until(y.until)
	if left <= 0 {
		delete(b.yield, key)
		return 0
	}
	if slices.Contains(y.to, owner) {
		return 0
	}
	return left
}
