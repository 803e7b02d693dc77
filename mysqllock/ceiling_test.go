package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkHandoffCeiling puts mysqllock's hot key (16 workers, "workers=16") beside
// bare protocols on the same server, in one run: the row polled every 10 ms that
// the row-polling peer of dlock bench is ("polled-row", unfair), and fair handoffs
// with none of dlock's statements, in which 16 workers take one key in turn:
//
//   - kill-ring: the pass is an UPDATE of the key's row (a grant, committed with
//     its redo log flush, its token drawn) and a KILL QUERY of the next worker's
//     listening connection, which waits in GET_LOCK for a name another
//     connection of that worker holds, and then reads its grant, as mysqllock's
//     clients do.
//   - get-lock-chain: the same UPDATE, and then the worker gives back a named
//     lock of its turn, for which the next worker waits in GET_LOCK (a
//     connection per waiter, as GET_LOCK's users have).
//   - "+place": after each pass, the worker also writes its next place, an
//     INSERT into a queue table committed with a redo log flush (MariaDB has no
//     asynchronous commit for one session), as a waiting Lock that queues does.
//
// What the bare rings reach bounds any fair lock built on their wake-up and
// writes; see docs/benchmarks.md.
func BenchmarkHandoffCeiling(b *testing.B) {
	srv := testserver.StartMariaDB(b)
	db := admin(b, srv)
	exec(b, db, `CREATE TABLE ceiling_lease (k VARCHAR(8) PRIMARY KEY, owner INT, token BIGINT) ENGINE=InnoDB`)
	exec(b, db, `INSERT INTO ceiling_lease VALUES ('a', 0, 0)`)
	exec(b, db, `CREATE TABLE ceiling_places (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(8), w INT) ENGINE=InnoDB`)
	exec(b, db, `CREATE TABLE ceiling_row (k VARCHAR(8) PRIMARY KEY) ENGINE=InnoDB`)
	const workers = 16
	b.Run("polled-row", func(b *testing.B) {
		cs := ceilingConns(b, db, workers)
		drivertest.BenchPolled(b, workers, 10*time.Millisecond,
			func(ctx context.Context, w int) (bool, error) {
				res, err := cs[w].ExecContext(ctx, `INSERT IGNORE INTO ceiling_row VALUES ('a')`)
				if err != nil {
					var me *mysql.MySQLError
					if errors.As(err, &me) && me.Number == 1213 { // a deadlock victim tries again
						return false, nil
					}
					return false, err
				}
				n, err := res.RowsAffected()
				return n == 1, err
			},
			func(ctx context.Context, w int) error {
				_, err := cs[w].ExecContext(ctx, `DELETE FROM ceiling_row WHERE k = 'a'`)
				return err
			})
	})
	// grant commits the key's grant to the worker of turn+1, and with place writes
	// worker w's next place.
	grant := func(ctx context.Context, c *sql.Conn, turn int64) error {
		_, err := c.ExecContext(ctx, `UPDATE ceiling_lease SET owner = ?, token = token + 1 WHERE k = 'a'`, int(turn+1)%workers)
		return err
	}
	writePlace := func(ctx context.Context, c *sql.Conn, w int) error {
		_, err := c.ExecContext(ctx, `INSERT INTO ceiling_places (k, w) VALUES ('a', ?)`, w)
		return err
	}
	// granted reports whether the grant names worker w.
	granted := func(ctx context.Context, c *sql.Conn, w int) (bool, error) {
		var owner int
		err := c.QueryRowContext(ctx, `SELECT owner FROM ceiling_lease WHERE k = 'a'`).Scan(&owner)
		return owner == w, err
	}
	for _, place := range []bool{false, true} {
		suffix := map[bool]string{false: "", true: "+place"}[place]
		b.Run("kill-ring"+suffix, func(b *testing.B) {
			cs, ls, hs := ceilingConns(b, db, workers), ceilingConns(b, db, workers), ceilingConns(b, db, workers)
			run := strconv.FormatInt(ceilingRun.Add(1), 10)
			bell := func(w int) string { return "ceiling_" + run + "_" + strconv.Itoa(w) }
			ids := make([]int64, workers)
			for w := range workers {
				if _, err := hs[w].ExecContext(context.Background(), `DO GET_LOCK(?, 0)`, bell(w)); err != nil {
					b.Fatal(err)
				}
				if err := ls[w].QueryRowContext(context.Background(), `SELECT CONNECTION_ID()`).Scan(&ids[w]); err != nil {
					b.Fatal(err)
				}
			}
			drivertest.BenchRing(b, workers,
				func(ctx context.Context, w int, _ int64) error {
					for {
						// A KILL that comes before the wait starts is lost: the
						// wait then ends by its 1 s timeout and the grant's read.
						_, err := ls[w].ExecContext(ctx, `DO GET_LOCK(?, 1)`, bell(w))
						var me *mysql.MySQLError
						if err != nil && !(errors.As(err, &me) && me.Number == 1317) { // 1317: interrupted, the wake-up
							return err
						}
						if ok, err := granted(ctx, ls[w], w); ok || err != nil {
							return err
						}
					}
				},
				func(ctx context.Context, w int, turn int64) error {
					if turn == 0 {
						time.Sleep(20 * time.Millisecond) // let the first waiter start waiting
					}
					err := grant(ctx, cs[w], turn)
					if err == nil {
						_, err = cs[w].ExecContext(ctx, `KILL QUERY `+strconv.FormatInt(ids[int(turn+1)%workers], 10))
					}
					if err == nil && place {
						err = writePlace(ctx, cs[w], w)
					}
					return err
				})
		})
		b.Run("get-lock-chain"+suffix, func(b *testing.B) {
			cs := ceilingConns(b, db, workers)
			run := strconv.FormatInt(ceilingRun.Add(1), 10)
			name := func(turn int64) string { return "ceiling_" + run + "_t" + strconv.FormatInt(turn, 10) }
			// Before it waits for turn t, a worker holds turn t's name, which its
			// pass gives back once the next worker's grant is committed.
			for w, c := range cs {
				if _, err := c.ExecContext(context.Background(), `DO GET_LOCK(?, 0)`, name(int64(w))); err != nil {
					b.Fatal(err)
				}
			}
			drivertest.BenchRing(b, workers,
				func(ctx context.Context, w int, turn int64) error {
					if _, err := cs[w].ExecContext(ctx, `DO GET_LOCK(?, 3600), RELEASE_LOCK(?)`, name(turn-1), name(turn-1)); err != nil {
						return err
					}
					_, err := granted(ctx, cs[w], w)
					return err
				},
				func(ctx context.Context, w int, turn int64) error {
					err := grant(ctx, cs[w], turn)
					if err == nil {
						_, err = cs[w].ExecContext(ctx, `DO GET_LOCK(?, 0), RELEASE_LOCK(?)`, name(turn+workers), name(turn))
					}
					if err == nil && place {
						err = writePlace(ctx, cs[w], w)
					}
					return err
				})
		})
	}
	drivertest.BenchContended(b, harness(b, srv), workers)
}

// ceilingRun makes the lock names of each ring run its own.
var ceilingRun atomic.Int64

// ceilingConns takes n connections of db, given back when b ends.
func ceilingConns(b *testing.B, db *sql.DB, n int) []*sql.Conn {
	cs := make([]*sql.Conn, n)
	for i := range cs {
		c, err := db.Conn(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}
