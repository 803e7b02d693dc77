package zklock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

func openErr(t *testing.T, ctx context.Context, raw string) error {
	t.Helper()
	u, err := driver.ParseURL(raw)
	if err != nil {
		return err
	}
	b, err := zklock.Open(ctx, u)
	if err == nil {
		b.Close()
	}
	return err
}

// Issue 17 items 5 and 7, 11: malformed parameters were dropped; a session timeout of
// 2^31 ms or more overflowed and Open never got a session; zk://user@host used an
// empty password.
func TestOpenRejectsBadURLs(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, raw := range []string{
		srv.URL("/r") + "?session_timeout=597h",
		srv.URL("/r") + "?session_timeout=5s%",
		srv.URL("/r") + "?create_root=false;x=1",
		"zk://alice@" + srv.Addr() + "/r",
		"zk://" + srv.Addr() + ":99999/r",
		"zk://" + srv.Addr() + ",/r",
	} {
		err := openErr(t, ctx, raw)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", raw, err)
		}
	}
}

// Issue 17 item 7: a DNS failure was reported as invalid input (CLI exit 64).
func TestOpenDNSFailureIsNotInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := openErr(t, ctx, "zk://no-such-host.invalid:2181/r")
	if err == nil || errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open(no-such-host.invalid) = %v, want an error that is not ErrInvalid", err)
	}
}

// Issue 17 item 7: against a server that accepts TCP but never answers, Open went on
// for 12s after its 1s context ended, the library still blocked in a read of its
// own. Open now ends the connection before it returns.
func TestOpenSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = openErr(t, ctx, "zk://"+ln.Addr().String()+"/r")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open against a silent server = %v, want DeadlineExceeded", err)
	}
	ln.Close()
	n := 0
	for c := range accepted {
		n++
		// The client closed its end before Open returned: the read ends with EOF
		// (or a reset), not at the guard deadline.
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, rerr := io.Copy(io.Discard, c)
		c.Close()
		var ne net.Error
		if errors.As(rerr, &ne) && ne.Timeout() {
			t.Fatalf("connection %d is still open after Open returned", n)
		}
	}
	if n == 0 {
		t.Fatal("Open never connected")
	}
}

// Issue 17 item 11: an authorisation failure was called "backend unreachable".
func TestOpenAuthFailure(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	owner := open(t, "zk://alice:right@"+srv.Addr()+"/private")
	owner.Close()
	err := openErr(t, ctx, "zk://alice:wrong@"+srv.Addr()+"/private")
	if !errors.Is(err, dlock.ErrAuth) {
		t.Fatalf("Open with the wrong password = %v, want ErrAuth", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// Issue 17 item 11: the README's zk://h1:2181,h2/root did not parse.
func TestOpenHostList(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The second entry has no port (2181); only the first is a server.
	c, err := dlock.Open(ctx, "zk://"+srv.Addr()+",127.0.0.1/hosts?session_timeout=4s")
	if err != nil {
		t.Fatalf("Open with a host list: %v", err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
