package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/driver"
)

// Parameters of the Go MySQL driver (go-sql-driver/mysql) that may be given in the
// URL, under its names. The others are refused: some would change how results read
// (clientFoundRows, parseTime, multiStatements, interpolateParams, ...), and the
// driver sends any name it does not know to the server as a session variable, where
// a typo would go unnoticed.
var allowedParams = map[string]bool{
	"tls":                      true, // true, skip-verify, preferred, false
	"timeout":                  true,
	"readTimeout":              true,
	"writeTimeout":             true,
	"allowCleartextPasswords":  true,
	"allowNativePasswords":     true,
	"allowFallbackToPlaintext": true,
	"serverPubKey":             true,
	"compress":                 true,
	"maxAllowedPacket":         true,
	"connectionAttributes":     true,
	"charset":                  true,
	"collation":                true,
}

// DefaultMaxConns is the default limit of a Backend's open connections (URL
// parameter max_conns); requests beyond it wait for a connection.
const DefaultMaxConns = 32

// Open returns a backend for a mysql:// URL; see the package documentation for its
// parameters. It connects and creates the table if needed, so a wrong password, a
// missing database or missing privileges are reported here. opts apply after the
// URL's parameters (they win).
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme && u.Scheme != SchemeAlias {
		return nil, fmt.Errorf("%w: mysqllock: scheme %q is not mysql or mariadb", driver.ErrInvalid, u.Scheme)
	}
	q, err := driver.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	p := driver.NewParams(q)
	table, err := p.String("table", DefaultTable)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	conns, err := p.Int("max_conns", DefaultMaxConns)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	var unknown []string
	dsnQuery := url.Values{}
	for k, vs := range q {
		if k == "table" || k == "max_conns" {
			continue
		}
		if len(vs) > 1 {
			return nil, fmt.Errorf("%w: mysqllock: URL parameter %q given %d times", driver.ErrInvalid, k, len(vs))
		}
		if !allowedParams[k] {
			unknown = append(unknown, k)
			continue
		}
		dsnQuery.Set(k, vs[0])
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%w: mysqllock: unknown URL parameter(s): %s (allowed: table, max_conns, %s)",
			driver.ErrInvalid, strings.Join(unknown, ", "), strings.Join(sortedKeys(allowedParams), ", "))
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("%w: mysqllock: URL %s names no database (mysql://user:password@host:3306/database)", driver.ErrInvalid, driver.Redact(u))
	}
	// charset and collation reach the server as written (SET NAMES): names only,
	// and charset may list several, whose commas the driver reads unescaped.
	charset := dsnQuery.Get("charset")
	if charset != "" && !namesRE.MatchString(charset) {
		return nil, fmt.Errorf("%w: mysqllock: URL parameter charset=%q: want names (letters, digits, _), comma-separated", driver.ErrInvalid, charset)
	}
	if c := dsnQuery.Get("collation"); c != "" && !nameRE.MatchString(c) {
		return nil, fmt.Errorf("%w: mysqllock: URL parameter collation=%q: want a name (letters, digits, _)", driver.ErrInvalid, c)
	}
	dsnQuery.Del("charset")
	// The DSN is parsed without the password, which is set afterwards: no error
	// can repeat it.
	dsn := "tcp(" + host + ")/" + db
	if len(dsnQuery) > 0 {
		dsn += "?" + dsnQuery.Encode()
	}
	if charset != "" {
		if len(dsnQuery) > 0 {
			dsn += "&charset=" + charset
		} else {
			dsn += "?charset=" + charset
		}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqllock: URL %s: %v", driver.ErrInvalid, driver.Redact(u), err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	// The driver logs dropped connections to stderr by default; the errors that
	// matter reach the caller.
	cfg.Logger = log.New(io.Discard, "", 0)
	if cfg.Timeout == 0 {
		cfg.Timeout = driver.DefaultOpenTimeout
	}
	// A statement waits at most a second for a row lock (see "Cancelled calls"
	// in the package documentation); the driver sets it on each new connection.
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = lockWaitTimeout
	// Each statement outside a transaction commits on its own, whatever the
	// server's default (a server started with autocommit=0 would leave every
	// grant uncommitted, its row locked, on a pooled connection).
	cfg.Params["autocommit"] = "1"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqllock: URL %s: %v", driver.ErrInvalid, driver.Redact(u), err)
	}
	if conns < 3 {
		return nil, fmt.Errorf("%w: mysqllock: max_conns=%d: at least 3 (two wait for wake-ups)", driver.ErrInvalid, conns)
	}
	pool := sql.OpenDB(repeatableRead{conn})
	pool.SetMaxOpenConns(conns)
	pool.SetMaxIdleConns(conns)
	pool.SetConnMaxIdleTime(5 * time.Minute)
	octx, cancel := driver.OpenContext(ctx)
	defer cancel()
	b, err := newBackend(octx, pool, append([]Option{WithTable(table)}, opts...))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("mysqllock: %s: %w", driver.Redact(u), authErr(err))
	}
	b.own = true
	// A second pool whose connections take several statements at once, with
	// parameters written into the text by the driver (escaped): a permit's or a
	// reader's short grant is sent as one request (see quickBatch). Not with a
	// character set in which an escaped byte string can end a quoted literal
	// (GBK, Big5, SJIS: a multi-byte character may end in a backslash): then
	// the short grant sends its statements one by one, with parameters apart.
	bcfg := cfg.Clone()
	bcfg.MultiStatements, bcfg.InterpolateParams = true, true
	// The server may read statements in a character set other than the one
	// asked for: each connection is checked (checkedConnector).
	if bconn, err := mysql.NewConnector(bcfg); err == nil && escapeSafe(charset) {
		b.batch = sql.OpenDB(checkedConnector{repeatableRead{bconn}})
		b.batch.SetMaxOpenConns(batchConns(conns))
		b.batch.SetMaxIdleConns(batchConns(conns))
		b.batch.SetConnMaxIdleTime(5 * time.Minute)
	}
	return b, nil
}

