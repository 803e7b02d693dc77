package recent

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	const w = 20 * time.Millisecond
	k := New(w)
	t0 := time.Unix(1000, 0)
	if k.Within("a", t0) {
		t.Fatal("unmarked key within the window")
	}
	k.Mark("a", t0)
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {w - time.Nanosecond, true}, {w, false}, {time.Hour, false}} {
		if got := k.Within("a", t0.Add(c.after)); got != c.want {
			t.Errorf("Within %v after the mark = %v, want %v", c.after, got, c.want)
		}
	}
	if k.Within("b", t0) {
		t.Fatal("another key within the window")
	}
	k.Mark("a", t0.Add(time.Second)) // marked again: the window starts over
	if !k.Within("a", t0.Add(time.Second+w/2)) {
		t.Fatal("a new mark did not restart the window")
	}
	k.Forget("a")
	if k.Within("a", t0.Add(time.Second)) {
		t.Fatal("forgotten key within the window")
	}
}

// Marks of ever new keys do not pile up: each sweep drops the lapsed ones, and
// keeps those still within the window.
func TestSweep(t *testing.T) {
	const w = 20 * time.Millisecond
	k := New(w)
	t0 := time.Unix(1000, 0)
	k.Mark("first", t0) // sweeps (none before): swept = t0
	now := t0
	for i := range 10000 {
		now = t0.Add(time.Duration(i) * time.Millisecond)
		k.Mark(fmt.Sprint(i), now)
	}
	// The last sweep ran at most sweepEvery windows ago: only marks since then
	// and the window before it are left.
	if n, most := k.Len(), int((sweepEvery*w+w)/time.Millisecond)+1; n > most {
		t.Fatalf("%d marks kept, want at most %d", n, most)
	}
	if !k.Within("9999", now) || !k.Within("9990", now) {
		t.Fatal("a sweep dropped marks still within the window")
	}
	if k.Within("first", now) {
		t.Fatal("a lapsed mark is within the window")
	}
}

func TestConcurrent(t *testing.T) {
	k := New(time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				key := fmt.Sprint(g, i%10)
				now := time.Unix(0, int64(i)*int64(time.Millisecond))
				k.Mark(key, now)
				k.Within(key, now)
				if i%3 == 0 {
					k.Forget(key)
				}
			}
		})
	}
	wg.Wait()
}

// A Slots answers like a Keys for a marked key, over its window; keys never marked
// answer no unless they share a marked key's slot.
func TestSlots(t *testing.T) {
	const w = 20 * time.Millisecond
	s := NewSlots(w)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if s.Within(keys[i]) {
			t.Fatalf("%s within the window before any mark", keys[i])
		}
	}
	t0 := time.Now()
	s.mark("a", t0)
	ta := s.slot("a").Load()
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {w - time.Nanosecond, true}, {w, false}, {time.Hour, false}} {
		if got := s.within(ta, t0.Add(c.after)); got != c.want {
			t.Errorf("within %v after the mark = %v, want %v", c.after, got, c.want)
		}
	}
	if !s.Within("a") {
		t.Fatal("a not within the window right after its mark")
	}
	shared := 0
	for _, k := range keys {
		if s.Within(k) {
			if s.slot(k) != s.slot("a") {
				t.Fatalf("%s within the window: marked by nobody", k)
			}
			shared++
		}
	}
	// With 64 slots, about 1000/64 keys share a's.
	if shared > len(keys)/8 {
		t.Fatalf("%d keys of %d answer as marked", shared, len(keys))
	}
	s.mark("a", t0.Add(-w))
	if s.Within("a") {
		t.Fatal("a mark a window old is within the window")
	}
}
