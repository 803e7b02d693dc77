package dlock

import (
	"errors"

	"github.com/dlockio/dlock/driver"
)

// Errors returned by the package; compare with errors.Is. Errors from a cancelled or
// expired context also match ctx.Err().
var (
	// ErrLocked: the key is held by another owner (TryLock, or Lock whose ctx ended
	// while waiting).
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
	// ErrLeaseLost is the cause of a lease context cancelled because the lock may
	// no longer be held: a renewal was refused, or the local validity deadline
	// passed without a successful renewal.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrReleased is the cause of a lease context cancelled because the lease was
	// released (by Release, or by Client.Close).
	ErrReleased = errors.New("dlock: lease released")
)
