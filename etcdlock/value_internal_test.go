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
		limit int
		value []byte
		want  string
	}{
		{"alice", 1, nil, "alice"},
		{"alice", 0, []byte{}, "alice"},
		{"alice", 1, []byte("10.0.0.1:80"), "alice\x0010.0.0.1:80"},
		{"a", 1, []byte("\x00\x00"), "a\x00\x00\x00"},
		{"alice", 3, nil, "alice\x013"},
		{"alice", 12, []byte("v"), "alice\x0112\x00v"},
		{"a", 2, []byte("\x01\x00"), "a\x012\x00\x01\x00"},
	} {
		v := memberValue(c.owner, c.limit, c.value)
		if v != c.want {
			t.Errorf("memberValue(%q, %d, %q) = %q, want %q", c.owner, c.limit, c.value, v, c.want)
		}
		owner, limit, value := parseMember([]byte(v))
		if owner != c.owner || limit != max(c.limit, 1) || !bytes.Equal(value, c.value) || (len(c.value) == 0 && value != nil) {
			t.Errorf("parseMember(%q) = %q, %d, %q; want %q, %d, %q", v, owner, limit, value, c.owner, c.limit, c.value)
		}
		if o := ownerOf([]byte(v)); o != c.owner {
			t.Errorf("ownerOf(%q) = %q", v, o)
		}
	}
}

func TestReaderValue(t *testing.T) {
	for _, c := range []struct {
		owner string
		value []byte
		want  string
	}{
		{"alice", nil, "alice\x02"},
		{"alice", []byte("v"), "alice\x02\x00v"},
		{"a", []byte("\x02\x01"), "a\x02\x00\x02\x01"},
	} {
		v := readerValue(c.owner, c.value)
		if v != c.want {
			t.Errorf("readerValue(%q, %q) = %q, want %q", c.owner, c.value, v, c.want)
		}
		owner, limit, value := parseMember([]byte(v))
		if owner != c.owner || limit != 1 || !bytes.Equal(value, c.value) || !sharedOf([]byte(v)) || ownerOf([]byte(v)) != c.owner {
			t.Errorf("parseMember(%q) = %q, %d, %q, shared %v", v, owner, limit, value, sharedOf([]byte(v)))
		}
	}
	for _, v := range []string{"alice", "alice\x00\x02", "alice\x013\x00\x02", memberValue("a", 1, []byte("\x02"))} {
		if sharedOf([]byte(v)) {
			t.Errorf("sharedOf(%q) = true", v)
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
		{memberValue(owner, 1, nil), true},
		{memberValue(owner, 1, []byte("v")), true},
		{memberValue(owner, 1, []byte{0xff, 0xff}), true},
		{memberValue(owner, 1, []byte{0}), true},
		{memberValue(owner, 3, nil), true},
		{memberValue(owner, 99, []byte{0xff}), true},
		{memberValue("ab-", 3, nil), false},
		{memberValue("ab-10", 3, nil), false},
		{memberValue("ab-", 1, nil), false},
		{memberValue("ab-", 1, []byte{0xff}), false},
		{memberValue("ab-0", 1, nil), false},
		{memberValue("ab-0", 1, []byte{0xff, 0xff, 0xff}), false},
		{memberValue("ab-0z", 1, nil), false},
		{memberValue("ab-10", 1, nil), false},
		{memberValue("ab-1.", 1, []byte("v")), false},
		{memberValue("ab-2", 1, nil), false},
		{readerValue(owner, nil), true},
		{readerValue(owner, []byte{0xff, 0xff}), true},
		{readerValue("ab-", nil), false},
		{readerValue("ab-10", nil), false},
		{owner + "\x03", false},
		{memberValue("a", 1, nil), false},
		{memberValue("b", 1, nil), false},
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
