package etcdlock

import (
	"bytes"
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock/internal/testserver"
)

func TestMemberValue(t *testing.T) {
	for _, c := range []struct {
		owner string
		value []byte
		want  string
	}{
		{"alice", nil, "alice"},
		{"alice", []byte{}, "alice"},
		{"alice", []byte("10.0.0.1:80"), "alice\x0010.0.0.1:80"},
		{"a", []byte("\x00\x00"), "a\x00\x00\x00"},
	} {
		v := memberValue(c.owner, c.value)
		if v != c.want {
			t.Errorf("memberValue(%q, %q) = %q, want %q", c.owner, c.value, v, c.want)
		}
		owner, value := splitMember([]byte(v))
		if owner != c.owner || !bytes.Equal(value, c.value) || (len(c.value) == 0 && value != nil) {
			t.Errorf("splitMember(%q) = %q, %q; want %q, %q", v, owner, value, c.owner, c.value)
		}
		if o := ownerOf([]byte(v)); o != c.owner {
			t.Errorf("ownerOf(%q) = %q", v, o)
		}
	}
}

// ownedBy, evaluated by etcd, matches the member values of its owner, with a value
// or without, and no other owner's, also owners that are a prefix of it or that it
// is a prefix of, or that differ only in the last byte.
func TestOwnedBy(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	owner := "ab-1"
	for _, c := range []struct {
		stored string
		want   bool
	}{
		{memberValue(owner, nil), true},
		{memberValue(owner, []byte("v")), true},
		{memberValue(owner, []byte{0xff, 0xff}), true},
		{memberValue(owner, []byte{0}), true},
		{memberValue("ab-", nil), false},
		{memberValue("ab-", []byte{0xff}), false},
		{memberValue("ab-0", nil), false},
		{memberValue("ab-0", []byte{0xff, 0xff, 0xff}), false},
		{memberValue("ab-0z", nil), false},
		{memberValue("ab-10", nil), false},
		{memberValue("ab-1.", []byte("v")), false},
		{memberValue("ab-2", nil), false},
		{memberValue("a", nil), false},
		{memberValue("b", nil), false},
		{"", false},
	} {
		if _, err := cli.Put(ctx, "m", c.stored); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Txn(ctx).If(ownedBy("m", owner)...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded != c.want {
			t.Errorf("ownedBy(%q) on %q = %v, want %v", owner, c.stored, resp.Succeeded, c.want)
		}
	}
	if _, err := cli.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Txn(ctx).If(ownedBy("m", owner)...).Commit(); err != nil || resp.Succeeded {
		t.Errorf("ownedBy on a missing key = %v, %v; want false", resp.Succeeded, err)
	}
}
