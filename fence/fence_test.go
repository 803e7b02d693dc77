package fence_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheck(t *testing.T) {
	if err := fence.Check("r", 5, 5); err != nil {
		t.Fatalf("equal token: %v", err)
	}
	if err := fence.Check("r", 5, 6); err != nil {
		t.Fatalf("higher token: %v", err)
	}
	err := fence.Check("r", 7, 6)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Current != 7 || se.Token != 6 || se.Resource != "r" {
		t.Fatalf("lower token: %v", err)
	}
	if !strings.Contains(err.Error(), "6 is lower than 7") {
		t.Fatalf("message: %v", err)
	}
	if err := fence.Check("r", 0, 0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	if err := fence.CheckToken(0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("CheckToken(0): %v", err)
	}
}

func TestCheckResource(t *testing.T) {
	for _, bad := range []string{"", "a\x00b", "a\nb", "\xff", strings.Repeat("x", fence.MaxResourceLen+1)} {
		err := fence.CheckResource("g", bad)
		if !errors.Is(err, fence.ErrInvalid) || !errors.Is(err, dlock.ErrInvalid) || !strings.HasPrefix(err.Error(), "dlock: invalid argument: g: ") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	for _, good := range []string{"a", "orders/42", "ünïcode", strings.Repeat("x", fence.MaxResourceLen)} {
		if err := fence.CheckResource("g", good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}

func TestEncode(t *testing.T) {
	vals := []uint64{0, 1, 9, 10, 1 << 53, 1<<53 + 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64 - 1, math.MaxUint64}
	for i, v := range vals {
		s := fence.Encode(v)
		if len(s) != fence.EncodedLen {
			t.Fatalf("%d: %q", v, s)
		}
		back, err := fence.Decode(s)
		if err != nil || back != v {
			t.Fatalf("Decode(%q) = %d, %v", s, back, err)
		}
		if i > 0 && !(fence.Encode(vals[i-1]) < s) {
			t.Fatalf("order: %q !< %q", fence.Encode(vals[i-1]), s)
		}
	}
	for _, bad := range []string{"", "1", "+0000000000000000001", "99999999999999999999", "0000000000000000000x"} {
		if _, err := fence.Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
}

func TestOffset(t *testing.T) {
	if v, err := fence.Offset(1000).Apply(5); err != nil || v != 1005 {
		t.Fatalf("Apply: %d, %v", v, err)
	}
	if _, err := fence.Offset(1000).Apply(0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("Apply(0): %v", err)
	}
	if _, err := fence.Offset(2).Apply(math.MaxUint64 - 1); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("overflow: %v", err)
	}
	if v, err := fence.Offset(1).Apply(math.MaxUint64 - 1); err != nil || v != math.MaxUint64 {
		t.Fatalf("edge: %d, %v", v, err)
	}
}
