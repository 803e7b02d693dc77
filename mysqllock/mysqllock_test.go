package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/mysqlops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, rawURL string) *mysqllock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := mysqllock.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

// admin returns a pool of the test server's administrator, closed at the end of
// the test; its statements commit on their own even where the server's default
// is autocommit off.
func admin(t testing.TB, srv *testserver.MariaDB) *sql.DB {
	t.Helper()
	return adminWith(t, srv, map[string]string{"autocommit": "1"})
}

// adminWith returns a pool of the test server's administrator whose sessions set
// the variables of params, closed at the end of the test.
func adminWith(t testing.TB, srv *testserver.MariaDB, params map[string]string) *sql.DB {
	t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = srv.User, srv.Password, "tcp", srv.Addr(), srv.Database
	cfg.Params = params
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t testing.TB, db *sql.DB, q string, args ...any) sql.Result {
	t.Helper()
	res, err := db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return res
}

// withQuery adds query parameters to a URL.
func withQuery(rawURL string, kv ...string) string {
	u, _ := url.Parse(rawURL)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func harness(t testing.TB, srv *testserver.MariaDB, kv ...string) drivertest.Harness {
	db := admin(t, srv)
	rawURL := withQuery(srv.URL(), kv...)
	table := mysqllock.DefaultTable
	if u, _ := url.Parse(rawURL); u.Query().Get("table") != "" {
		table = u.Query().Get("table")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The floor (an INSERT and a DELETE, each prepared once) and the statement
	// count of `dlock bench`.
	st, err := storeops.Open(ctx, rawURL)
	if err != nil {
		t.Fatalf("storeops: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return drivertest.Harness{
		Ops:   st.Ops,
		Floor: st.FloorCycle,
		Open:  func(t testing.TB) driver.Backend { return open(t, rawURL) },
		Expire: func(t testing.TB, key string) {
			exec(t, db, "UPDATE `"+table+"` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)", key)
		},
		Fencing:   true,
		FIFO:      true,
		RoundTrip: func(ctx context.Context) error { return db.PingContext(ctx) },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(withQuery(rawURL, "table", ns))
			if err != nil {
				t.Fatal(err)
			}
			return mysqllock.Open(context.Background(), u)
		},
	}
}

// TestMariaDB runs the tests that can share one server.
func TestMariaDB(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	t.Run("Conformance", func(t *testing.T) { drivertest.Run(t, harness(t, srv)) })
	t.Run("URLParameters", func(t *testing.T) { testURLParameters(t, srv) })
	t.Run("BadCredentials", func(t *testing.T) { testBadCredentials(t, srv) })
	t.Run("ConcurrentSchemaCreation", func(t *testing.T) { testConcurrentSchemaCreation(t, srv) })
	t.Run("NoCreatePrivilege", func(t *testing.T) { testNoCreatePrivilege(t, srv) })
	t.Run("Open", func(t *testing.T) { testDlockOpen(t, srv) })
	t.Run("ListPrefixBytes", func(t *testing.T) { testListPrefixBytes(t, srv) })
	t.Run("ValueColumnAdded", func(t *testing.T) { testValueColumnAdded(t, srv) })
}

func testURLParameters(t *testing.T, srv *testserver.MariaDB) {
	for _, bad := range []string{
		withQuery(srv.URL(), "sql_mode", "ANSI"),
		withQuery(srv.URL(), "clientFoundRows", "true"),
		withQuery(srv.URL(), "table", "Bad-Name"),
		withQuery(srv.URL(), "table", "locks_sem"),
		withQuery(srv.URL(), "tls", "nonsense"),
		withQuery(srv.URL(), "max_conns", "2"),
		withQuery(srv.URL(), "charset", "utf8mb4 COLLATE x"),
		withQuery(srv.URL(), "charset", "utf8mb4,"),
		withQuery(srv.URL(), "collation", "utf8mb4_bin; SELECT 1"),
		withQuery(srv.URL(), "collation", "a,b"),
		strings.TrimSuffix(srv.URL(), "/"+srv.Database),
	} {
		u, _ := url.Parse(bad)
		_, err := mysqllock.Open(context.Background(), u)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", driver.Redact(u), err)
		}
		if err != nil && strings.Contains(err.Error(), srv.Password) {
			t.Errorf("error shows the password: %v", err)
		}
	}
	b := open(t, withQuery(srv.URL(), "timeout", "5s", "readTimeout", "30s", "table", "params_ok", "max_conns", "8"))
	defer b.Close()
	if b.Table() != "params_ok" {
		t.Fatalf("table %q", b.Table())
	}
}

func testBadCredentials(t *testing.T, srv *testserver.MariaDB) {
	u, _ := url.Parse(srv.URLFor(srv.User, "wrong-password", srv.Database))
	_, err := mysqllock.Open(context.Background(), u)
	if !errors.Is(err, driver.ErrAuth) {
		t.Fatalf("Open with a wrong password = %v, want ErrAuth", err)
	}
	if strings.Contains(err.Error(), "wrong-password") {
		t.Fatalf("error shows the password: %v", err)
	}
}

// Many clients open on a table that does not exist yet, at once: one creates it,
// all work.
func testConcurrentSchemaCreation(t *testing.T, srv *testserver.MariaDB) {
	rawURL := withQuery(srv.URL(), "table", "concurrent_schema")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			u, _ := url.Parse(rawURL)
			b, err := mysqllock.Open(context.Background(), u)
			if err != nil {
				errs <- err
				return
			}
			defer b.Close()
			ctx := context.Background()
			c, err := dlock.New(b)
			if err != nil {
				errs <- err
				return
			}
			l, err := c.Lock(ctx, "k")
			if err == nil {
				err = l.Release(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// A user without CREATE works on a table an administrator made, and is told about
// the missing privilege when there is no table.
func testNoCreatePrivilege(t *testing.T, srv *testserver.MariaDB) {
	db := admin(t, srv)
	exec(t, db, "CREATE USER IF NOT EXISTS 'plain'@'%' IDENTIFIED BY 'plainpw'")
	adm0 := open(t, withQuery(srv.URL(), "table", "made_for_plain"))
	adm0.Close()
	exec(t, db, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+srv.Database+"`.`made_for_plain` TO 'plain'@'%'")
	exec(t, db, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+srv.Database+"`.`made_for_plain_queue` TO 'plain'@'%'")
	u, _ := url.Parse(withQuery(srv.URLFor("plain", "plainpw", srv.Database), "table", "nothing_here"))
	if _, err := mysqllock.Open(context.Background(), u); !errors.Is(err, driver.ErrAuth) {
		t.Fatalf("Open without CREATE = %v, want ErrAuth", err)
	}
	adm := open(t, withQuery(srv.URL(), "table", "made_for_plain"))
	adm.Close()
	b := open(t, withQuery(srv.URLFor("plain", "plainpw", srv.Database), "table", "made_for_plain"))
	defer b.Close()
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func testDlockOpen(t *testing.T, srv *testserver.MariaDB) {
	ctx := context.Background()
	for _, scheme := range []string{"mysql", "mariadb"} {
		raw := strings.Replace(withQuery(srv.URL(), "ttl", "3s"), "mysql://", scheme+"://", 1)
		c, err := dlock.Open(ctx, raw)
		if err != nil {
			t.Fatalf("dlock.Open(%s): %v", scheme, err)
		}
		l, err := c.Lock(ctx, "open-"+scheme)
		if err != nil {
			t.Fatal(err)
		}
		if ttl := time.Until(l.Expiry()); ttl > 3*time.Second {
			t.Errorf("ttl=3s gave a lease valid for %v", ttl)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// A lease held across a server crash and restart: the grant is still there after
// the restart (the holder refreshes and releases it), and the next grant's token is
// above it.
func TestServerRestart(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	ctx := context.Background()
	b := open(t, srv.URL())
	defer b.Close()
	g, err := b.Acquire(ctx, driver.Request{Key: "restart", Owner: "alice", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var refreshErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		// The pool's connections died with the server; database/sql retries on
		// a fresh one.
		if refreshErr = b.Refresh(ctx, "restart", "alice", time.Minute); refreshErr == nil {
			break
		}
	}
	if refreshErr != nil {
		t.Fatalf("Refresh after restart: %v", refreshErr)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "restart", Owner: "bob", TTL: time.Minute}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire by another owner after restart = %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, "restart", "alice"); err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, driver.Request{Key: "restart", Owner: "bob", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token after restart %d, not above %d", g2.Token, g.Token)
	}
}

// A waiter that gives up while the server is down leaves no place behind once it
// is back (see drivertest.WithdrawAfterOutage): the place would stay live for its
// patience (a minute there), first in line.
func TestWithdrawAfterOutage(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	drivertest.WithdrawAfterOutage(t, harness(t, srv), srv.Stop, srv.Restart)
}
