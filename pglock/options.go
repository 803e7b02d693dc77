package pglock

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlockio/dlock/driver"
)

// Option configures a Backend (Open, New). An option with a bad value returns an
// error matching driver.ErrInvalid.
type Option func(*config) error

// config holds every setting.
type config struct {
	table, seq pgx.Identifier
	permits    pgx.Identifier // the semaphores' permit table, table_permits
	tableName  string
	linger     time.Duration
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// seqSuffix names a table's token sequence: table_token_seq, in the table's schema.
const seqSuffix = "_token_seq"

// permitsSuffix names a table's permit table (semaphores): table_permits, in the
// table's schema.
const permitsSuffix = "_permits"

// WithTable sets the lock table, "table" or "schema.table": lower-case letters, digits
// and underscores, starting with a letter or underscore; the table name at most 48
// bytes (the sequence is named table_token_seq), not ending in "_token_seq",
// "_permits" or "_pkey", which name the sequence, the permit table and the primary
// key index of another table.
// Clients that should contend for the same locks must use the same table; clients
// with different tables never meet.
func WithTable(name string) Option {
	return func(b *config) error {
		schema, table, qualified := strings.Cut(name, ".")
		if !qualified {
			schema, table = "", name
		}
		bad := !identRE.MatchString(table) || len(table) > 48 ||
			qualified && (!identRE.MatchString(schema) || len(schema) > 63)
		if bad {
			return fmt.Errorf("%w: table %q must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 48 bytes), optionally schema-qualified", driver.ErrInvalid, name)
		}
		for _, suffix := range []string{seqSuffix, permitsSuffix, "_pkey"} {
			// Table x_token_seq and the sequence of table x are one relation name,
			// as are table x_permits and the permit table of table x, and table
			// x_pkey and the primary key index of table x.
			if strings.HasSuffix(table, suffix) {
				return fmt.Errorf("%w: table %q ends in %q, which names a relation of table %q", driver.ErrInvalid, name, suffix, strings.TrimSuffix(table, suffix))
			}
		}
		b.table = pgx.Identifier{table}
		b.seq = pgx.Identifier{table + seqSuffix}
		b.permits = pgx.Identifier{table + permitsSuffix}
		if qualified {
			b.table = pgx.Identifier{schema, table}
			b.seq = pgx.Identifier{schema, table + seqSuffix}
			b.permits = pgx.Identifier{schema, table + permitsSuffix}
		}
		b.tableName = name
		return nil
	}
}

// WithLinger sets how long a client keeps its listening connection open after its
// last waiter stopped waiting and its last holder watch stopped (default one minute).
func WithLinger(d time.Duration) Option {
	return func(b *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: linger must be positive, got %v", driver.ErrInvalid, d)
		}
		b.linger = d
		return nil
	}
}