// New returns a backend on an existing pool (made with the go-sql-driver/mysql
// driver), which the caller keeps owning (Close does not close it). Like Open, it
// creates the table if needed. The pool's sessions keep their own settings. They
// must commit each statement on its own (autocommit=1) and run REPEATABLE READ (or
// SERIALIZABLE; see Safety model in the package documentation): New reads a
// session's settings and refuses a pool with autocommit off or at READ COMMITTED.
// Open's sessions also wait at most a second for a row lock
// (innodb_lock_wait_timeout; see "Cancelled calls" in the package documentation),
// which a pool made for dlock should set too (mysql.Config.Params).
func New(ctx context.Context, pool *sql.DB, opts ...Option) (*Backend, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: mysqllock: nil *sql.DB", driver.ErrInvalid)
	}
	if err := checkSession(ctx, pool); err != nil {
		return nil, fmt.Errorf("mysqllock: %w", authErr(err))
	}
	b, err := newBackend(ctx, pool, opts)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", authErr(err))
	}
	return b, nil
}

// nameRE matches a collation parameter, namesRE a charset parameter (names,
// comma-separated).
var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	namesRE = regexp.MustCompile(`^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$`)
)

// escapeSafe reports whether every character set of a charset parameter (a
// comma-separated list; empty for the driver's default, utf8mb4) reads a
// backslash-escaped string as the driver writes it: ASCII-compatible sets in which
// no multi-byte character holds a backslash or a quote byte.
func escapeSafe(charsets string) bool {
	if charsets == "" {
		return true
	}
	for cs := range strings.SplitSeq(charsets, ",") {
		switch strings.ToLower(strings.TrimSpace(cs)) {
		case "utf8mb4", "utf8", "utf8mb3", "latin1", "ascii", "binary":
		default:
			return false
		}
	}
	return true
}

// batchConns is the size of the batch pool of a backend of max_conns conns: a
// quarter, at least 2.
func batchConns(conns int) int { return max(2, conns/4) }

// lockWaitTimeout is the session's innodb_lock_wait_timeout, in seconds.
const lockWaitTimeout = "1"

// authErr marks the server refusing the credentials or a privilege with
// driver.ErrAuth.
func authErr(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1044, 1045, 1142, 1143, 1227, 1370, 1698:
			return fmt.Errorf("%w: %w", driver.ErrAuth, err)
		}
	}
	return err
}

func sortedKeys(m map[string]bool) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}
