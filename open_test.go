package dlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// seen records the URLs the "urltest" backend was opened with.
var seen struct {
	sync.Mutex
	urls []*url.URL
}

func init() {
	driver.Register("urltest", func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		seen.Lock()
		seen.urls = append(seen.urls, u)
		seen.Unlock()
		if err := driver.NewParams(nil).Unknown(); err != nil {
			return nil, err
		}
		return memlock.NewStore(clock.Real).Backend(), nil
	})
}

func lastSeen(t *testing.T) *url.URL {
	t.Helper()
	seen.Lock()
	defer seen.Unlock()
	if len(seen.urls) == 0 {
		t.Fatal("the backend was not opened")
	}
	return seen.urls[len(seen.urls)-1]
}

// Issue 17 item 5: a core parameter with a bad escape was dropped (?ttl=1s% gave the
// default TTL); now the query must parse cleanly before anything opens.
func TestOpenRejectsMalformedQuery(t *testing.T) {
	ctx := context.Background()
	for _, raw := range []string{
		"mem://q?ttl=1s%",
		"mem://q?ttl=1s;owner=x",
		"mem://q?owner=a%zz",
		"urltest://h?strict=true%",
		"urltest://h?replicas=2%",
		"urltest://h?prefix=app%zz",
		"urltest://h?table=x;drop",
	} {
		c, err := dlock.Open(ctx, raw)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", raw)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", raw, err)
		}
	}
	c, err := dlock.Open(ctx, "mem://q?ttl=7s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.TTL().String() != "7s" {
		t.Fatalf("TTL = %v, want 7s", l.TTL())
	}
}

// Issue 17 item 11: the README's multi-host URLs did not parse, and the error blamed
// the password.
func TestOpenHostList(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ raw, host, path string }{
		{"urltest://h1:2379,h2/prefix", "h1:2379,h2", "/prefix"},
		{"urltest://u:p@h1:2181,h2:2182/root?ttl=5s", "h1:2181,h2:2182", "/root"},
	} {
		c, err := dlock.Open(ctx, tc.raw)
		if err != nil {
			t.Fatalf("Open(%q) = %v", tc.raw, err)
		}
		c.Close()
		u := lastSeen(t)
		if u.Host != tc.host || u.Path != tc.path || u.RawQuery != "" {
			t.Fatalf("Open(%q) gave the backend host %q path %q query %q", tc.raw, u.Host, u.Path, u.RawQuery)
		}
	}
	_, err := dlock.Open(ctx, "urltest://h1:2379,h2:port/prefix")
	if !errors.Is(err, dlock.ErrInvalid) || strings.Contains(err.Error(), "password") {
		t.Fatalf("Open with a bad port = %v, want ErrInvalid without a password hint", err)
	}
	_, err = dlock.Open(ctx, "urltest://user:pa/ss@h1/prefix")
	if !errors.Is(err, dlock.ErrInvalid) || strings.Contains(err.Error(), "pa/ss") || !strings.Contains(err.Error(), "password") {
		t.Fatalf("Open with a '/' in the password = %v", err)
	}
}

// FuzzOpen opens the in-process backend with fuzzed URLs: no panic, bad input is
// ErrInvalid, and no error repeats the URL's password.
func FuzzOpen(f *testing.F) {
	for _, s := range []string{"mem://x?ttl=1s%", "mem://x?ttl=5s&renew=1s&drift=0.01&owner=o1", "mem://u:s3cretpw@x",
		"mem://x?ttl=1s&ttl=2s", "mem:x", "mem://x#f", "mem://h1,h2:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !strings.HasPrefix(raw, "mem:") {
			return // other schemes would dial
		}
		c, err := dlock.Open(context.Background(), raw)
		if err == nil {
			c.Close()
			return
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Open(%q) = %v, not ErrInvalid", raw, err)
		}
		if u, perr := url.Parse(raw); perr == nil {
			if pw, ok := u.User.Password(); ok && len(pw) >= 6 && strings.Contains(err.Error(), pw) && !strings.Contains(strings.Replace(raw, pw, "", 1), pw) {
				t.Fatalf("Open(%q) = %v shows the password", raw, err)
			}
		}
	})
}

func TestInvalidOptions(t *testing.T) {
	b := memlock.NewStore(clock.Real).Backend()
	bad := map[string][]dlock.Option{
		"zero TTL":          {dlock.WithTTL(0)},
		"negative TTL":      {dlock.WithTTL(-time.Second)},
		"renew >= validity": {dlock.WithTTL(time.Second), dlock.WithRenewInterval(time.Second)},
		"renew zero":        {dlock.WithRenewInterval(0)},
		"drift too big":     {dlock.WithDrift(0.5, 0)},
		"drift negative":    {dlock.WithDrift(-0.1, 0)},
		"fixed drift < 0":   {dlock.WithDrift(0.01, -time.Millisecond)},
		"TTL below drift":   {dlock.WithTTL(time.Millisecond)},
		"retry min > max":   {dlock.WithRetry(time.Second, time.Millisecond)},
		"retry zero":        {dlock.WithRetry(0, time.Second)},
		"owner empty":       {dlock.WithOwner("")},
		"owner spaces":      {dlock.WithOwner("a b")},
		"owner too long":    {dlock.WithOwner(strings.Repeat("a", 129))},
		"nil logger":        {dlock.WithLogger(nil)},
		"nil clock":         {dlock.WithClock(nil)},
		"nil option":        {nil},
		"resume, no owner":  {dlock.WithResume()},
	}
	for name, opts := range bad {
		if _, err := dlock.New(b, opts...); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := dlock.New(nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil backend: %v", err)
	}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Lock(ctx, "k", dlock.WithClock(clock.Real)); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("per-lock WithClock: %v", err)
	}
	if _, err := c.Lock(ctx, "k", dlock.WithTTL(-1)); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("per-lock bad TTL: %v", err)
	}
}

func TestOpenURLs(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"",
		"nosuch://host",
		"mem://x?bogus=1",
		"mem://x?ttl=abc",
		"mem://x?ttl=-1s",
		"mem://x?ttl=1s&renew=2s",
		"mem://x?owner=bad%20owner",
		"mem://x?ttl=1s&ttl=2s",
		"mem://x/path",
		"redis://user:hunter2@[::1",
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
			continue
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q) error shows the password: %v", u, err)
		}
	}
	c, err := dlock.Open(ctx, "mem://open-test?ttl=2s&renew=500ms&owner=me-1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 2*time.Second || l.Owner() != "me-1" {
		t.Fatalf("URL options not applied: ttl %v owner %q", l.TTL(), l.Owner())
	}
	// Explicit options override the URL.
	l2, err := c.Lock(ctx, "k2", dlock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l2.TTL() != 3*time.Second {
		t.Fatalf("option did not override URL: %v", l2.TTL())
	}
	_ = l.Release(ctx)
	_ = l2.Release(ctx)
}

func TestRedact(t *testing.T) {
	c, err := dlock.Open(context.Background(), "mem://redact")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	u := "redis://user:s3cret@host:6379/0?password=p4ss&prefix=app"
	pu, _ := url.Parse(u)
	got := driver.Redact(pu)
	if strings.Contains(got, "s3cret") || strings.Contains(got, "p4ss") || !strings.Contains(got, "prefix=app") {
		t.Fatalf("Redact = %q", got)
	}
}
