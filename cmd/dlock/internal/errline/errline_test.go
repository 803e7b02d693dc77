package errline

import (
	"errors"
	"fmt"
	"testing"
)

func TestLine(t *testing.T) {
	base := errors.New("dlock: locked by another owner")
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"dlock: x", "x"},
		{errors.Join(base, errors.New("context deadline exceeded")).Error(), "locked by another owner; context deadline exceeded"},
		{fmt.Errorf("backend unreachable: %w", fmt.Errorf("dlock: lost: %w", base)).Error(), "backend unreachable: lost: locked by another owner"},
		{"dlock: lease lost\ndlock: lease lost", "lease lost"},
		{"failed to connect to `user=u`:\n\t127.0.0.1:1: refused\n127.0.0.1:1: refused\n", "failed to connect to `user=u`: 127.0.0.1:1: refused"},
		{"a\r\n\nb", "a; b"},
		{"cannot acquire \"k\" (dlock: timeout)", "cannot acquire \"k\" (timeout)"},
	} {
		if got := Line(c.in); got != c.want {
			t.Errorf("Line(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := Message("dlock: dlock: x"); got != "dlock: x" {
		t.Errorf("Message = %q", got)
	}
}
