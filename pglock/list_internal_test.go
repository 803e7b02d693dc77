package pglock

import "testing"

func TestSuccessor(t *testing.T) {
	for _, tc := range []struct {
		prefix, want string
		ok           bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"a%", "a&", true},
		{"é", "ê", true},
		{"a\uD7FF", "a\uE000", true},
		{"f\U0010FFFF", "g", true},
		{"\U0010FFFF\U0010FFFF", "", false},
	} {
		if got, ok := successor(tc.prefix); got != tc.want || ok != tc.ok {
			t.Errorf("successor(%q) = %q, %v, want %q, %v", tc.prefix, got, ok, tc.want, tc.ok)
		}
	}
}
