// Package recent remembers which keys had an event lately: a backend marks a key
// when its client hands the key to a waiter, or finds it held, and asks within a
// short window whether the key is contended, so that its next waiting attempt can
// skip a step that would most likely be refused. It is a hint only: a wrong answer
// costs a round trip, never safety. Keys is exact and grows with the keys marked
// (swept now and then); Slots is approximate, in fixed space, without a lock.
package recent

import (
	"sync"
	"time"
)

// sweepEvery is how many windows pass between sweeps of the entries that lapsed,
// so that a long-lived client that marks ever new keys keeps only those of about
// the last sweepEvery windows.
const sweepEvery = 50

// Keys is a set of keys each marked at a time, answering whether a key was marked
// less than a window ago. The zero value is not usable: see New. Goroutine-safe.
type Keys struct {
	window time.Duration
	mu     sync.Mutex
	at     map[string]time.Time
	swept  time.Time
}

// New returns an empty set whose marks last window.
func New(window time.Duration) *Keys {
	return &Keys{window: window, at: make(map[string]time.Time)}
}

// Mark records that key had its event at now, and drops the marks that lapsed
// if the last sweep was more than sweepEvery windows before now.
func (k *Keys) Mark(key string, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at[key] = now
	if now.Sub(k.swept) < sweepEvery*k.window {
		return
	}
	k.swept = now
	for key, t := range k.at {
		if now.Sub(t) >= k.window {
			delete(k.at, key)
		}
	}
}

// Forget drops key's mark.
func (k *Keys) Forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.at, key)
}

// Within reports whether key was marked less than the window before now.
func (k *Keys) Within(key string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	t, ok := k.at[key]
	return ok && now.Sub(t) < k.window
}

// Len returns the number of marks kept, lapsed or not (for tests).
func (k *Keys) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.at)
}
