package etcdlock

import (
	"strconv"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// Lock ranges.
//
// The members of the lock named K under prefix P live in the range of keys that
// start with
//
//	P/E 0x1f
//
// where E is K with "%" and "/" escaped as %25 and %2F, and 0x1f is the ASCII unit
// separator. Neither a prefix nor a key may hold a control byte (WithPrefix,
// driver.ValidateKey), so the first 0x1f in a member key ends its lock's part, and
// E, which has no "/", is what lies between the last "/" before it and it; P is
// the rest. So two (prefix, key) pairs have the same range only if they are equal,
// and no lock's range holds another's members: nested prefixes such as "app" and
// "app/jobs" keep their locks apart (with "/" as the terminator, as before, lock
// "jobs" under "app" read the members of every lock under "app/jobs"). The
// backend's other keys, the benchmark floor's P/0x00floor/K and the never written
// P/0x00idle, hold a 0x00, which no lock range does.
const memberSep = "\x1f"

// tailSep ends the name of a lock's tail key, P/E 0x1e: outside every lock's range
// (it holds no 0x1f), inside the prefix. The tail key names the member that queued
// last (a member that found the lock empty writes none, see create), written in
// the transaction that created that member (so its mod revision is that member's
// create revision), on that member's lease; it is deleted with that member's key
// when its client releases the key, else when the lease ends or the next waiter
// overwrites it. A withdrawn wait leaves it, stale (see waiter.Stop), so that a
// lock with members has a tail. It is a hint: a waiter that queues behind others
// watches the member it names, after checking that it is still there, instead of
// having etcd list and sort every member to find the one just ahead; the check
// that makes a waiter the holder never trusts it.
const tailSep = "\x1e"

// tailKey returns the tail key of the lock whose member key names start with
// lockPrefix (see tailSep).
func tailKey(lockPrefix string) string {
	return strings.TrimSuffix(lockPrefix, memberSep) + tailSep
}

// tailOf returns the tail key of the lock of member key name, or "" if name is not a
// member key name.
func tailOf(name string) string {
	i := strings.LastIndexByte(name, memberSep[0])
	if i < 0 {
		return ""
	}
	return name[:i] + tailSep
}

// limitSep ends the name of a lock's limit key, P/E 0x1d: outside every lock's
// range, inside the prefix, sorting just before the tail key and the members. It
// exists, without a lease, while the lock is a semaphore, holding the limit in
// decimal: the transaction that creates the first member of a free lock as a
// semaphore of N writes N there (guarded by "no member exists"), every later
// semaphore attempt's transaction compares it with its own limit, and a mutex
// attempt's requires it absent. Left behind once the semaphore's last member is
// gone, it is stale and harmless: the next attempt that finds no member there
// overwrites or deletes it. So, while members exist, the key says their limit:
// absent for a mutex, N for a semaphore of N (see Semaphores in the package
// documentation).
const limitSep = "\x1d"

// limitKey returns the limit key of the lock whose member key names start with
// lockPrefix (see limitSep).
func limitKey(lockPrefix string) string {
	return strings.TrimSuffix(lockPrefix, memberSep) + limitSep
}

var (
	keyEscaper   = strings.NewReplacer("%", "%25", "/", "%2F")
	keyUnescaper = strings.NewReplacer("%2F", "/", "%25", "%")
)

// lockKeyOf returns the lock key whose range holds name, a key under the prefix
// range "prefix/", or false if name is not a member key of a lock under prefix
// itself (the tail and limit keys, the backend's 0x00 keys, the keys of a nested
// prefix such as prefix/sub/...).
func lockKeyOf(prefix, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"/")
	if !ok {
		return "", false
	}
	e, _, ok := strings.Cut(rest, memberSep)
	if !ok || strings.ContainsAny(e, "/\x00") {
		return "", false
	}
	return keyUnescaper.Replace(e), true
}

// lockPrefix returns the start of the member keys of the lock named key under
// prefix (see Lock ranges above).
func lockPrefix(prefix, key string) string {
	return prefix + "/" + keyEscaper.Replace(key) + memberSep
}

// Member key names.
//
// The member key of (key, owner) is named after the backend, not after the owner:
// the lock prefix and <backend id>.<n>, with n the smallest number no other owner
// uses here at the moment. The owner id is the key's value. Owners are usually random per lock
// call, and etcd keeps an index entry for every key name ever written until the
// history is compacted; every range read of a lock's members walks those entries. So
// reusing a few names per client keeps each read as cheap on the thousandth grant as
// on the first, where a name per owner would make reads slower with every grant.
//
// A name written by another backend is used here only when its grant is resumed with
// the same owner id (see Acquire). If one of our names turns out to be occupied by
// another owner (our grant was resumed elsewhere and the name reused here), it is
// burned: never used again by this backend.

// newID returns a backend's id in its member key names: 8 random bytes, hex.
func newID() string { return driver.RandomHex(8) }

// name returns the member key name of ok, assigning one if it has none.
func (b *Backend) name(ok driver.Holder) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n, found := b.names[ok]; found {
		return n
	}
	base := b.LockPrefix(ok.Key) + b.id + "."
	for i := 0; ; i++ {
		n := base + strconv.Itoa(i)
		if !b.burned[n] && !b.inUseLocked(n) {
			b.names[ok] = n
			return n
		}
	}
}

func (b *Backend) inUseLocked(name string) bool {
	for _, n := range b.names {
		if n == name {
			return true
		}
	}
	return false
}

// ours reports whether name is one of this backend's own names (not adopted).
func (b *Backend) ours(name string) bool {
	return strings.HasPrefix(name[strings.LastIndexByte(name, memberSep[0])+1:], b.id+".")
}

// assigned returns the member key name of ok, if it has one.
func (b *Backend) assigned(ok driver.Holder) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, found := b.names[ok]
	return n, found
}

// adopt makes name (a grant being resumed) the member key name of ok.
func (b *Backend) adopt(ok driver.Holder, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.names[ok] = name
}

// burn retires ok's name, found occupied by another owner.
func (b *Backend) burn(ok driver.Holder, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.burned[name] = true
	if b.names[ok] == name {
		delete(b.names, ok)
	}
}

// freeName releases ok's name if nothing here answers for it any more.
func (b *Backend) freeName(ok driver.Holder) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freeNameLocked(ok)
}

func (b *Backend) freeNameLocked(ok driver.Holder) {
	if b.held[ok] == nil && b.waiters[ok] == nil {
		delete(b.names, ok)
	}
}
