package redislock

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// Triples of (prefix, key, owner) whose key names met when the parts were joined
// with ":" (before 0x1f separated them).
var trickyNames = [][6]string{
	{"a", "b:lock:c", "o", "a:lock:b", "c", "o"},      // one lock key
	{"a:queue", "z", "o", "a", "lock:z", "o"},         // a lock key and a queue key
	{"a", "lock", "z", "a:waiter", "z", "o"},          // a waiter key and a lock key
	{"a", "x:y", "o", "a", "x", "y:o"},                // two waiter keys
	{"a", "x", "lock:p", "a:waiter:x", "p", "o"},      // the same, spelt by the owner
	{"a", "floor:x", "o", "a:floor", "x", "o"},        // floor keys
	{"a", "k", "o", "a:", "k", "o"},                   // a trailing ":"
	{"a", ":k", "o", "a:", "k", "o"},                  // a leading one
	{"a", "k\x1ftoken", "o", "a", "k", "o"},           // (an invalid key)
	{"dlock", "k", "alice", "dlock", "k", "alice"},    // the same
	{"a", "k token", "o", "a", "k", "o"},              // spaces in keys
	{"a", "k", "o", "a:lock", "k", "o"},               // a kind in the prefix
	{"a:wake:0", "k", "o", "a", "wake:0:lock:k", "o"}, // channels, prefixes
}

// names returns every key name of (p, k, o), by kind.
func names(p, k, o string) map[string]string {
	return map[string]string{
		"lock":   lockKey(p, k),
		"token":  lockKey(p, k) + tokenSuffix,
		"value":  lockKey(p, k) + valueSuffix,
		"queue":  queueKey(p, k),
		"waiter": waiterKey(p, k, o),
	}
}

// FuzzKeyNames checks that two key names are equal only if they are of one kind
// for one prefix and key (and, for a waiter's key, one owner): no prefix reaches
// another's keys, and no key or owner another's. Joined with ":", the first two
// pairs above shared a lock key, and a lock key with a queue key.
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
		// The scripts find the key after the prefix and lockPart in a lock key, and
		// the prefix before the last wakePart of a wake channel.
		if got := lockKey(p1, k1)[len(p1)+len(lockPart):]; got != k1 {
			t.Fatalf("key in the lock key = %q, want %q", got, k1)
		}
		id := driver.RandomHex(wakeIDBytes)
		ch1, ch2 := wakeChannel(p1, id), wakeChannel(p2, id)
		if (ch1 == ch2) != (p1 == p2) || ch1[:strings.LastIndex(ch1, wakePart)] != p1 {
			t.Fatalf("wake channels %q, %q", ch1, ch2)
		}
		// Holder channels: one per prefix and key, never a wake channel.
		h1, h2 := lockKey(p1, k1)+holderSuffix, lockKey(p2, k2)+holderSuffix
		if (h1 == h2) != (p1 == p2 && k1 == k2) || h1 == ch2 || h2 == ch1 || !strings.HasPrefix(h1, p1+":") {
			t.Fatalf("holder channels %q, %q (wake channels %q, %q)", h1, h2, ch1, ch2)
		}
	})
}

// The key name parts in scripts/names.lua are the Go constants', and acquire.lua
// finds the prefix of a channel by its wakePart.
func TestScriptNameParts(t *testing.T) {
	src := scriptSource("names.lua")
	_, decl, ok := strings.Cut(src, "local LOCK, QUEUE, WAITER, SEP, TOKEN, VALUE, HOLDER = ")
	if !ok {
		t.Fatalf("names.lua declares no LOCK, QUEUE, WAITER, SEP, TOKEN, VALUE, HOLDER:\n%s", src)
	}
	decl, _, _ = strings.Cut(decl, "\n")
	var got []string
	for i, part := range strings.Split(decl, ", ") {
		lit, err := strconv.Unquote(`"` + strings.ReplaceAll(strings.Trim(part, "'"), `\31`, `\x1f`) + `"`)
		if err != nil {
			t.Fatalf("part %d, %s: %v", i, part, err)
		}
		got = append(got, lit)
	}
	if want := []string{lockPart, queuePart, waiterPart, ownerSep, tokenSuffix, valueSuffix, holderSuffix}; !slices.Equal(got, want) {
		t.Fatalf("names.lua parts %q, want %q", got, want)
	}
	if pat := "'^(.*)" + wakePart + "%x+$'"; !strings.Contains(scriptSource("acquire.lua"), pat) {
		t.Fatalf("acquire.lua does not find the prefix with %s", pat)
	}
	for _, f := range []string{"acquire", "refresh", "release", "withdraw", "force_release", "inspect", "set_value"} {
		if src := scriptSource(f + ".lua"); strings.Contains(src, includeLine) || !strings.HasPrefix(src, "-- "+f+".lua: ") {
			t.Errorf("%s.lua: an include left, or no header", f)
		}
	}
}

// TestScriptKeyNames checks that the scripts derive the queue and waiter keys that
// the key layout names: a waiter queued behind a holder makes exactly the lock,
// token, queue and waiter keys, found by Inspect; giving up removes its two.
func TestScriptKeyNames(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	const prefix, key = "app:lock:x", "jobs:lock:y z"
	b, err := Open(ctx, u, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "bob", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queue(t, ctx, b, key, "carol:1")
	all := func() []string {
		ks, err := b.rdb.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ks)
		return ks
	}
	want := []string{lockKey(prefix, key), b.TokenKey(key), queueKey(prefix, key), waiterKey(prefix, key, "carol:1")}
	slices.Sort(want)
	if got := all(); !slices.Equal(got, want) {
		t.Fatalf("keys = %q, want %q", got, want)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Owner != "bob" || info.Waiters != 1 {
		t.Fatalf("Inspect = %+v, %v; want bob with 1 waiter", info, err)
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	want = []string{lockKey(prefix, key), b.TokenKey(key)}
	slices.Sort(want)
	if got := all(); !slices.Equal(got, want) {
		t.Fatalf("keys after the waiter gave up = %q, want %q", got, want)
	}
	if err := b.Release(ctx, key, "bob"); err != nil {
		t.Fatal(err)
	}
	if got := all(); !slices.Equal(got, []string{b.TokenKey(key)}) {
		t.Fatalf("keys after release = %q, want the token key", got)
	}
	if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after release = %v, want ErrNotHeld", err)
	}
}

// names.lua sets RETAIN to TokenRetention, in the line loadScripts replaces.
func TestRetainMatches(t *testing.T) {
	if src := scriptSource("names.lua"); !strings.Contains(src, retainLine(TokenRetention)) {
		t.Fatalf("names.lua does not hold %q", retainLine(TokenRetention))
	}
}
