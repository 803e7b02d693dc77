package redisfence_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/fence/redisfence"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t testing.TB, srv *testserver.Redis) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestRedis(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := client(t, srv)
	t.Run("Interleaved", func(t *testing.T) { testInterleaved(t, rdb) })
	t.Run("PausedHolder", func(t *testing.T) { testPausedHolder(t, srv, rdb) })
	t.Run("FullRange", func(t *testing.T) { testFullRange(t, rdb) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, rdb) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, rdb) })
	t.Run("Replies", func(t *testing.T) { testReplies(t, rdb) })
}

func testInterleaved(t *testing.T, rdb *redis.Client) {
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		_, err := redisfence.Exec(ctx, rdb, "il:fence", tk,
			redisfence.Command("RPUSH", redisfence.Key("il:log"), tk),
			redisfence.Command("SET", redisfence.Key("il:last"), tk))
		return err
	}, func(ctx context.Context) []uint64 {
		vals, err := rdb.LRange(ctx, "il:log", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, v := range vals {
			n, _ := strconv.ParseUint(v, 10, 64)
			out = append(out, n)
		}
		return out
	})
	if v, err := rdb.Get(context.Background(), "il:last").Result(); err != nil || v != "280" {
		t.Fatalf("last: %q %v", v, err)
	}
}

func testPausedHolder(t *testing.T, srv *testserver.Redis, rdb *redis.Client) {
	ctx := context.Background()
	c, err := dlock.Open(ctx, srv.URL()+"?ttl=30s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fencetest.PausedHolder(t, c, "report", func(l *dlock.Lease, body string) error {
		_, err := redisfence.Exec(ctx, rdb, "report:fence", uint64(l.Token()), redisfence.Command("SET", redisfence.Key("report"), body))
		return err
	})
	if v, _ := rdb.Get(ctx, "report").Result(); v != "new, again" {
		t.Fatalf("report: %q", v)
	}
}

func testFullRange(t *testing.T, rdb *redis.Client) {
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		_, err := redisfence.Exec(ctx, rdb, "range:fence", tk, redisfence.Command("SET", redisfence.Key("range"), tk))
		return err
	})
	if v, _ := rdb.Get(context.Background(), "range").Uint64(); v != 1<<64-1 {
		t.Fatalf("range: %d", v)
	}
}

func testBadInput(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	set := redisfence.Command("SET", redisfence.Key("bad"), "x")
	if _, err := redisfence.Exec(ctx, rdb, "bad:fence", 0, set); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	for _, name := range []string{"", "a\x00b", "a\r\nb", "\xff", strings.Repeat("k", fence.MaxResourceLen+1)} {
		if _, err := redisfence.Exec(ctx, rdb, name, 1, set); !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), "dlock: invalid argument: redisfence: ") {
			t.Fatalf("fence key %q: %v", name, err)
		}
	}
	for _, c := range []redisfence.Cmd{
		redisfence.Command("", redisfence.Key("bad")),
		redisfence.Command("SET x", redisfence.Key("bad"), "1"),
		redisfence.Command("SET", redisfence.Key("bad:fence"), "1"), // the fence itself
		redisfence.Command("SET", redisfence.Key(""), "1"),
	} {
		if _, err := redisfence.Exec(ctx, rdb, "bad:fence", 1, c); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("%+v: %v", c, err)
		}
	}
	if n, _ := rdb.Exists(ctx, "bad", "bad:fence").Result(); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
	// A fence key that holds something else is an error, not a token.
	rdb.Set(ctx, "odd:fence", "12", 0)
	if _, err := redisfence.Exec(ctx, rdb, "odd:fence", 1, set); err == nil || !strings.Contains(err.Error(), "not a fencing token") {
		t.Fatalf("odd fence: %v", err)
	}
}

// A refused write runs none of its commands.
func testRefused(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	if _, err := redisfence.Exec(ctx, rdb, "rf:fence", 10, redisfence.Command("SET", redisfence.Key("rf:a"), "kept")); err != nil {
		t.Fatal(err)
	}
	_, err := redisfence.Exec(ctx, rdb, "rf:fence", 9,
		redisfence.Command("SET", redisfence.Key("rf:a"), "stale"),
		redisfence.Command("SET", redisfence.Key("rf:b"), "stale"),
		redisfence.Command("DEL", redisfence.Key("rf:a")))
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale: %v", err)
	}
	if v, _ := rdb.Get(ctx, "rf:a").Result(); v != "kept" {
		t.Fatalf("rf:a: %q", v)
	}
	if n, _ := rdb.Exists(ctx, "rf:b").Result(); n != 0 {
		t.Fatal("rf:b written by a stale write")
	}
	if v, _ := rdb.Get(ctx, "rf:fence").Result(); v != fence.Encode(10) {
		t.Fatalf("fence: %q", v)
	}
}

func testReplies(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	k := redisfence.Key("rp:{h}")
	res, err := redisfence.Exec(ctx, rdb, "rp:fence", 3,
		redisfence.Command("SET", k, "v"),
		redisfence.Command("GET", k),
		redisfence.Command("GET", redisfence.Key("rp:missing")),
		redisfence.Command("INCRBY", redisfence.Key("rp:n"), 5),
		redisfence.Command("HSET", redisfence.Key("rp:hash"), "f1", "a", "f2", []byte("b")))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"OK", "v", nil, int64(5), int64(2)}
	if len(res) != len(want) {
		t.Fatalf("replies %#v", res)
	}
	for i := range want {
		if res[i] != want[i] {
			t.Fatalf("reply %d: %#v, want %#v (all: %#v)", i, res[i], want[i], res)
		}
	}
	// No commands: the fence alone moves.
	if _, err := redisfence.Exec(ctx, rdb, "rp:fence", 4); err != nil {
		t.Fatal(err)
	}
	// Documented: Redis does not roll back a command that fails half-way.
	_, err = redisfence.Exec(ctx, rdb, "rp:fence", 5,
		redisfence.Command("SET", redisfence.Key("rp:first"), "applied"),
		redisfence.Command("HSET", k, "f", "x")) // WRONGTYPE
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("wrong type: %v", err)
	}
	if v, _ := rdb.Get(ctx, "rp:first").Result(); v != "applied" {
		t.Fatalf("rp:first: %q", v)
	}
}
