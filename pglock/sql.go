package pglock

import "strings"

// The lock table holds one row per key that is held, reserved for a waiter, or that
// has waiters; a key nobody holds or waits for has no row. Each waiter's place in
// the queue is a row of its own, named after the key (see placeRange):
//
//	key || chr(2) || <20-digit place number>
//
// No dlock key contains a control character, so place rows never meet a key's own
// row, and the primary key index keeps a key's places together, in line order.
//
// The key's row:
//
//	owner, token, expires_at  the holder, its fencing token and its expiry (server
//	                          clock); or, when reserved, the queued waiter the free
//	                          lock is handed to and how long it has to take it
//	reserved                  the lock is free but kept for owner, the longest waiter
//	queue_owner               '{}' when no place was queued since the last handoff
//	                          that found none; '{+}' when places may exist
//	queue_channel             when reserved: the LISTEN channel of owner's client;
//	                          for a grant a handoff made directly and not yet
//	                          claimed: {that channel, the place it was handed to}
//	value                     the holder's value (driver.Valuer), NULL for none; set
//	                          by the statement that grants, cleared by a handoff
//
// A semaphore's key (Request.Limit > 1) has a state row instead: owner '#', token
// the limit, expires_at the latest expiry of its permits (held or reserved), which
// are rows of the permit table (semaphore.go); reserved, value and queue_channel
// unused, queue_owner set to '{+}' by every attempt that adds a place (a new row
// version, so that a mutex's compare-and-set on the row fails).
//
// A place row: owner is the waiter, token its patience in µs (how long a
// reservation made for it lasts), expires_at when the place lapses unless the
// waiter's client is alive, queue_channel its client's LISTEN channel (then the
// request's TTL in µs and the attempt's number, for a direct handoff), reserved
// true for a reader's place (read-write keys, see sem_acquire.sql). A client
// holds a session-level advisory lock on its listening connection (placeLock), so a
// place whose client still listens is live whatever its expiry: a queued waiter's
// attempts need not renew it (they only read), and a handoff costs the same however
// many wait. A place whose client is gone lapses at its expiry, or at once if the
// expiry is past.
//
// A statement that adds a place locks the key's row (FOR UPDATE) and marks it
// (queue_owner) unless it is marked already (enqueue.sql adds places only then),
// so the plain DELETE of an uncontended release, which re-checks the row it
// waited for, sees that someone queued. A handoff (release, withdrawal)
// locks the key's row in a first statement and decides in a second, in the same
// transaction: under READ COMMITTED the second statement's snapshot then holds
// every place added before the lock. An attempt that will not wait reads without a
// lock and writes only if the row is still the version it read (xmin unchanged), a
// compare-and-set; an attempt that finds the row changed reports it and runs again.
// Refresh changes only the expiry of a row the caller holds, and needs neither.
//
// The statements themselves are in sql/*.sql (see sqlfiles.go).
type statements struct {
	stamp, restamp, fastAcquire, fastAcquireValue, acquireWait, acquireTry, enqueue, refresh, fastRelease, lockRow, lockMutexRow, release, forceRelease, withdrawPlace, withdrawOwner, withdraw, inspect, setValue string

	// AcquireAll (several keys at once): see acquire_all.go.
	lockRows, acquireAll, acquireAllMutex, stampAll string

	// Semaphores (Request.Limit > 1): see semaphore.go.
	semLock, semAcquire, semRefresh, semRelease, semForceRelease, semWithdraw, semWake, semSetValue, holders, queue string

	// Readers' fast grant and release (read-write keys): see read_acquire.sql.
	readLock, readAcquire, readRelease, readLast, readWake string

	list, listMutex string // List: see list.go
}

// literal quotes s as an SQL string literal. Table names are validated identifiers,
// so this is belt and braces.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
