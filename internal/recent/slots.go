package recent

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// epoch is the origin of the times Slots keep (monotonic, with time.Now's reading).
var epoch = time.Now()

// slotCount is how many slots a Slots has.
const slotCount = 64

// Slots is a set of marked keys in fixed space, and approximate: a slot per key
// hash holds the time a key of that hash was last marked. A key that shares its
// slot with a key marked lately answers as marked too, so use it only where a
// false yes costs a round trip, never safety; in return it takes no lock and never
// grows, however many keys are marked. The zero value is not usable: see NewSlots.
// Goroutine-safe.
type Slots struct {
	window time.Duration
	seed   maphash.Seed
	slots  [slotCount]atomic.Int64 // nanoseconds since epoch, plus one; 0 for never
}

// NewSlots returns an empty set whose marks last window.
func NewSlots(window time.Duration) *Slots {
	return &Slots{window: window, seed: maphash.MakeSeed()}
}

func (s *Slots) slot(key string) *atomic.Int64 {
	return &s.slots[maphash.String(s.seed, key)%slotCount]
}

// Mark records that key had its event now.
func (s *Slots) Mark(key string) { s.mark(key, time.Now()) }

func (s *Slots) mark(key string, now time.Time) { s.slot(key).Store(int64(now.Sub(epoch)) + 1) }

// Within reports whether key (or a key sharing its slot) was marked less than the
// window ago. It reads the clock only when the slot was ever marked.
func (s *Slots) Within(key string) bool {
	t := s.slot(key).Load()
	return t != 0 && s.within(t, time.Now())
}

func (s *Slots) within(t int64, now time.Time) bool {
	return int64(now.Sub(epoch))+1-t < int64(s.window)
}
