package etcdlock

import "testing"

func TestLockKeyOf(t *testing.T) {
	for _, key := range []string{"a", "a/b", "%", "%2F", "%25/%", "a*?[]_\\"} {
		name := lockPrefix("p", key) + "0123.0"
		if got, ok := lockKeyOf("p", name); !ok || got != key {
			t.Errorf("lockKeyOf of the member of %q = %q, %v", key, got, ok)
		}
		if _, ok := lockKeyOf("p", limitKey(lockPrefix("p", key))); ok {
			t.Errorf("the limit key of %q decoded as a member key", key)
		}
		if _, ok := lockKeyOf("p", tailKey(lockPrefix("p", key))); ok {
			t.Errorf("the tail key of %q decoded as a member key", key)
		}
		if _, ok := lockKeyOf("p", lockPrefix("p/q", key)+"0123.0"); ok {
			t.Errorf("a member of %q under the nested prefix p/q decoded as one under p", key)
		}
	}
	for _, name := range []string{"p/\x00idle", "p/\x00floor/k", "q/a\x1f0", "pa\x1f0"} {
		if k, ok := lockKeyOf("p", name); ok {
			t.Errorf("lockKeyOf(%q) = %q, want none", name, k)
		}
	}
}
