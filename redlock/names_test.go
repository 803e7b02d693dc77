package redlock

import (
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
)

// Triples of (prefix, key, owner) whose key names met when the parts were joined
// with ":" (before 0x1f separated them).
var trickyNames = [][6]string{
	{"a", "b:lock:c", "o", "a:lock:b", "c", "o"},   // one lock key
	{"a:wait", "z", "o", "a", "lock:z", "o"},       // a lock key and a wait set
	{"a", "fence:z", "o", "a:lock", "z", "o"},      // a fence key and a lock key
	{"a", "x:y", "o", "a", "x", "y:o"},             // two waiter keys
	{"a", "lock", "z", "a:waiter", "z", "o"},       // a waiter key and a lock key
	{"a", "floor:x", "o", "a:floor", "x", "o"},     // floor keys
	{"a", "k", "o", "a:", "k", "o"},                // a trailing ":"
	{"redlock", "k", "alice", "redlock", "k", "a"}, // owners
}

// names returns every key name of (p, k, o), by kind.
func names(p, k, o string) map[string]string {
	return map[string]string{
		"lock":   lockKey(p, k),
		"fence":  fenceKey(p, k),
		"wait":   waitSetKey(p, k),
		"waiter": waiterPrefix(p, k) + o,
		"floor":  floorKey(p, k),
	}
}

// FuzzKeyNames checks that two key names are equal only if they are of one kind
// for one prefix and key (and, for a waiter's key, one owner).
func FuzzKeyNames(f *testing.F) {
	for _, s := range trickyNames {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	f.Fuzz(func(t *testing.T, p1, k1, o1, p2, k2, o2 string) {
		var c config
		if WithPrefix(p1)(&c) != nil || WithPrefix(p2)(&c) != nil ||
			driver.ValidateKey(k1) != nil || driver.ValidateKey(k2) != nil ||
			driver.ValidateOwner(o1) != nil || driver.ValidateOwner(o2) != nil {
			t.Skip()
		}
		n1, n2 := names(p1, k1, o1), names(p2, k2, o2)
		for kind1, a := range n1 {
			for kind2, b := range n2 {
				same := kind1 == kind2 && p1 == p2 && k1 == k2 && (kind1 != "waiter" || o1 == o2)
				if (a == b) != same {
					t.Fatalf("%s of (%q, %q, %q) = %q, %s of (%q, %q, %q) = %q", kind1, p1, k1, o1, a, kind2, p2, k2, o2, b)
				}
			}
			if !strings.HasPrefix(a, p1+":") {
				t.Fatalf("%s of (%q, %q) = %q does not start with the prefix and \":\"", kind1, p1, k1, a)
			}
		}
		// Holder channels: one per prefix and key, never a wake channel.
		h1, h2 := holderChannel(p1, k1), holderChannel(p2, k2)
		if (h1 == h2) != (p1 == p2 && k1 == k2) || h1 == wakeChannel(p2, o2) || !strings.HasPrefix(h1, p1+":") {
			t.Fatalf("holder channels %q, %q", h1, h2)
		}
	})
}

// The holder channel the scripts publish on is the one the backend subscribes to.
func TestScriptHolderChannel(t *testing.T) {
	src, err := scriptFiles.ReadFile("scripts/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	if want := "local HOLDER = '\\31" + strings.TrimPrefix(holderPart, "\x1f") + "'\n"; !strings.Contains(string(src), want) {
		t.Fatalf("lib.lua does not declare %s", want)
	}
}

// TestPrefixControl checks that a prefix cannot hold the separator.
func TestPrefixControl(t *testing.T) {
	var c config
	for _, p := range []string{"a\x1fb", "a\x00", "a b", "", "a\x7f"} {
		if err := WithPrefix(p)(&c); err == nil {
			t.Errorf("WithPrefix(%q) accepted", p)
		}
	}
}
