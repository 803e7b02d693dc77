package redislock_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

func openURL(raw string) (*redislock.Backend, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	return redislock.Open(context.Background(), u)
}

// Issue 17 item 5: a malformed pair was dropped, so ?strict=true% opened a server
// without appendfsync always, ?replicas=2% acquired with no replica wait and
// ?prefix=app%zz used the default prefix.
func TestOpenRejectsMalformedQuery(t *testing.T) {
	srv := testserver.StartRedis(t) // no persistence: strict=true must refuse it
	for _, q := range []string{"strict=true%", "strict=true;x=1", "replicas=2%", "prefix=app%zz", "prefix=app&ttl=1s%"} {
		b, err := openURL(srv.URL() + "?" + q)
		if err == nil {
			b.Close()
			t.Errorf("Open(?%s) succeeded", q)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(?%s) = %v, want ErrInvalid", q, err)
		}
	}
	_, err := openURL(srv.URL() + "?strict=true")
	if !errors.Is(err, redislock.ErrNotDurable) {
		t.Fatalf("Open(?strict=true) = %v, want ErrNotDurable", err)
	}
}

// Issue 17 item 6: go-redis panicked on some of its parameters (pool_size=-1:
// "makechan: size out of range"); duplicates were taken silently; db= beside a
// database in the path was not noticed.
func TestOpenChecksClientParams(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, q := range []string{
		"pool_size=-1", "pool_size=2147483648", "pipeline_pool_size=-2", "pipeline_pool_size=2147483648",
		"min_idle_conns=-1", "max_idle_conns=99999999999", "max_active_conns=-5", "max_concurrent_dials=-1",
		"pipeline_read_buffer_size=-1", "pipeline_write_buffer_size=1099511627776",
		"dial_timeout=9223372036854775807", "read_timeout=-5s", "pool_timeout=abc", "max_retries=-2",
		"protocol=4", "pool_fifo=yes", "client_name=a%20b", "skip_verify=true",
		"pool_size=2&pool_size=3", "dial_timeout=1s&dial_timeout=2s", "db=1", "db=-1",
		"no_such_option=1",
	} {
		b, err := openURL(srv.URL() + "?" + q)
		if err == nil {
			b.Close()
			t.Errorf("Open(?%s) succeeded", q)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(?%s) = %v, want ErrInvalid", q, err)
		}
	}
	b, err := openURL("redis://" + srv.Addr() + "?db=2&pool_size=3&dial_timeout=1&read_timeout=2s&pipeline_pool_size=-1&max_retries=-1&client_name=dlock-test&protocol=3")
	if err != nil {
		t.Fatalf("Open with good client parameters: %v", err)
	}
	defer b.Close()
	if o := b.Client().(*redis.Client).Options(); o.DB != 2 || o.PoolSize != 3 || o.PipelinePoolSize != -1 {
		t.Fatalf("options: db %d, pool size %d, pipeline pool size %d", o.DB, o.PoolSize, o.PipelinePoolSize)
	}
}

// Issue 17 item 11: a refused password was reported as the backend being
// unreachable.
func TestOpenAuthFailure(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := rawClient(t, srv)
	if err := rdb.Do(context.Background(), "ACL", "SETUSER", "alice", "on", ">right", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{
		"redis://alice:wrong@" + srv.Addr() + "/0",
		"redis://nobody:pw@" + srv.Addr() + "/0",
	} {
		_, err := openURL(raw)
		if !errors.Is(err, dlock.ErrAuth) {
			t.Errorf("Open(%s) = %v, want ErrAuth", driver.Redact(mustParse(t, raw)), err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	b, err := openURL("redis://alice:right@" + srv.Addr() + "/0")
	if err != nil {
		t.Fatalf("Open with the right password: %v", err)
	}
	b.Close()
}

func mustParse(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TLS from the URL: rediss:// has it on, redis:// with tls=true or a tls_*
// parameter turns it on (driver.ReadTLS), rediss:// with tls=false and
// skip_verify without TLS are errors, and without the CA the server's certificate
// is refused.
func TestOpenTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	srv, port := testserver.StartRedisTLS(t, files)
	host := "127.0.0.1:" + strconv.Itoa(port)
	ca := "tls_ca=" + url.QueryEscape(files.CA)
	for _, raw := range []string{
		"rediss://" + host + "/0?" + ca,
		"redis://" + host + "?tls=true&" + ca,
		"redis://" + host + "?" + ca + "&tls_server_name=localhost",
		"rediss://" + host + "?skip_verify=true",
	} {
		b, err := openURL(raw)
		if err != nil {
			t.Errorf("Open(%s): %v", raw, err)
			continue
		}
		if _, err := b.Acquire(context.Background(), driver.Request{Key: "k", Owner: "o", TTL: time.Second}); err != nil {
			t.Errorf("%s: Acquire: %v", raw, err)
		}
		if err := b.Release(context.Background(), "k", "o"); err != nil {
			t.Errorf("%s: Release: %v", raw, err)
		}
		b.Close()
	}
	for _, raw := range []string{
		"rediss://" + host + "?tls=false",
		"rediss://" + host + "?tls=false&" + ca,
		"redis://" + srv.Addr() + "?skip_verify=true",
		"redis://" + srv.Addr() + "?tls=false&skip_verify=true",
		"unix:///tmp/none.sock?tls=true",
	} {
		if b, err := openURL(raw); err == nil {
			b.Close()
			t.Errorf("Open(%s) succeeded", raw)
		} else if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", raw, err)
		}
	}
	if b, err := openURL("rediss://" + host); err == nil {
		b.Close()
		t.Fatal("Open without the CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Open without the CA = %v, want a certificate error", err)
	}
}
