package etcdlock

import (
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
)

// Pairs of (prefix, key) that spell one string, or one the start of the other,
// when the parts are joined with "/" (as lock ranges were before they ended in
// 0x1f), or that escape alike.
var trickyNames = [][4]string{
	{"app", "jobs", "app/jobs", "nightly"},
	{"app", "jobs/nightly", "app/jobs", "nightly"},
	{"a", "b/c", "a/b", "c"},
	{"a", "b%2Fc", "a/b", "c"},
	{"a%2Fb", "c", "a", "b/c"},
	{"a", "%2F", "a", "/"},
	{"a", "%", "a", "%25"},
	{"a", "/", "a/", "/"},
	{"a/b", "c/d", "a/b/c", "d"},
	{"a", "b c", "a/b", " c"},
	{"dlock", "x", "dlock/x", "x"},
	{"a", "k", "a", "k"},
	{"/a/", "k", "a", "k"},
}

// prefixOf returns what WithPrefix keeps of p, or false if it refuses p.
func prefixOf(p string) (string, bool) {
	var o config
	if WithPrefix(p)(&o) != nil {
		return "", false
	}
	return o.prefix, true
}

// FuzzLockPrefix checks that the lock ranges of two different (prefix, key) pairs
// are disjoint: neither range's start is a prefix of the other's, so no member key
// of one lock is read as a member of the other, and that the backend's other keys
// (the floor's, the idle watch's) lie in no lock's range. Under "/" as the range's
// end, the first pair failed: lock "jobs" under "app" read "app/jobs/nightly/...".
func FuzzLockPrefix(f *testing.F) {
	for _, s := range trickyNames {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, p1, k1, p2, k2 string) {
		p1, ok1 := prefixOf(p1)
		p2, ok2 := prefixOf(p2)
		if !ok1 || !ok2 || driver.ValidateKey(k1) != nil || driver.ValidateKey(k2) != nil {
			t.Skip()
		}
		r1, r2 := lockPrefix(p1, k1), lockPrefix(p2, k2)
		same := p1 == p2 && k1 == k2
		if same != (r1 == r2) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", p1, k1, r1, p2, k2, r2)
		}
		if !same && (strings.HasPrefix(r1, r2) || strings.HasPrefix(r2, r1)) {
			t.Fatalf("the ranges of (%q, %q) and (%q, %q) overlap: %q, %q", p1, k1, p2, k2, r1, r2)
		}
		for _, other := range []string{p2 + "/\x00floor/" + k2, p2 + "/\x00idle"} {
			if strings.HasPrefix(other, r1) {
				t.Fatalf("%q is in the range of (%q, %q)", other, p1, k1)
			}
		}
		if !strings.HasPrefix(r1, p1+"/") {
			t.Fatalf("the range of (%q, %q), %q, is outside the prefix range", p1, k1, r1)
		}
	})
}

// TestOurs checks that a member name is told to be this backend's own by its last
// part only, not by an id that a prefix or a key can spell.
func TestOurs(t *testing.T) {
	b := &Backend{id: "00ff"}
	for name, want := range map[string]bool{
		lockPrefix("p", "k") + "00ff.3":         true,
		lockPrefix("p", "k") + "00ee.0":         false,
		lockPrefix("p/00ff.1", "k") + "00ee.0":  false,
		lockPrefix("p", "x/00ff.1") + "00ee.0":  false,
		lockPrefix("p", "x\\00ff.1") + "00ee.0": false,
	} {
		if got := b.ours(name); got != want {
			t.Errorf("ours(%q) = %v, want %v", name, got, want)
		}
	}
}
