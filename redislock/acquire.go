package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// Acquire implements driver.Backend. A waiting attempt for a registered waiter that
// was handed the key returns that grant without a request (see driver.Waiter). A
// request with Limit > 1 takes a permit of a semaphore, and a shared one a
// reader's grant (sem_acquire.lua; see Semaphores and Read-write locks in the
// package documentation); an exclusive one with Limit 0 or 1 runs the mutex
// script, as before.
//
// A waiting attempt on a key this client has not found held lately is first made
// as a plain one, which costs the server a little less (no queue arguments) and the
// client no bookkeeping: the uncontended Lock costs what TryLock costs. Only if the
// key is held does the same call go on to queue, in a second request.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	ttl := ms(req.TTL)
	keys := b.keys(req.Key)
	var w *waiter
	if req.Wait {
		w = b.waiter(req.Key, req.Owner)
		// With WithReplicas a handed grant is not taken as it is: the waiter's
		// own attempt re-enters it and WAITs for the replicas.
		if w != nil && b.replicas == 0 {
			if g, ok := w.take(ttl); ok {
				return g, nil
			}
		}
		if w != nil && w.queued.Load() || b.hot.Within(req.Key) {
			return b.acquire(ctx, req, keys, ttl, true, w)
		}
	}
	g, err := b.acquire(ctx, req, keys, ttl, false, nil)
	if errors.Is(err, driver.ErrLocked) {
		b.hot.Mark(req.Key)
		if req.Wait {
			return b.acquire(ctx, req, keys, ttl, true, w)
		}
	}
	return g, err
}

// noReenter is acquire.lua's fourth argument for an attempt whose request does
// not say Reenter.
const noReenter = "x"

// acquire runs the acquire script once: a waiting attempt, which queues if the key
// is held, or a plain one. w, if not nil, is the wait's registered waiter.
func (b *Backend) acquire(ctx context.Context, req driver.Request, keys []string, ttl int64, queue bool, w *waiter) (driver.Grant, error) {
	if req.Limit > 1 || req.Shared {
		return b.semAcquire(ctx, req, keys, ttl, queue, w)
	}
	// Arguments are left off the end where they can be (see acquire.lua): an
	// uncontended attempt that says Reenter sends two; one with a value sends all
	// five (and grows the slice).
	valued := len(req.Value) > 0
	args := make([]any, 2, 4)
	args[0], args[1] = req.Owner, b.ttlBox(ttl)
	if queue {
		args = append(args, b.waitArg(req, w))
	} else if !req.Reenter || valued {
		args = append(args, "")
	}
	if !req.Reenter {
		args = append(args, noReenter)
	} else if valued {
		args = append(args, "")
	}
	if valued {
		args = append(args, req.Value)
	}
	cmd, err := b.runScript(ctx, acquireScript, keys, args...)
	return b.acquired(ctx, req, keys, queue, w, cmd, err)
}

// acquired turns the reply of an acquire script into Acquire's result.
func (b *Backend) acquired(ctx context.Context, req driver.Request, keys []string, queue bool, w *waiter, cmd *redis.Cmd, err error) (driver.Grant, error) {
	n, cerr := cmd.Int64()
	if cerr != nil {
		// A mismatch changed nothing, whatever the replicas say.
		if have, ok := limitReply(cmd); ok {
			return driver.Grant{}, limitMismatch(req, have)
		}
	}
	if queue && n < 0 && w != nil {
		w.queued.Store(true)
	}
	if errors.Is(err, ErrNotReplicated) && cerr == nil && n > 0 {
		// Fail closed: give back a grant the replicas may not have.
		if rerr := releaseScript.Run(ctx, b.rdb, keys, req.Owner).Err(); rerr != nil {
			err = driver.Join(err, fmt.Errorf("release after failed replication: %w", rerr))
		}
		return driver.Grant{}, wrap("acquire", req.Key, err)
	}
	if cerr != nil {
		return driver.Grant{}, wrap("acquire", req.Key, cerr)
	}
	if n > 0 {
		return driver.Grant{Token: uint64(n)}, nil
	}
	if n == 0 {
		// Re-entry after the token counter was lost: the grant stands but cannot
		// be fenced against earlier ones; refuse to pretend.
		return driver.Grant{}, wrap("acquire", req.Key, errors.New("token counter missing for a held key"))
	}
	return driver.Grant{}, &driver.HeldError{RetryAfter: time.Duration(-n-1) * time.Millisecond}
}

// waitArg returns acquire.lua's argument for a waiting attempt, "Q PATIENCE SEQ
// CHANNEL", numbering the attempt if the wait has a registered waiter w.
func (b *Backend) waitArg(req driver.Request, w *waiter) []byte {
	flag, seq := byte('-'), uint64(0)
	if w != nil {
		flag, seq = w.attempt()
	}
	arg := make([]byte, 0, 48+len(b.wakeCh))
	arg = append(arg, flag, ' ')
	arg = strconv.AppendInt(arg, ms(req.Patience), 10)
	arg = append(arg, ' ')
	arg = strconv.AppendUint(arg, seq, 10)
	arg = append(arg, ' ')
	return append(arg, b.wakeCh...)
}

type boxedInt struct {
	n int64
	v any
}

// ttlBox returns ms as a script argument, boxed once for the TTL most used.
func (b *Backend) ttlBox(ms int64) any {
	if p := b.ttlArg.Load(); p != nil && p.n == ms {
		return p.v
	}
	b.ttlArg.Store(&boxedInt{ms, ms})
	return ms
}

// hotFor is how long a key found held counts as contended (Backend.hot).
const hotFor = 2 * time.Second
