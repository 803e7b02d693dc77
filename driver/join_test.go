package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestJoin(t *testing.T) {
	if Join(nil, nil) != nil {
		t.Fatal("Join of nils is not nil")
	}
	if err := Join(nil, ErrLocked); err != ErrLocked {
		t.Fatalf("Join of one error = %v, want it unchanged", err)
	}
	lost := fmt.Errorf("%w: renewal refused", ErrNotHeld)
	for _, c := range []struct {
		errs []error
		want string
	}{
		{[]error{&HeldError{}, context.DeadlineExceeded}, "dlock: locked by another owner; context deadline exceeded"},
		{[]error{lost, lost}, lost.Error()},
		{[]error{ErrNotHeld, lost}, lost.Error()},
		{[]error{lost, ErrNotHeld}, lost.Error()},
		{[]error{errors.New("a\nb"), errors.New("c")}, "a; b; c"},
		{[]error{errors.New("two\nlines")}, "two; lines"},
	} {
		err := Join(c.errs...)
		if got := err.Error(); got != c.want {
			t.Errorf("Join(%q) = %q, want %q", c.errs, got, c.want)
		}
		for _, e := range c.errs {
			if !errors.Is(err, e) {
				t.Errorf("Join(%q) does not match %v", c.errs, e)
			}
		}
	}
}
