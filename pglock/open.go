package pglock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/recent"
)

// Server settings that may be given as URL parameters; pgx sends them at connection
// start. Every other parameter pgx does not itself understand is rejected.
var allowedSettings = map[string]bool{
	"application_name":                    true,
	"search_path":                         true,
	"statement_timeout":                   true,
	"lock_timeout":                        true,
	"idle_in_transaction_session_timeout": true,
	"synchronous_commit":                  true,
	"options":                             true,
}

// Open returns a backend for a postgres:// or postgresql:// URL; see the package
// documentation for its parameters. It connects, checks the session's settings and
// creates the table and sequence if needed, so a wrong password, a missing database
// or missing privileges are reported here. opts apply after the URL's parameters
// (they win). TLS and the connection settings are pgx's own URL parameters
// (sslmode, sslrootcert, sslcert, sslkey, ...: PostgreSQL's standard for the
// scheme), not driver.ReadTLS's; a parameter pgx does not know is refused.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme && u.Scheme != SchemeAlias {
		return nil, fmt.Errorf("%w: pglock: scheme %q is not postgres or postgresql", driver.ErrInvalid, u.Scheme)
	}
	q, err := driver.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	p := driver.NewParams(q)
	table, err := p.String("table", DefaultTable)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	for k, vs := range q {
		if len(vs) > 1 {
			return nil, fmt.Errorf("%w: pglock: URL parameter %q given %d times", driver.ErrInvalid, k, len(vs))
		}
	}
	rest := driver.Without(u, "table") // keeps the other parameters as written, for pgx
	cfg, err := pgxpool.ParseConfig(rest.String())
	if err != nil {
		return nil, fmt.Errorf("%w: pglock: URL %s: %v", driver.ErrInvalid, driver.Redact(u), parseError(err))
	}
	var unknown []string
	for k := range q {
		if _, setting := cfg.ConnConfig.RuntimeParams[k]; setting && !allowedSettings[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%w: pglock: unknown URL parameter(s): %s (neither a dlock, pgx nor libpq parameter, nor one of the server settings %s)",
			driver.ErrInvalid, strings.Join(unknown, ", "), strings.Join(sortedKeys(allowedSettings), ", "))
	}
	if sc, ok := cfg.ConnConfig.RuntimeParams["synchronous_commit"]; ok && !durableCommit(sc) {
		return nil, fmt.Errorf("%w: pglock: synchronous_commit=%s could lose grants and reissue fencing tokens after a crash; use on, remote_write, remote_apply or local", driver.ErrInvalid, sc)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "dlock"
	}
	// The statements need read committed, whatever the server's or role's
	// default_transaction_isolation (see "Safety model" in the package documentation).
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	// Plain index scans only (see "Dead rows" in the package documentation).
	cfg.ConnConfig.RuntimeParams["enable_bitmapscan"] = "off"
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// libpq waits forever by default; a lock client should not.
		cfg.ConnConfig.ConnectTimeout = driver.DefaultOpenTimeout
	}
	octx, cancel := driver.OpenContext(ctx)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(octx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglock: connect to %s: %w", driver.Redact(u), authErr(err))
	}
	b, err := newBackend(octx, pool, append([]Option{WithTable(table)}, opts...))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("pglock: %s: %w", driver.Redact(u), authErr(err))
	}
	b.own = true
	return b, nil
}

// authErr marks the server refusing the credentials (SQLSTATE class 28) or a
// privilege (42501) with driver.ErrAuth.
func authErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || pe.Code == "42501") {
		return fmt.Errorf("%w: %w", driver.ErrAuth, err)
	}
	return err
}

// parseError returns pgx's reason without the connection string it repeats.
func parseError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if inner := errors.Unwrap(pe); inner != nil {
			return inner.Error()
		}
		// pgx keeps the message private; its Error() redacts the password.
		return "invalid connection parameters: " + err.Error()
	}
	return err.Error()
}

func durableCommit(v string) bool {
	switch strings.ToLower(v) {
	case "on", "true", "yes", "1", "remote_write", "remote_apply", "local":
		return true
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// New returns a backend on an existing pool, which the caller keeps owning (Close does
// not close it). Like Open, it checks the session's settings (durable commits, read
// committed isolation) and creates the table and sequence if needed. Waiters listen
// on a dedicated connection made with the pool's connection configuration.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Backend, error) {
	b, err := newBackend(ctx, pool, opts)
	if err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	return b, nil
}

func newBackend(ctx context.Context, pool *pgxpool.Pool, opts []Option) (*Backend, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pgxpool.Pool", driver.ErrInvalid)
	}
	b := &Backend{pool: pool, config: config{linger: DefaultLinger}, handedOn: recent.New(contendedFor), heldLately: recent.NewSlots(heldFor)}
	if err := WithTable(DefaultTable)(&b.config); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalid)
		}
		if err := o(&b.config); err != nil {
			return nil, err
		}
	}
	b.channel = "dlock_" + driver.RandomHex(12)
	tableID, err := b.ensureSchema(ctx)
	if err != nil {
		return nil, err
	}
	b.sql = loadStatements(b.table.Sanitize(), b.permits.Sanitize(), b.seq.Sanitize(), tableID)
	b.lst = newListener(pool.Config().ConnConfig, b.channel, b.linger)
	b.lst.tableID = tableID
	b.lst.withdraw = b.withdraw
	return b, nil
}
