// Package clock is the time source of the dlock core: the real monotonic clock, and a
// fake one that tests (and the fault checker) move by hand.
//
// The core measures lease validity only with differences of Now values, which for
// the real clock use Go's monotonic reading: a wall-clock step (NTP, an operator)
// does not shorten or lengthen a lease. A fake clock can be made to jump, to show
// what happens when the local rate of time is wrong.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells time and makes timers. Implementations are safe for concurrent use.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that sends on its channel after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc returns a timer that calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer, like *time.Timer.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it was pending.
	Stop() bool
	// Reset makes the timer fire after d; it reports whether it was pending.
	Reset(d time.Duration) bool
}

// Real is the system clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

// Fake is a manually driven clock. Its time moves only with Advance or Set; timers
// whose deadline is reached fire (a non-blocking send on a buffered channel, as with
// time.Timer). The zero value is not usable; call NewFake.
type Fake struct {
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	timers map[*fakeTimer]struct{}
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	f := &Fake{now: start, timers: make(map[*fakeTimer]struct{})}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// AfterFunc returns a timer that calls f in its own goroutine when the fake time
// reaches now+d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), fn: fn}
	t.Reset(d)
	return t
}

// Advance moves time forward by d and fires the timers that are due, in deadline
// order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.setLocked(f.now.Add(d))
	f.mu.Unlock()
}

// Set moves time to t, forward or backward (a jump), and fires the timers that are
// due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.setLocked(t)
	f.mu.Unlock()
}

func (f *Fake) setLocked(t time.Time) {
	f.now = t
	var due []*fakeTimer
	for tm := range f.timers {
		if !tm.when.After(t) {
			due = append(due, tm)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	for _, tm := range due {
		delete(f.timers, tm)
		tm.fire(t)
	}
	f.cond.Broadcast()
}

// Pending returns the number of timers that have not fired or been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// BlockUntil waits until at least n timers are pending. Tests use it to know that a
// goroutine has gone to sleep on the clock before they advance it.
func (f *Fake) BlockUntil(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.timers) < n {
		f.cond.Wait()
	}
}

type fakeTimer struct {
	f    *Fake
	c    chan time.Time
	fn   func()
	when time.Time
}

func (t *fakeTimer) fire(now time.Time) {
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.c <- now:
	default:
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, pending := t.f.timers[t]
	delete(t.f.timers, t)
	drain(t.c)
	t.f.cond.Broadcast()
	return pending
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	_, pending := f.timers[t]
	drain(t.c)
	t.when = f.now.Add(d)
	if d <= 0 {
		delete(f.timers, t)
		t.fire(f.now)
	} else {
		f.timers[t] = struct{}{}
	}
	f.cond.Broadcast()
	return pending
}

// drain empties a timer channel so that Stop and Reset leave no stale value behind,
// as time.Timer does since Go 1.23.
func drain(c chan time.Time) {
	select {
	case <-c:
	default:
	}
}
