package pglock_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

func openErr(ctx context.Context, t *testing.T, raw string) error {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pglock.Open(ctx, u)
	if err == nil {
		b.Close()
	}
	return err
}

// Issue 17 item 5: ?table=x;drop... was dropped and the default table used;
// duplicates went to pgx, which takes the first.
func TestOpenRejectsMalformedQuery(t *testing.T) {
	srv := testserver.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, q := range []string{"table=x;drop%20table%20t", "table=app%zz", "application_name=a%", "table=a&table=b",
		"application_name=a&application_name=b", "statement_timeout=1s;x"} {
		err := openErr(ctx, t, srv.URL()+"&"+q)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(&%s) = %v, want ErrInvalid", q, err)
		}
	}
}

// Issue 17 item 11: a refused password was not told apart from an unreachable
// server.
func TestOpenAuthFailure(t *testing.T) {
	srv := testserver.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := openErr(ctx, t, srv.URLFor("postgres", "wrong-secret", "postgres"))
	if !errors.Is(err, dlock.ErrAuth) {
		t.Fatalf("Open with the wrong password = %v, want ErrAuth", err)
	}
	if strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// Issue 17 item 11: with a context without deadline, Open against a server that
// accepts connections but never answers hung for over a minute. It is now bounded
// by driver.DefaultOpenTimeout.
func TestOpenSilentServerBackgroundContext(t *testing.T) {
	if testing.Short() {
		t.Skip("waits driver.DefaultOpenTimeout")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	done := make(chan error, 1)
	go func() {
		done <- openErr(context.Background(), t, "postgres://u:p@"+ln.Addr().String()+"/db?sslmode=disable")
	}()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("Open against a silent server = %v", err)
		}
	case <-time.After(4 * driver.DefaultOpenTimeout): // a guard against a hang, not a measurement
		t.Fatal("Open against a silent server did not return")
	}
}
