package zklock

import (
	"net/url"
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
)

// FuzzLockPath checks that two keys never share a lock node, that a lock node is one
// node under the root whatever the key, and that nothing a nested root puts in a lock
// node (another root's lock nodes, "k-...", or floor nodes, "f-...") can be taken
// for a contender.
func FuzzLockPath(f *testing.F) {
	for _, s := range [][2]string{
		{"a/b", "a%2Fb"}, {"%", "%25"}, {"a b", "a%20b"}, {"a+b", "a b"}, {".", ".."},
		{"k-x", "x"}, {"lock-o-" + strings.Repeat("0", 32) + "-0000000001", "x"}, {"é", "%C3%A9"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k1, k2 string) {
		if driver.ValidateKey(k1) != nil || driver.ValidateKey(k2) != nil {
			t.Skip()
		}
		for _, root := range []string{"", "/dlock", "/dlock/k-x"} {
			b := &Backend{root: root}
			p1, p2 := b.LockPath(k1), b.LockPath(k2)
			if (p1 == p2) != (k1 == k2) {
				t.Fatalf("LockPath(%q) = %q, LockPath(%q) = %q", k1, p1, k2, p2)
			}
			node, ok := strings.CutPrefix(p1, root+"/k-")
			if !ok || node == "" || strings.Contains(node, "/") {
				t.Fatalf("LockPath(%q) = %q is not one node under %q", k1, p1, root)
			}
		}
		for _, name := range []string{"k-" + url.PathEscape(k1), "f-" + url.PathEscape(k1)} {
			if _, ok := parseChild(name); ok {
				t.Fatalf("%q is taken for a contender", name)
			}
		}
	})
}
