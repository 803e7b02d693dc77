package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/dlockio/dlock/driver"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll implements driver.MultiAcquirer: one transaction runs the acquire
// statement of every key, in the ascending order the core passes them (so that two
// sets never wait on each other's rows in opposite orders), and commits only if
// every key was granted; the first refused key rolls the whole transaction back,
// tokens included. A transaction InnoDB chose as a deadlock's victim was rolled
// back whole and is run again.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	for i := 0; ; i++ {
		gs, err := b.acquireAll(ctx, reqs)
		if err == nil || i == 8 || !retryable(err) || ctx.Err() != nil {
			return gs, err
		}
	}
}

func (b *Backend) acquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	gs := make([]driver.Grant, len(reqs))
	var refused string // the first key refused
	err := b.tx(ctx, func(tx *sql.Tx) error {
		for i, req := range reqs {
			res, err := tx.ExecContext(ctx, b.q.acquire, acquireArgs(req, b.placeNonce(req.Key, req.Owner), false)...)
			var n, tok int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			if err == nil && (n == 1 || n == 2) {
				tok, err = res.LastInsertId()
			}
			if err == nil && n != 1 && n != 2 && b.semErr == nil {
				// A free state row (a semaphore's or a read-write key's whose
				// holders and places are gone) is free to a mutex, as Acquire finds.
				if tok, err = b.takeFreeState(ctx, tx, req); tok != 0 {
					n = 1
				}
			}
			if err != nil {
				return err
			}
			if n != 1 && n != 2 {
				refused = req.Key
				return errRefused
			}
			gs[i] = driver.Grant{Token: uint64(tok)}
		}
		return nil
	})
	switch {
	case err == nil:
		return gs, nil
	case refused != "":
		return nil, fmt.Errorf("mysqllock: %q: %w", refused, b.held(ctx, refused))
	case retryable(err):
		return nil, err // run again by AcquireAll
	}
	// The outcome of a failed commit is unknown: the core releases every key
	// with the owner.
	return nil, b.ctxErr(ctx, fmt.Errorf("acquire %q and %d more: %w", reqs[0].Key, len(reqs)-1, err))
}

// errRefused rolls back an AcquireAll whose key was refused.
var errRefused = errors.New("mysqllock: refused")

// takeFreeState grants req a mutex's grant of its key, in tx, when the key's row
// is a state row with no live permit and no live place (locking reads: the
// transaction's snapshot may be older than this key's row lock). It returns the
// token, or 0 when the row is not such a row.
func (b *Backend) takeFreeState(ctx context.Context, tx *sql.Tx, req driver.Request) (int64, error) {
	var owner string
	var lim []byte
	var tok, handed uint64
	var live bool
	err := tx.QueryRowContext(ctx, b.sq.lockRow, req.Key).Scan(&owner, &lim, &tok, &live, &handed)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && owner != stateOwner) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var k []byte
	err = tx.QueryRowContext(ctx, b.sq.takenLocked, req.Key, req.Key, handed).Scan(&k)
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, err // taken (nil), or the error
	}
	res, err := tx.ExecContext(ctx, b.sq.mutexGrant, req.Owner, value(req.Value), micros(req.TTL), req.Key)
	if err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, b.sq.clearPermits, req.Key); err != nil {
		return 0, err
	}
	return res.LastInsertId()
}
