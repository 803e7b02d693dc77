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

// grant is what this client remembers of a grant it made: the token, for counter
// repair, and the value and kind (a reader's or not), to restore the grant on a
// node that lost it.
type grant struct {
	token  uint64
	value  []byte
	shared bool
}

// remember records a grant made here.
func (b *Backend) remember(key, owner string, token uint64, value []byte, shared bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.grants) >= maxFenceCache {
		clear(b.grants) // only used to repair nodes; leases lost unnoticed leave entries
	}
	b.grants[driver.Holder{Key: key, Owner: owner}] = grant{token, value, shared}
}

// grantOf returns the owner's grant made here, or a zero grant.
func (b *Backend) grantOf(key, owner string) grant {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.grants[driver.Holder{Key: key, Owner: owner}]
}

// setValue records the new value of the owner's grant made here, if there is one.
func (b *Backend) setValue(key, owner string, value []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := driver.Holder{Key: key, Owner: owner}
	if g, ok := b.grants[h]; ok {
		g.value = value
		b.grants[h] = g
	}
}

func (b *Backend) forget(key, owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.grants, driver.Holder{Key: key, Owner: owner})
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

// alsoYieldTo adds a woken waiter to the key's yielding (see yieldTo), for a
// release's late reply.
func (b *Backend) alsoYieldTo(key, woken string, d time.Duration) {
	b.mu.Lock()
	y, ok := b.yield[key]
	b.mu.Unlock()
	switch {
	case ok && slices.Contains(y.to, woken):
	case ok && time.Now().Before(y.until):
		b.yieldTo(key, append(slices.Clip(y.to), woken), time.Until(y.until))
	default:
		b.yieldTo(key, []string{woken}, d)
	}
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
