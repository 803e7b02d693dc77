package dlock

import (
	"errors"

	"github.com/dlockio/dlock/driver"
)

// Errors returned by the package; compare with errors.Is. Errors from a cancelled or
// expired context also match ctx.Err().
var (
	// ErrLocked: the key is held by another owner, or by this owner id through
	// another Client or process (TryLock, or Lock whose ctx ended while waiting,
	// whether between attempts or during one).
	ErrLocked = driver.ErrLocked
	// ErrNotHeld: the caller does not hold the key on the server.
	ErrNotHeld = driver.ErrNotHeld
	// ErrInvalid: bad input (key, owner id, URL, option value).
	ErrInvalid = driver.ErrInvalid
	// ErrUnsupported: the backend lacks an optional capability.
	ErrUnsupported = driver.ErrUnsupported
	// ErrClosed: the client was closed.
	ErrClosed = driver.ErrClosed
	// ErrAuth: the backend refused the credentials or denied the permission a lock
	// needs (Open, or any later call). Waiting does not fix it.
	ErrAuth = driver.ErrAuth
	// ErrValidityTooShort: the backend granted the key only after the lease's local
	// validity (TTL minus the drift allowance, counted from when the attempt was
	// sent) had already passed, so the grant could not be used: twice in a row
	// (after a late grant a generated owner id asks again at once, and a waiting
	// Lock of a stable one waits until its unusable grant expires), or once for a
	// TryLock of a stable owner id (which cannot ask again safely: by then the grant
	// may be another process's of that owner id). The TTL is too short for the time
	// a request takes (or a Bounder's session was about to end). No one else holds
	// the key because of it; a grant of a generated owner id is given back, one of a
	// stable owner id expires after its TTL.
	ErrValidityTooShort = errors.New("dlock: lease validity too short: granted only after it had passed")
	// ErrLeaseLost is the cause of a lease context cancelled because the lock may
	// no longer be held: a renewal was refused, or the local validity deadline
	// passed without a successful renewal.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrLimitMismatch: a lock call asked for a key with another holder limit
	// (WithLimit) than the key has while it is held or waited for, or took a
	// semaphore's key shared (WithShared). It matches ErrInvalid too.
	ErrLimitMismatch = driver.ErrLimitMismatch
	// ErrNoLeader: Client.Leader found no one leading the election.
	ErrNoLeader = errors.New("dlock: no leader")
	// ErrReleased is the cause of a lease context cancelled because the lease was
	// released (by Release, or by Client.Close).
	ErrReleased = errors.New("dlock: lease released")
)
