package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// semFree frees owner's permit of key (release) or every permit (force, owner
// ""), or withdraws owner's place (withdraw), and wakes the places the key's
// permits then admit. It returns ErrNotHeld when no live permit was freed.
// A withdrawal by a waiter that gives up, whose place (of nonce) a mutex's
// handoff gave the key that a reader has made a writer's permit since, frees
// that permit too (as the mutex path hands on a grant handed to such a place).
func (b *Backend) semFree(ctx context.Context, key, owner string, withdraw bool, nonce string) error {
	if b.semErr != nil {
		return driver.ErrNotHeld
	}
	var wake []semPlace
	var held bool
	err := b.semTx(ctx, func(tx *sql.Tx) error {
		wake, held = nil, false
		s, err := b.readState(ctx, tx, key, owner)
		if err != nil {
			return err
		}
		if !s.row.state() {
			if withdraw && s.mine != nil {
				// The key is a mutex's again: its place goes all the same.
				_, err = b.txExec(ctx, tx, b.q.withdraw, key, owner)
			}
			return err
		}
		var res sql.Result
		live := len(s.permits) > 0 // before a force release clears them
		switch {
		case withdraw:
			if s.mine == nil {
				return nil
			}
			res, err = b.txExec(ctx, tx, b.q.withdraw, key, owner)
			s.places = removePlace(s.places, owner)
			if err == nil && nonce != "" && s.mine.id == s.row.handed && string(s.mine.nonce) == nonce {
				for _, p := range s.permits {
					if p.owner == owner && !p.shared {
						_, err = b.txExec(ctx, tx, b.sq.release, key, owner)
						s.permits = removePermit(s.permits, owner)
						break
					}
				}
			}
		case owner == "":
			res, err = b.txExec(ctx, tx, b.sq.clearPermits, key)
			s.permits = nil
		default:
			res, err = b.txExec(ctx, tx, b.sq.release, key, owner)
			s.permits = removePermit(s.permits, owner)
		}
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		// A force release frees the live permits; the rows it deletes may
		// be only expired ones.
		held = n > 0 && (owner != "" || live)
		if len(s.permits) == 0 && len(s.places) == 0 {
			// No holder, no waiter: the row is a released mutex's again.
			if _, err := b.txExec(ctx, tx, b.sq.reset, key); err != nil {
				return err
			}
			_, err = b.txExec(ctx, tx, b.sq.clearPermits, key)
			return err
		}
		wake = notPending(s.wakeSet())
		return b.bump(ctx, tx, wake)
	})
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	b.wakePlaces(ctx, wake)
	if !held && !withdraw {
		return driver.ErrNotHeld
	}
	return nil
}

func removePlace(ps []semPlace, owner string) []semPlace {
	out := ps[:0:0]
	for _, p := range ps {
		if p.owner != owner {
			out = append(out, p)
		}
	}
	return out
}

func removePermit(ps []semPermit, owner string) []semPermit {
	out := ps[:0:0]
	for _, p := range ps {
		if p.owner != owner {
			out = append(out, p)
		}
	}
	return out
}

// notPending leaves out the places already woken whose waiters have not
// attempted since: they will (their listener delivers the wake-up once).
func notPending(ps []semPlace) []semPlace {
	out := ps[:0:0]
	for _, p := range ps {
		if !p.pending {
			out = append(out, p)
		}
	}
	return out
}

// bump adds one to the woken counter of the places (in the transaction).
func (b *Backend) bump(ctx context.Context, tx *sql.Tx, ps []semPlace) error {
	if len(ps) == 0 {
		return nil
	}
	args := make([]any, len(ps))
	for i, p := range ps {
		args[i] = p.id
	}
	_, err := tx.ExecContext(ctx, b.sq.woke+"("+strings.TrimSuffix(strings.Repeat("?, ", len(ps)), ", ")+")", args...)
	return err
}

// wakePlaces ends the waits of the listening connections of the places (after
// the commit that bumped their woken counters).
func (b *Backend) wakePlaces(ctx context.Context, ps []semPlace) {
	seen := map[uint64]bool{}
	for _, p := range ps {
		if p.conn != 0 && !seen[p.conn] {
			seen[p.conn] = true
			b.wake(ctx, p.conn)
		}
	}
}

// semRelease frees owner's permit of key: in one statement when no place is
// queued (quickRelease), otherwise under the key's row lock (semFree).
func (b *Backend) semRelease(ctx context.Context, key, owner string) error {
	if b.semErr == nil {
		res, err := b.exec(ctx, b.sq.quickRelease, key, owner, key)
		if err != nil {
			return b.ctxErr(ctx, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return b.ctxErr(ctx, err)
		} else if n > 0 {
			return nil
		}
	}
	return b.semFree(ctx, key, owner, false, "")
}

// semRefresh extends owner's permit of key, and its state row's expiry, in one
// statement.
func (b *Backend) semRefresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.semErr != nil {
		return driver.ErrNotHeld
	}
	return b.semUpdate(ctx, key, owner, b.sq.refresh, micros(ttl), micros(ttl), key, owner)
}

// semUpdate runs an UPDATE of owner's live permit of key and returns nil if it
// changed a row or the permit is live anyway, ErrNotHeld otherwise.
func (b *Backend) semUpdate(ctx context.Context, key, owner, stmt string, args ...any) error {
	res, err := b.exec(ctx, stmt, args...)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n > 0 {
		return nil
	}
	var tok uint64
	err = b.queryRow(ctx, b.sq.owned, key, owner).Scan(&tok)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.ErrNotHeld
	}
	return b.ctxErr(ctx, err)
}

// semSetValue replaces the value of owner's permit of key.
func (b *Backend) semSetValue(ctx context.Context, key, owner string, v []byte) error {
	if b.semErr != nil {
		return driver.ErrNotHeld
	}
	return b.semUpdate(ctx, key, owner, b.sq.setValue, value(v), key, owner)
}

// Shares implements driver.Sharer: read-write locks work when the permit table
// does.
func (b *Backend) Shares() bool { return b.semErr == nil }
