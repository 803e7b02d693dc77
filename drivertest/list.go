package drivertest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// List: every held key under a prefix, ordered by key, one entry per holder
// (oldest first) with owner, token, value and TTL; not a key outside the prefix,
// not an expired grant, not a released one; the empty prefix lists everything.
func (h Harness) testList(t *testing.T) {
	ctx := ctxT(t)
	c := h.Client(t)
	if _, ok := c.Backend().(driver.Lister); !ok {
		if _, err := c.List(ctx, "x"); !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("List on a backend that is not a Lister: %v, want ErrUnsupported", err)
		}
		t.Skip("backend is not a Lister")
	}
	p := Key(t, "p") + "/"
	_, values := c.Backend().(driver.Valuer)
	var opts []dlock.Option
	if values {
		opts = append(opts, dlock.WithValue([]byte("v")))
	}
	a := MustLock(t, ctx, h.Client(t), p+"a", opts...)
	var bs []*dlock.Lease
	limit := 1
	if _, ok := c.Backend().(driver.Semaphorer); ok {
		limit = 2
	}
	for range limit {
		bs = append(bs, MustLock(t, ctx, h.Client(t), p+"b", dlock.WithLimit(limit)))
	}
	gone := MustLock(t, ctx, h.Client(t), p+"c")
	h.Expire(t, p+"c")
	freed := MustLock(t, ctx, h.Client(t), p+"d")
	MustRelease(t, ctx, freed)
	outside := MustLock(t, ctx, h.Client(t), Key(t, "q"))

	got, err := c.List(ctx, p)
	if err != nil {
		t.Fatalf("List(%q): %v", p, err)
	}
	want := []string{fmt.Sprint(p+"a ", a.Owner(), " ", a.Token())}
	for _, l := range bs {
		want = append(want, fmt.Sprint(p+"b ", l.Owner(), " ", l.Token()))
	}
	var gotS []string
	for _, in := range got {
		gotS = append(gotS, fmt.Sprint(in.Key, " ", in.Owner, " ", in.Token))
		if in.TTL <= 0 || in.Shared {
			t.Errorf("entry %+v: want a TTL left, not shared", in)
		}
	}
	if !slices.Equal(gotS, want) {
		t.Fatalf("List(%q) =\n  %q\nwant\n  %q", p, gotS, want)
	}
	if values && string(got[0].Value) != "v" {
		t.Fatalf("value of %s listed as %q, want \"v\"", p+"a", got[0].Value)
	}
	all, err := c.List(ctx, "")
	if err != nil {
		t.Fatalf("List(\"\"): %v", err)
	}
	var n int
	for _, in := range all {
		if in.Key == outside.Key() || in.Key == p+"a" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("List(\"\") lists %d of the two keys it must (%d entries)", n, len(all))
	}
	for _, l := range append(bs, a, outside) {
		MustRelease(t, ctx, l)
	}
	_ = gone.Release(ctx)
	if got, err := c.List(ctx, p); err != nil || len(got) != 0 {
		t.Fatalf("List(%q) once every key is released = %+v, %v", p, got, err)
	}
	if _, err := c.List(ctx, "bad\x00"); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("List of a bad prefix: %v, want ErrInvalid", err)
	}
}
