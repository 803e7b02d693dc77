// Package callers runs a backend's blocking client calls on goroutines kept
// between calls. A call that must return early when its context ends runs on a
// goroutine of its own while the caller waits for it or for the context; a new
// goroutine per call starts with a small stack, which grew through the client
// library's whole call path on every call (runtime.newstack was 23% of Redlock's
// client CPU in an uncontended cycle, 6.6% of ZooKeeper's on a hot key). A kept
// goroutine's stack has grown already.
package callers

import (
	"sync"
	"time"
)

// Idle is how long a kept goroutine waits for another call before it ends.
const Idle = 2 * time.Second

// Pool hands calls to kept goroutines. The zero value is not usable: see New.
// Goroutine-safe.
type Pool struct {
	calls   chan func()
	closing chan struct{}

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// New returns a pool with no goroutines yet.
func New() *Pool {
	return &Pool{calls: make(chan func()), closing: make(chan struct{})}
}

// Go runs f on a kept goroutine: an idle one if there is one, else a new one that
// then waits up to Idle for more calls. After Close, f runs on a goroutine of its
// own, which Close does not wait for.
func (p *Pool) Go(f func()) {
	select {
	case p.calls <- f:
		return
	default:
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if closed {
		go f()
		return
	}
	go p.keep(f)
}

// keep runs f, then the calls handed to it, until it has waited Idle for one or
// the pool closes.
func (p *Pool) keep(f func()) {
	defer p.wg.Done()
	idle := time.NewTimer(Idle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(Idle)
		select {
		case f = <-p.calls:
		case <-idle.C:
			return
		case <-p.closing:
			return
		}
	}
}

// Close ends the idle goroutines and waits for them, and for those still running
// a call: the calls must end by themselves (close the client they block on first).
// Close may be called more than once.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.closing)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
