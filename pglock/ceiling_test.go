package pglock_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkHandoffCeiling puts pglock's hot key (16 workers, "workers=16") beside
// bare protocols on the same server, in one run: the row polled every 10 ms that
// the row-polling peer of dlock bench is ("polled-row", unfair), and fair handoffs
// with none of dlock's statements, in which 16 workers take one key in turn:
//
//   - notify-ring: the pass is an UPDATE of the key's row (a grant committed
//     synchronously, its token drawn) with a pg_notify to the next worker's
//     channel; each worker waits on a LISTEN connection of its own, as pglock's
//     clients do.
//   - cancel-ring: the same UPDATE with a pg_cancel_backend of the next worker's
//     connection, which waits in pg_advisory_lock for a lock another connection
//     of that worker holds and then reads its grant FOR SHARE (which waits for
//     the pass to commit): mysqllock's wake-up, tried on PostgreSQL.
//   - advisory-chain: the same UPDATE, and then the worker gives back a session
//     advisory lock of its turn, on which the next worker waits in the server
//     (a connection per waiter, as pg_advisory_lock's users have).
//   - "+place": after each pass, the worker also writes its next place, in a
//     transaction that locks the key's row and commits asynchronously, as a
//     waiting Lock that queues does.
//
// What the bare rings reach bounds any fair lock built on their wake-up and
// writes; the distance from there to workers=16 is what pglock's own statements
// (the lease, FIFO places and their liveness, the token's order, the holder
// watch) cost. "workers=16,clients=N" runs the same hot key with the workers
// spread over N clients: N listening sessions instead of 16. See
// docs/benchmarks.md.
func BenchmarkHandoffCeiling(b *testing.B) {
	srv := testserver.StartPostgres(b)
	pool := admin(b, srv)
	exec(b, pool, `CREATE TABLE ceiling_lease (k text PRIMARY KEY, owner int, token bigint)`)
	exec(b, pool, `INSERT INTO ceiling_lease VALUES ('a', 0, 0)`)
	exec(b, pool, `CREATE TABLE ceiling_places (id bigserial PRIMARY KEY, k text, w int)`)
	exec(b, pool, `CREATE TABLE ceiling_row (k text PRIMARY KEY)`)
	const workers = 16
	b.Run("polled-row", func(b *testing.B) {
		cs := ceilingConns(b, srv, workers)
		drivertest.BenchPolled(b, workers, 10*time.Millisecond,
			func(ctx context.Context, w int) (bool, error) {
				tag, err := cs[w].Exec(ctx, `INSERT INTO ceiling_row VALUES ('a') ON CONFLICT DO NOTHING`)
				return tag.RowsAffected() == 1, err
			},
			func(ctx context.Context, w int) error {
				_, err := cs[w].Exec(ctx, `DELETE FROM ceiling_row WHERE k = 'a'`)
				return err
			})
	})
	for _, place := range []bool{false, true} {
		suffix := map[bool]string{false: "", true: "+place"}[place]
		b.Run("notify-ring"+suffix, func(b *testing.B) {
			cs, ls := ceilingConns(b, srv, workers), ceilingConns(b, srv, workers)
			channel := func(w int) string { return "ceiling_" + strconv.Itoa(w) }
			for w, l := range ls {
				if _, err := l.Exec(context.Background(), `LISTEN `+channel(w)); err != nil {
					b.Fatal(err)
				}
			}
			drivertest.BenchRing(b, workers,
				func(ctx context.Context, w int, _ int64) error {
					_, err := ls[w].WaitForNotification(ctx)
					return err
				},
				func(ctx context.Context, w int, turn int64) error {
					next := int(turn+1) % workers
					_, err := cs[w].Exec(ctx, `WITH u AS (UPDATE ceiling_lease SET owner = $1, token = token + 1 WHERE k = 'a' RETURNING 1)
						SELECT pg_notify($2, '') FROM u`, next, channel(next))
					if err == nil && place {
						err = ceilingPlace(ctx, cs[w], w)
					}
					return err
				})
		})
		b.Run("cancel-ring"+suffix, func(b *testing.B) {
			cs, ls, hs := ceilingConns(b, srv, workers), ceilingConns(b, srv, workers), ceilingConns(b, srv, workers)
			base := ceilingBase.Add(1) << 32
			pids := make([]uint32, workers)
			for w := range workers {
				if _, err := hs[w].Exec(context.Background(), `SELECT pg_advisory_lock($1)`, base+int64(w)); err != nil {
					b.Fatal(err)
				}
				// A cancel that comes before the wait starts is lost: the wait
				// then ends by its lock timeout and the grant's read.
				if _, err := ls[w].Exec(context.Background(), `SET lock_timeout = '1s'`); err != nil {
					b.Fatal(err)
				}
				pids[w] = ls[w].PgConn().PID()
			}
			drivertest.BenchRing(b, workers,
				func(ctx context.Context, w int, _ int64) error {
					for {
						_, err := ls[w].Exec(ctx, `SELECT pg_advisory_lock($1)`, base+int64(w))
						var pe *pgconn.PgError
						if err != nil && !(errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "55P03")) { // canceled (the wake-up), lock timeout
							return err
						}
						var owner int
						// FOR SHARE waits for the pass that cancelled the wait to commit.
						if err := ls[w].QueryRow(ctx, `SELECT owner FROM ceiling_lease WHERE k = 'a' FOR SHARE`).Scan(&owner); err != nil || owner == w {
							return err
						}
					}
				},
				func(ctx context.Context, w int, turn int64) error {
					if turn == 0 {
						time.Sleep(20 * time.Millisecond) // let the first waiter start waiting
					}
					next := int(turn+1) % workers
					_, err := cs[w].Exec(ctx, `WITH u AS (UPDATE ceiling_lease SET owner = $1, token = token + 1 WHERE k = 'a' RETURNING 1)
						SELECT pg_cancel_backend($2) FROM u`, next, int64(pids[next]))
					if err == nil && place {
						err = ceilingPlace(ctx, cs[w], w)
					}
					return err
				})
		})
		b.Run("advisory-chain"+suffix, func(b *testing.B) {
			cs := ceilingConns(b, srv, workers)
			base := ceilingBase.Add(1) << 32
			id := func(turn int64) int64 { return base + turn }
			// Before it waits for turn t, a worker holds turn t's lock, which its pass
			// gives back once the next worker's grant is committed.
			for w, c := range cs {
				if _, err := c.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, id(int64(w))); err != nil {
					b.Fatal(err)
				}
			}
			drivertest.BenchRing(b, workers,
				func(ctx context.Context, w int, turn int64) error {
					batch := &pgx.Batch{}
					batch.Queue(`SELECT pg_advisory_lock($1), pg_advisory_unlock($1)`, id(turn-1))
					batch.Queue(`SELECT owner, token FROM ceiling_lease WHERE k = 'a'`)
					return cs[w].SendBatch(ctx, batch).Close()
				},
				func(ctx context.Context, w int, turn int64) error {
					batch := &pgx.Batch{}
					batch.Queue(`BEGIN`)
					batch.Queue(`UPDATE ceiling_lease SET owner = $1, token = token + 1 WHERE k = 'a'`, int(turn+1)%workers)
					batch.Queue(`COMMIT`)
					batch.Queue(`SELECT pg_advisory_lock($1)`, id(turn+workers))
					batch.Queue(`SELECT pg_advisory_unlock($1)`, id(turn))
					err := cs[w].SendBatch(ctx, batch).Close()
					if err == nil && place {
						err = ceilingPlace(ctx, cs[w], w)
					}
					return err
				})
		})
	}
	h := harness(b, srv)
	drivertest.BenchContended(b, h, workers)
	// The same 16 workers over fewer clients, so fewer sessions LISTEN: PostgreSQL
	// signals every listening session of the database at each NOTIFY.
	for _, clients := range []int{1, 4} {
		drivertest.BenchContendedClients(b, h, workers, clients)
	}
}

// ceilingBase makes the advisory lock keys of each advisory-chain run its own.
var ceilingBase atomic.Int64

// ceilingPlace writes worker w's next place as a queuing Lock does: under the key's
// row lock, committed asynchronously.
func ceilingPlace(ctx context.Context, c *pgx.Conn, w int) error {
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN`)
	batch.Queue(`SELECT FROM ceiling_lease WHERE k = 'a' FOR UPDATE`)
	batch.Queue(`INSERT INTO ceiling_places (k, w) VALUES ('a', $1)`, w)
	batch.Queue(`SET LOCAL synchronous_commit = off`)
	batch.Queue(`COMMIT`)
	return c.SendBatch(ctx, batch).Close()
}

// ceilingConns opens n connections to srv, closed when b ends.
func ceilingConns(b *testing.B, srv *testserver.Postgres, n int) []*pgx.Conn {
	cs := make([]*pgx.Conn, n)
	for i := range cs {
		c, err := pgx.Connect(context.Background(), srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(context.Background()) })
		cs[i] = c
	}
	return cs
}
