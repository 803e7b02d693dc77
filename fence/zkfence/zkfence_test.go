package zkfence_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/fence/zkfence"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/zklock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type silent struct{}

func (silent) Printf(string, ...any) {}

func conn(t testing.TB, srv *testserver.ZooKeeper) *zk.Conn {
	t.Helper()
	c, events, err := zk.Connect([]string{srv.Addr()}, 10*time.Second, zk.WithLogger(silent{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for range events {
		}
	})
	for ev := range events {
		if ev.State == zk.StateHasSession {
			break
		}
	}
	return c
}

func guard(t testing.TB, c *zk.Conn, root string) *zkfence.Guard {
	t.Helper()
	g, err := zkfence.New(c, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestZooKeeper(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	c := conn(t, srv)
	if _, err := c.Create("/data", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	t.Run("Interleaved", func(t *testing.T) { testInterleaved(t, srv, c) })
	t.Run("PausedHolder", func(t *testing.T) { testPausedHolder(t, srv, c) })
	t.Run("FullRange", func(t *testing.T) { testFullRange(t, c) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, c) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, c) })
}

func testInterleaved(t *testing.T, srv *testserver.ZooKeeper, c *zk.Conn) {
	// Two guards on two sessions, so that each one's remembered versions go stale.
	gs := []*zkfence.Guard{guard(t, c, "/fences/il"), guard(t, conn(t, srv), "/fences/il")}
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		g := gs[tk%2]
		_, err := g.Write(ctx, "item", tk,
			&zk.CreateRequest{Path: "/data/il-", Data: []byte(strconv.FormatUint(tk, 10)), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagSequence})
		return err
	}, func(ctx context.Context) []uint64 {
		names, _, err := c.Children("/data")
		if err != nil {
			t.Fatal(err)
		}
		byseq := map[int]uint64{}
		for _, name := range names {
			if !strings.HasPrefix(name, "il-") {
				continue
			}
			data, _, err := c.Get("/data/" + name)
			if err != nil {
				t.Fatal(err)
			}
			seq, _ := strconv.Atoi(strings.TrimPrefix(name, "il-"))
			byseq[seq], _ = strconv.ParseUint(string(data), 10, 64)
		}
		var out []uint64
		for i := range 1 << 20 {
			if len(out) == len(byseq) {
				break
			}
			if v, ok := byseq[i]; ok {
				out = append(out, v)
			}
		}
		return out
	})
}

func testPausedHolder(t *testing.T, srv *testserver.ZooKeeper, c *zk.Conn) {
	ctx := context.Background()
	g := guard(t, c, "/fences/ph")
	lc, err := dlock.Open(ctx, srv.URL("/locks")+"?ttl=30s")
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if _, err := c.Create("/data/report", []byte("empty"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	fencetest.PausedHolder(t, lc, "report", func(l *dlock.Lease, body string) error {
		_, err := g.Write(ctx, "report", uint64(l.Token()), &zk.SetDataRequest{Path: "/data/report", Data: []byte(body), Version: -1})
		return err
	})
	if data, _, err := c.Get("/data/report"); err != nil || string(data) != "new, again" {
		t.Fatalf("report: %q %v", data, err)
	}
}

func testFullRange(t *testing.T, c *zk.Conn) {
	g := guard(t, c, "/fences/range")
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		_, err := g.Write(ctx, "r", tk)
		return err
	})
}

func testBadInput(t *testing.T, c *zk.Conn) {
	ctx := context.Background()
	for _, root := range []string{"", "rel", "/a/", "/a//b", "/a/../b"} {
		if _, err := zkfence.New(c, root, nil); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("root %q: %v", root, err)
		}
	}
	g := guard(t, c, "/fences/bad")
	if _, err := g.Write(ctx, "r", 0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	for _, name := range []string{"", ".", "..", "a\x00b", "a\nb", "\xff", strings.Repeat("k", fence.MaxResourceLen+1)} {
		if _, err := g.Write(ctx, name, 1); !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), "dlock: invalid argument: zkfence: ") {
			t.Fatalf("resource %q: %v", name, err)
		}
	}
	if _, err := g.Write(ctx, "r", 1, &zk.SetDataRequest{Path: g.Path("r"), Data: []byte("1"), Version: -1}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("op on the fence node: %v", err)
	}
	if _, err := g.Write(ctx, "r", 1, "not an op"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("bad op: %v", err)
	}
	if ok, _, _ := c.Exists("/fences/bad"); ok {
		t.Fatal("bad input created nodes")
	}
	// Slashes are escaped: one node per resource name.
	if _, err := g.Write(ctx, "a/b", 1); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := c.Exists("/fences/bad/a%2Fb"); !ok {
		t.Fatal("a/b not at /fences/bad/a%2Fb")
	}
	if _, err := c.Create("/fences/bad/odd", []byte("12"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(ctx, "odd", 1); err == nil || !strings.Contains(err.Error(), "not 20 decimal digits") {
		t.Fatalf("odd fence: %v", err)
	}
}

// A refused write applies none of the caller's operations; a failing operation of
// the caller leaves the fence where it was.
func testRefused(t *testing.T, c *zk.Conn) {
	ctx := context.Background()
	g := guard(t, c, "/fences/rf")
	acl := zk.WorldACL(zk.PermAll)
	if _, err := g.Write(ctx, "r", 10, &zk.CreateRequest{Path: "/data/rf-a", Data: []byte("kept"), Acl: acl}); err != nil {
		t.Fatal(err)
	}
	_, err := g.Write(ctx, "r", 9,
		&zk.SetDataRequest{Path: "/data/rf-a", Data: []byte("stale"), Version: -1},
		&zk.CreateRequest{Path: "/data/rf-b", Data: []byte("stale"), Acl: acl})
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale: %v", err)
	}
	// Another guard (another process) moved the fence; this one still remembers 10.
	other := guard(t, c, "/fences/rf")
	if _, err := other.Write(ctx, "r", 12); err != nil {
		t.Fatal(err)
	}
	var se *fence.StaleError
	if _, err := g.Write(ctx, "r", 11, &zk.CreateRequest{Path: "/data/rf-b", Data: []byte("stale"), Acl: acl}); !errors.As(err, &se) || se.Current != 12 {
		t.Fatalf("stale after another writer: %v", err)
	}
	// The caller's op fails (the node exists): nothing written, the fence unchanged.
	if _, err := g.Write(ctx, "r", 13, &zk.CreateRequest{Path: "/data/rf-a", Data: []byte("dup"), Acl: acl}); !errors.Is(err, zk.ErrNodeExists) {
		t.Fatalf("failing op: %v", err)
	}
	if data, _, _ := c.Get(g.Path("r")); string(data) != fence.Encode(12) {
		t.Fatalf("fence: %q", data)
	}
	if data, _, _ := c.Get("/data/rf-a"); string(data) != "kept" {
		t.Fatalf("rf-a: %q", data)
	}
	if ok, _, _ := c.Exists("/data/rf-b"); ok {
		t.Fatal("rf-b written by a refused write")
	}
	// Responses are the caller's.
	resp, err := g.Write(ctx, "r", 12, &zk.SetDataRequest{Path: "/data/rf-a", Data: []byte("kept2"), Version: -1})
	if err != nil || len(resp) != 1 || resp[0].Stat == nil || resp[0].Stat.Version != 1 {
		t.Fatalf("responses: %+v %v", resp, err)
	}
}
