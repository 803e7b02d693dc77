package redisops

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

func openT(t *testing.T, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("Open(%s): %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The floor cycle leaves nothing behind and costs the server four commands (SET,
// EVALSHA, and GET and DEL inside the script); reading Ops costs none.
func TestRedisFloorAndOps(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := openT(t, srv.URL()+"?prefix=ignored&ttl=5s")
	if s.OpsSource() == "" {
		t.Fatal("no OpsSource")
	}
	if err := s.FloorCycle(ctx, "a b\x1fc"); err != nil { // loads the script
		t.Fatal(err)
	}
	before, err := s.Ops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Ops(ctx); err != nil || again != before {
		t.Fatalf("Ops read twice: %d then %d (%v)", before, again, err)
	}
	if err := s.FloorCycle(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	after, err := s.Ops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after-before != 4 {
		t.Fatalf("a floor cycle made %d server operations, want 4", after-before)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("keys after floor cycles: %d (%v)", n, err)
	}
	// A held floor key is an error, not a second holder.
	if err := rdb.Set(ctx, "held", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.FloorCycle(ctx, "held"); err == nil {
		t.Fatal("FloorCycle on a held key succeeded")
	}
}

// The schemes and the TLS parameters: rediss:// and redis://?tls=true with the CA
// reach a TLS port; without the CA the certificate is refused.
func TestRedisOpen(t *testing.T) {
	for _, s := range []string{"redis", "rediss", "unix"} {
		if _, err := storeops.Open(context.Background(), s+"://127.0.0.1:1/?tls_cert=only"); err == nil {
			t.Errorf("%s: Open with tls_cert alone succeeded", s)
		}
	}
	files := testserver.NewTLSFiles(t)
	_, port := testserver.StartRedisTLS(t, files)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	host := "127.0.0.1:" + strconv.Itoa(port)
	ca := "tls_ca=" + url.QueryEscape(files.CA)
	for _, raw := range []string{"rediss://" + host + "/0?" + ca, "redis://" + host + "?tls=true&" + ca, "rediss://" + host + "?skip_verify=true"} {
		if err := openT(t, raw).FloorCycle(ctx, "k"); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
	if s, err := storeops.Open(ctx, "rediss://"+host); err == nil {
		s.Close()
		t.Fatal("Open without the CA succeeded")
	}
}
