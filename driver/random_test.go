package driver

import (
	"encoding/hex"
	"testing"
)

func TestRandomHex(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range []int{1, 8, 16, 32, 33, 100} {
		for range 50 {
			s := RandomHex(n)
			b, err := hex.DecodeString(s)
			if err != nil || len(b) != n {
				t.Fatalf("RandomHex(%d) = %q: not %d hex-encoded bytes (%v)", n, s, n, err)
			}
			if n >= 8 && seen[s] {
				t.Fatalf("RandomHex(%d) repeated %q", n, s)
			}
			seen[s] = true
		}
	}
}
