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

// A child's name carries its attempt's limit: none (1) in a mutex's GUID, as older
// versions write it; every contender is checked only against those queued before it.
func TestChildLimit(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 1_000_000, maxLimit} {
		g := newGUID(limit, false)
		name := childPrefix + "own-er:1-" + g + "-0000000042"
		c, ok := parseChild(name)
		if !ok || len(g) != guidLen || c.owner != "own-er:1" || c.guid != g || c.seq != 42 || c.limit != limit {
			t.Fatalf("limit %d: GUID %q, %q parses as %+v, %v", limit, g, name, c, ok)
		}
		if limit == 1 && strings.Trim(g, "0123456789abcdef") != "" {
			t.Fatalf("a mutex's GUID %q is not hex", g)
		}
	}
	for guid, want := range map[string]int{
		strings.Repeat("ab", 16):                    1,
		strings.Repeat("a", randLen) + "-n00000000": 0,
		strings.Repeat("a", randLen) + "-n00000001": 0,
		strings.Repeat("a", randLen) + "-n0000000x": 0,
		strings.Repeat("a", randLen) + "-n00000007": 7,
		strings.Repeat("a", randLen) + "-m00000007": 1,
	} {
		if got := guidLimit(guid); got != want {
			t.Errorf("guidLimit(%q) = %d, want %d", guid, got, want)
		}
	}
	q := []child{{seq: 1, limit: 2}, {seq: 2, limit: 2}, {seq: 3, limit: 3}, {seq: 4, limit: 2}}
	for _, c := range []struct {
		own        int64
		limit, cur int
		ok         bool
	}{{1, 5, 0, true}, {2, 2, 0, true}, {2, 3, 2, false}, {4, 2, 3, false}, {3, 3, 2, false}} {
		if cur, ok := checkLimit(q, c.own, c.limit); cur != c.cur || ok != c.ok {
			t.Errorf("checkLimit(own %d, limit %d) = %d, %v; want %d, %v", c.own, c.limit, cur, ok, c.cur, c.ok)
		}
	}
}

// A reader's child carries the reader's mark and limit 1; a writer's, a mutex's and
// every older version's read as exclusive.
func TestChildShared(t *testing.T) {
	g := newGUID(1, true)
	c, ok := parseChild(childPrefix + "r-" + g + "-0000000007")
	if !ok || len(g) != guidLen || !c.shared || c.limit != 1 || c.seq != 7 {
		t.Fatalf("reader GUID %q parses as %+v, %v", g, c, ok)
	}
	for _, g := range []string{newGUID(1, false), newGUID(3, false), strings.Repeat("ab", 16)} {
		if c, ok := parseChild(childPrefix + "w-" + g + "-0000000007"); !ok || c.shared {
			t.Fatalf("GUID %q parses as %+v, %v; want exclusive", g, c, ok)
		}
	}
	// Holders of a sorted queue: a writer alone, or the run of readers below the
	// first writer.
	r, w := child{shared: true, limit: 1}, child{limit: 1}
	for _, x := range []struct {
		q    []child
		want int
	}{
		{nil, 0}, {[]child{w, r, r}, 1}, {[]child{r, r, w, r}, 2}, {[]child{r, r, r}, 3},
		{[]child{{limit: 3}, {limit: 3}, {limit: 3}, {limit: 3}}, 3},
	} {
		if got := holding(x.q); got != x.want {
			t.Errorf("holding(%+v) = %d, want %d", x.q, got, x.want)
		}
	}
}
