package dlock

import (
	"container/heap"
	"sync"
	"time"

	"github.com/dlockio/dlock/clock"
)

// renewer runs the renewal ticks of a client's grants on one clock timer, armed for
// the earliest of them: a grant costs an entry in a heap, not a timer of its own.
// On the real clock the timer is left set when the last grant goes (firing early
// finds nothing due), so a lock held for less than the renew interval costs no timer
// operation at all. Each due tick runs on its own goroutine, so a slow refresh delays
// no other grant.
type renewer struct {
	clk  clock.Clock
	base time.Time // times are kept as nanoseconds since base
	lazy bool      // leave the timer set when the heap empties (the real clock)

	mu    sync.Mutex
	timer clock.Timer // made on first use
	armed bool        // timer is set to fire at at
	at    int64
	due   dueHeap // by grant.next; grant.hidx is the index
}

// schedule sets g's tick for at; now is the clock's time.
// (Here and in cancel, which run once per lock, the mutex is unlocked without
// defer: nothing between can panic, and a deferred unlock costs a call more.)
func (r *renewer) schedule(g *grant, at, now time.Time) {
	r.mu.Lock()
	g.next = int64(at.Sub(r.base))
	if g.hidx < 0 {
		heap.Push(&r.due, g)
	} else {
		heap.Fix(&r.due, g.hidx)
	}
	r.armLocked(now)
	r.mu.Unlock()
}

// cancel removes g's tick, if it is scheduled.
func (r *renewer) cancel(g *grant) {
	r.mu.Lock()
	if g.hidx >= 0 {
		heap.Remove(&r.due, g.hidx)
		if len(r.due) == 0 && r.armed && !r.lazy {
			r.timer.Stop()
			r.armed = false
		}
	}
	r.mu.Unlock()
}

// stop stops the timer, for Close.
func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed {
		r.timer.Stop()
		r.armed = false
	}
}

// armLocked sets the timer for the earliest tick, unless it is set for that or
// earlier already (an early firing just finds nothing due and sets it again).
func (r *renewer) armLocked(now time.Time) {
	if len(r.due) == 0 {
		return
	}
	first := r.due[0].next
	if r.armed && first >= r.at {
		return
	}
	d := max(time.Duration(first-int64(now.Sub(r.base))), 0)
	if r.timer == nil {
		r.timer = r.clk.AfterFunc(d, r.fire)
	} else {
		r.timer.Reset(d)
	}
	r.armed, r.at = true, first
}

// fire starts the ticks that are due and sets the timer for the next one.
func (r *renewer) fire() {
	r.mu.Lock()
	r.armed = false
	now := r.clk.Now()
	off := int64(now.Sub(r.base))
	var due []*grant
	for len(r.due) > 0 && r.due[0].next <= off {
		due = append(due, heap.Pop(&r.due).(*grant))
	}
	r.armLocked(now)
	r.mu.Unlock()
	for _, g := range due {
		go g.tick()
	}
}

// dueHeap orders grants by their next tick, for container/heap; it keeps each
// grant's index in grant.hidx (-1 when not scheduled).
type dueHeap []*grant

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].next < h[j].next }

func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}

func (h *dueHeap) Push(x any) {
	g := x.(*grant)
	g.hidx = len(*h)
	*h = append(*h, g)
}

func (h *dueHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	g.hidx = -1
	return g
}
