package dlock

import (
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
	heap  []*grant // by grant.next; grant.hidx is the index
}

// schedule sets g's tick for at; now is the clock's time.
func (r *renewer) schedule(g *grant, at, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g.next = int64(at.Sub(r.base))
	if g.hidx < 0 {
		g.hidx = len(r.heap)
		r.heap = append(r.heap, g)
	}
	r.fix(g.hidx)
	r.armLocked(now)
}

// cancel removes g's tick, if it is scheduled.
func (r *renewer) cancel(g *grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := g.hidx
	if i < 0 {
		return
	}
	last := len(r.heap) - 1
	r.swap(i, last)
	r.heap[last] = nil
	r.heap = r.heap[:last]
	g.hidx = -1
	if i < last {
		r.fix(i)
	}
	if len(r.heap) == 0 && r.armed && !r.lazy {
		r.timer.Stop()
		r.armed = false
	}
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
	if len(r.heap) == 0 {
		return
	}
	first := r.heap[0].next
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
	for len(r.heap) > 0 && r.heap[0].next <= off {
		g := r.heap[0]
		last := len(r.heap) - 1
		r.swap(0, last)
		r.heap[last] = nil
		r.heap = r.heap[:last]
		g.hidx = -1
		if last > 0 {
			r.down(0)
		}
		due = append(due, g)
	}
	r.armLocked(now)
	r.mu.Unlock()
	for _, g := range due {
		go g.tick()
	}
}

func (r *renewer) less(i, j int) bool { return r.heap[i].next < r.heap[j].next }

func (r *renewer) swap(i, j int) {
	r.heap[i], r.heap[j] = r.heap[j], r.heap[i]
	r.heap[i].hidx = i
	r.heap[j].hidx = j
}

// fix restores the heap order after the entry at i changed.
func (r *renewer) fix(i int) {
	if !r.down(i) {
		r.up(i)
	}
}

func (r *renewer) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !r.less(i, p) {
			return
		}
		r.swap(i, p)
		i = p
	}
}

func (r *renewer) down(i0 int) bool {
	i, n := i0, len(r.heap)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && r.less(c+1, c) {
			c++
		}
		if !r.less(c, i) {
			break
		}
		r.swap(i, c)
		i = c
	}
	return i > i0
}
