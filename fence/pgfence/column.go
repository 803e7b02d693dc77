package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/fence"
)

// Column guards rows of a table that carries its own fence column, without a mark
// table: the check is the UPDATE's own WHERE clause,
//
//	UPDATE <Table> SET <set>, <Fence> = $t WHERE <Key> = $k AND (<Fence> IS NULL OR <Fence> <= $t)
//
// so the row is written only if its fence is not above the token, and the fence
// becomes the token in the same statement. The fence column should be
// numeric(20,0) NOT NULL DEFAULT 0, which holds every token; a bigint column works for
// tokens below 2^63 and makes larger ones fail with a clear error. Each row is its
// own resource: the row's key is the resource name.
type Column struct {
	Table string // "table" or "schema.table"
	Key   string // the key column
	Fence string // the fence column
}

// Querier runs statements: pgx.Tx, *pgxpool.Pool and *pgx.Conn.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c Column) validate() error {
	schema, table, qualified := "", c.Table, false
	for i := range len(c.Table) {
		if c.Table[i] == '.' {
			schema, table, qualified = c.Table[:i], c.Table[i+1:], true
			break
		}
	}
	if !identRE.MatchString(table) || (qualified && !identRE.MatchString(schema)) {
		return fence.Invalid(guardName, "table %q: want lower-case letters, digits and underscores", c.Table)
	}
	for _, col := range []string{c.Key, c.Fence} {
		if !identRE.MatchString(col) {
			return fence.Invalid(guardName, "column %q: want lower-case letters, digits and underscores", col)
		}
	}
	return nil
}

// Update runs, in tx, UPDATE <Table> SET <set>, <Fence> = token WHERE <Key> = key
// AND the fence is not above token. set is the caller's assignment list with
// parameters $1..$n taken from args (for example "balance = $1", 100); it may be
// empty to move the fence alone. A row whose fence is above token is left alone and
// Update returns a *fence.StaleError with the row's fence; a missing row, ErrNoRow.
// On either error nothing was written by this statement, and the caller should roll
// tx back (Column does not own tx). The check is part of the UPDATE, so tx may also
// be a pool or a connection: the statement alone is then its own transaction.
func (c Column) Update(ctx context.Context, tx Querier, key any, token uint64, set string, args ...any) error {
	if err := fence.CheckToken(token); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	n := len(args)
	tk := "$" + strconv.Itoa(n+2) + "::text::numeric"
	assign := c.Fence + " = " + tk
	if set != "" {
		assign = set + ", " + assign
	}
	sql := fmt.Sprintf("UPDATE %s SET %s WHERE %s = $%d AND (%s IS NULL OR %s <= %s)", c.Table, assign, c.Key, n+1, c.Fence, c.Fence, tk)
	all := append(append(make([]any, 0, n+2), args...), key, strconv.FormatUint(token, 10))
	tag, err := tx.Exec(ctx, sql, all...)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "22003" {
			return fmt.Errorf("%w: %s: token %d does not fit column %s.%s (%s): make it numeric(20,0)", fence.ErrInvalid, guardName, token, c.Table, c.Fence, pe.Message)
		}
		return err
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	var cur *string
	err = tx.QueryRow(ctx, fmt.Sprintf("SELECT %s::text FROM %s WHERE %s = $1", c.Fence, c.Table, c.Key), key).Scan(&cur)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s where %s = %v", ErrNoRow, c.Table, c.Key, key)
	}
	if err != nil {
		return err
	}
	se := &fence.StaleError{Resource: fmt.Sprintf("%s[%v]", c.Table, key), Token: token}
	if cur != nil {
		se.Current, _ = strconv.ParseUint(*cur, 10, 64)
	}
	return se
}
