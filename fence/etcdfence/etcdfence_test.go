package etcdfence_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/etcdfence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/internal/testserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t testing.TB, srv *testserver.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestEtcd(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := client(t, srv)
	t.Run("Interleaved", func(t *testing.T) { testInterleaved(t, cli) })
	t.Run("PausedHolder", func(t *testing.T) { testPausedHolder(t, srv, cli) })
	t.Run("FullRange", func(t *testing.T) { testFullRange(t, cli) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, cli) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, cli) })
}

func testInterleaved(t *testing.T, cli *clientv3.Client) {
	var seq atomic.Int64
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		v := strconv.FormatUint(tk, 10)
		_, err := etcdfence.New(cli, "il/fence", tk).
			Then(clientv3.OpPut("il/log/"+strconv.FormatInt(seq.Add(1), 10), v), clientv3.OpPut("il/last", v)).
			Commit(ctx)
		return err
	}, func(ctx context.Context) []uint64 {
		resp, err := cli.Get(ctx, "il/log/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, kv := range resp.Kvs {
			n, _ := strconv.ParseUint(string(kv.Value), 10, 64)
			out = append(out, n)
		}
		return out
	})
}

// lockClient is a dlock client on its own etcd connection, and its backend.
func lockClient(t *testing.T, srv *testserver.Etcd) (*dlock.Client, *etcdlock.Backend) {
	b, err := etcdlock.New(context.Background(), client(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(b, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, b
}

// The old holder's lease ends (its member key is deleted, as its session's expiry
// would), and it writes: first before the new holder has written, which only the
// holder compare catches, then after, which the fence catches.
func testPausedHolder(t *testing.T, srv *testserver.Etcd, cli *clientv3.Client) {
	ctx := context.Background()
	ca, ba := lockClient(t, srv)
	cb, bb := lockClient(t, srv)
	write := func(l *dlock.Lease, member, body string) error {
		_, err := etcdfence.New(cli, "report/fence", uint64(l.Token())).
			Holder(member, int64(l.Token())).
			Then(clientv3.OpPut("report/body", body)).
			Commit(ctx)
		return err
	}
	old, err := ca.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	oldMember, err := etcdfence.Member(ctx, cli, ba.LockPrefix("report"), uint64(old.Token()))
	if err != nil {
		t.Fatal(err)
	}
	if err := write(old, oldMember, "old, before the pause"); err != nil {
		t.Fatal(err)
	}
	if err := ba.ForceRelease(ctx, "report"); err != nil {
		t.Fatal(err)
	}
	if err := write(old, oldMember, "old, lease gone"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("write after the lease ended: %v", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nw, err := cb.Lock(lctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	defer nw.Release(ctx)
	if _, err := etcdfence.Member(ctx, cli, bb.LockPrefix("report"), uint64(old.Token())); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Member for the old token: %v", err)
	}
	newMember, err := etcdfence.Member(ctx, cli, bb.LockPrefix("report"), uint64(nw.Token()))
	if err != nil {
		t.Fatal(err)
	}
	if err := write(nw, newMember, "new"); err != nil {
		t.Fatal(err)
	}
	err = write(old, oldMember, "old, after the pause")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Current != uint64(nw.Token()) {
		t.Fatalf("late write: %v", err)
	}
	// Without the holder compare, the fence alone refuses it too.
	if _, err := etcdfence.New(cli, "report/fence", uint64(old.Token())).Then(clientv3.OpPut("report/body", "x")).Commit(ctx); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("late write, fence only: %v", err)
	}
	if err := write(nw, newMember, "new, again"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "report/body")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "new, again" {
		t.Fatalf("body: %v %v", resp, err)
	}
}

func testFullRange(t *testing.T, cli *clientv3.Client) {
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		_, err := etcdfence.New(cli, "range/fence", tk).Then(clientv3.OpPut("range/v", strconv.FormatUint(tk, 10))).Commit(ctx)
		return err
	})
}

func testBadInput(t *testing.T, cli *clientv3.Client) {
	ctx := context.Background()
	put := clientv3.OpPut("bad/v", "x")
	if _, err := etcdfence.New(cli, "bad/fence", 0).Then(put).Commit(ctx); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	for _, name := range []string{"", "a\x00b", "a\nb", "\xff", strings.Repeat("k", fence.MaxResourceLen+1)} {
		if _, err := etcdfence.New(cli, name, 1).Then(put).Commit(ctx); !errors.Is(err, fence.ErrInvalid) || !strings.HasPrefix(err.Error(), "dlock: invalid argument: etcdfence: ") {
			t.Fatalf("fence key %q: %v", name, err)
		}
	}
	for _, op := range []clientv3.Op{clientv3.OpPut("bad/fence", "1"), clientv3.OpDelete("bad/fence")} {
		if _, err := etcdfence.New(cli, "bad/fence", 1).Then(op).Commit(ctx); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("op on the fence key: %v", err)
		}
	}
	if _, err := etcdfence.Member(ctx, cli, "bad/lock/", 0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("Member token 0: %v", err)
	}
	if resp, _ := cli.Get(ctx, "bad/", clientv3.WithPrefix()); len(resp.Kvs) != 0 {
		t.Fatalf("bad input wrote %v", resp.Kvs)
	}
	if _, err := cli.Put(ctx, "odd/fence", "12"); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdfence.New(cli, "odd/fence", 1).Then(put).Commit(ctx); err == nil || !strings.Contains(err.Error(), "not 20 decimal digits") {
		t.Fatalf("odd fence: %v", err)
	}
}

// A refused transaction applies none of the caller's operations.
func testRefused(t *testing.T, cli *clientv3.Client) {
	ctx := context.Background()
	if _, err := etcdfence.New(cli, "rf/fence", 10).Then(clientv3.OpPut("rf/a", "kept")).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := etcdfence.New(cli, "rf/fence", 9).Then(clientv3.OpPut("rf/a", "stale"), clientv3.OpPut("rf/b", "stale"), clientv3.OpDelete("rf/c")).Commit(ctx)
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale: %v", err)
	}
	// The caller's own compare fails: nothing written, the fence unchanged.
	resp, err := etcdfence.New(cli, "rf/fence", 11).
		If(clientv3.Compare(clientv3.Value("rf/a"), "=", "other")).
		Then(clientv3.OpPut("rf/b", "cond")).Commit(ctx)
	if !errors.Is(err, etcdfence.ErrConditionFailed) || resp == nil {
		t.Fatalf("condition: %v", err)
	}
	got, err := cli.Get(ctx, "rf/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 2 || string(got.Kvs[0].Key) != "rf/a" || string(got.Kvs[0].Value) != "kept" || string(got.Kvs[1].Value) != fence.Encode(10) {
		t.Fatalf("after refusals: %v", got.Kvs)
	}
	// Replies are the caller's, in order.
	r, err := etcdfence.New(cli, "rf/fence", 10).Then(clientv3.OpGet("rf/a")).Commit(ctx)
	if err != nil || len(r.Responses) != 1 || string(r.Responses[0].GetResponseRange().Kvs[0].Value) != "kept" {
		t.Fatalf("replies: %v %v", r, err)
	}
}
