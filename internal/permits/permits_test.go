package permits

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dlockio/dlock/driver"
)

func TestSet(t *testing.T) {
	var s Set
	if s.Has("k", "a") || s.Shared("k", "a") {
		t.Fatal("an empty set has a permit")
	}
	s.Remember("k", "a", true)
	s.Remember("k", "b", false)
	s.Remember("k", "b", false) // again: counted once
	if !s.Has("k", "a") || !s.Shared("k", "a") || !s.Has("k", "b") || s.Shared("k", "b") || s.Has("j", "a") {
		t.Fatal("Has/Shared do not follow Remember")
	}
	s.Forget("k", "a")
	s.Forget("k", "a")
	if s.Has("k", "a") || !s.Has("k", "b") || s.n.Load() != 1 {
		t.Fatalf("after Forget: a %v, b %v, count %d", s.Has("k", "a"), s.Has("k", "b"), s.n.Load())
	}
}

func TestEither(t *testing.T) {
	var s Set
	s.Remember("k", "p", false)
	notHeld := fmt.Errorf("wrapped: %w", driver.ErrNotHeld)
	other := errors.New("boom")
	for _, c := range []struct {
		owner      string
		semOK      bool
		mutex, sem error
		want       error
		order      string
	}{
		{"m", true, nil, nil, nil, "m"},              // a mutex's grant: one call
		{"p", true, nil, nil, nil, "s"},              // a permit: the permit table first
		{"m", true, notHeld, nil, nil, "ms"},         // not a mutex's after all
		{"p", true, nil, notHeld, nil, "sm"},         // not a permit after all
		{"p", true, notHeld, notHeld, notHeld, "sm"}, // held nowhere
		{"m", false, notHeld, nil, notHeld, "m"},     // no permit table: no second call
		{"m", true, other, nil, other, "m"},          // another error stands
	} {
		var order string
		err := s.Either("k", c.owner, c.semOK,
			func() error { order += "m"; return c.mutex },
			func() error { order += "s"; return c.sem })
		if err != c.want || order != c.order {
			t.Errorf("%+v: error %v, calls %q", c, err, order)
		}
	}
}

func TestConcurrent(t *testing.T) {
	var s Set
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				o := fmt.Sprint(i, "-", j)
				s.Remember("k", o, j%2 == 0)
				if !s.Has("k", o) || s.Shared("k", o) != (j%2 == 0) {
					t.Error("lost a permit")
				}
				s.Forget("k", o)
			}
		})
	}
	wg.Wait()
	if s.n.Load() != 0 {
		t.Fatalf("count %d after every Forget", s.n.Load())
	}
}
