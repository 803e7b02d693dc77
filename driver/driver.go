// Package driver is the contract between the dlock core and a lock backend.
//
// A backend implements one attempt at a time: Acquire tries once, Refresh extends a
// grant, Release gives it back. Everything that is the same for every engine lives
// once in the core package dlock and is not repeated here: waiting and retry with
// jitter, renewal in the background, the local validity deadline, reentrancy
// counting within a Client, and the lease context. A backend states what its engine
// guarantees in its package documentation; the core never claims more.
//
// # Optional capabilities
//
// Optional capabilities are separate interfaces that the core discovers with a type
// assertion on the Backend; a backend that means to implement one asserts it at
// compile time (var _ driver.Bounder = (*Backend)(nil)). Each, and what the core
// does without it:
//
//   - Notifier: wakes a waiting Lock when the key may be free (or hands it the key
//     directly, see Waiter), so waiters do not poll. Without it a waiting Lock
//     attempts again after a jittered backoff (WithRetry's bounds), so a release is
//     noticed up to one backoff late and every waiter keeps asking the server.
//   - WatchAdvisor (only looked for on a Notifier): tells whether registering a
//     wait before the first attempt is worth its cost. Without it every waiting
//     Lock registers its wait first, also on a free key.
//   - Bounder: bounds a grant by the session the backend keeps alive itself (an
//     etcd lease, a ZooKeeper session), so the lease's local validity never
//     outlasts it. Without it the validity is the TTL counted from the attempt
//     (minus the drift allowance), renewed by Refresh, which is right for a
//     backend whose grants live on Refresh alone.
//   - Inspector: reads the holder of a key (owner, token, TTL left, waiters), for
//     dlock.Client.Inspect and tools. Without it Client.Inspect returns an error
//     matching ErrUnsupported; locking does not use it.
//   - ForceReleaser: frees a key whoever holds it, for dlock.Client.ForceRelease
//     (an operator clearing a stuck holder; the old holder may still run, and
//     fencing keeps resources safe). Without it Client.ForceRelease returns an
//     error matching ErrUnsupported; locking does not use it.
//   - Valuer: stores a value with each grant (Request.Value, changed later by
//     SetValue) and returns it in Info.Value: an election's leader publishes its
//     address this way. Without it a lock call with a value (dlock.WithValue,
//     Campaign with a value, Proclaim) returns an error matching ErrUnsupported.
//   - Semaphorer: admits up to Request.Limit holders of one key at once (a
//     semaphore), each with its own grant, token, renewal and release, and lists
//     them. Without it a lock call with a limit above 1 (dlock.WithLimit) returns
//     an error matching ErrUnsupported.
//   - Sharer: honours Request.Shared, so a key has shared (read) holders together
//     or one exclusive (write) holder. Without it a shared lock call
//     (dlock.WithShared) returns an error matching ErrUnsupported.
//   - HolderLister: lists every holder of a key on a Sharer that is not a
//     Semaphorer (whose Holders does that), for dlock.Client.Holders and dlock
//     inspect. Without either, Client.Holders returns an error matching
//     ErrUnsupported.
//   - MultiAcquirer: takes several keys in one atomic step on the server, all
//     or none, for dlock.Client.LockAll and TryLockAll. Without it, and for a
//     set that is not free, the core takes the keys one at a time in ascending
//     key order (deadlock-free, since every caller takes them in that order) and
//     gives back what it took if it fails; others may then see part of the set
//     held for a moment. A MultiAcquirer that can take only some sets in one
//     step (keys of one Redis Cluster hash slot) says which by SetChecker.
//   - Queuer: lists the queued places of a key (who waits, reader or writer),
//     for dlock.Client.Waiters and dlock inspect. Without it Client.Waiters
//     returns an error matching ErrUnsupported; locking does not use it.
//   - Lister: lists every held key under a prefix, for dlock.Client.List and
//     dlock list. Without it Client.List returns an error matching
//     ErrUnsupported; locking does not use it.
//   - HolderWatcher: tells when the holder of a key or its value may have
//     changed, for dlock.Client.Observe. Without it Observe reads the holder
//     again at a fixed interval (dlock.WithObserveInterval), so it learns of a
//     change up to one interval late.
//
// Every backend must pass the conformance suite in package drivertest.
package driver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// Sentinel errors shared by the core and every backend; compare with errors.Is.
// Package dlock re-exports them under the same names.
var (
	// ErrLocked means the key is held by another owner (or reserved for a queued
	// waiter ahead of the caller).
	ErrLocked = errors.New("dlock: locked by another owner")
	// ErrNotHeld means the caller does not hold the key: it never did, its grant
	// expired, or someone released it by force.
	ErrNotHeld = errors.New("dlock: lock not held by this owner")
	// ErrInvalid marks bad input: a bad key, owner id, URL or option value.
	ErrInvalid = errors.New("dlock: invalid argument")
	// ErrUnsupported means the backend lacks an optional capability.
	ErrUnsupported = errors.New("dlock: not supported by this backend")
	// ErrClosed means the backend or client was closed.
	ErrClosed = errors.New("dlock: closed")
	// ErrAuth means the backend refused the credentials (a wrong or missing user
	// name or password, a rejected client certificate) or denied the identity
	// permission for what the lock needs. Waiting does not fix it.
	ErrAuth = errors.New("dlock: authentication failed or permission denied")
	// ErrLimitMismatch means an attempt asked for a key with another holder limit
	// than the key has while it is held or waited for (a semaphore of 4 locked as
	// one of 8, or as a mutex). It matches ErrInvalid too.
	ErrLimitMismatch = fmt.Errorf("%w: holder limit differs from the key's", ErrInvalid)
)

// Limits on keys, owner ids and values, the same for every backend so that a key
// that works on one works on all.
const (
	MaxKeyLen   = 512
	MaxOwnerLen = 128
	MaxValueLen = 4096
)

// Request is one acquire attempt.
type Request struct {
	// Key names the lock; it has passed ValidateKey.
	Key string
	// Owner identifies the holder; it has passed ValidateOwner. An attempt whose
	// Owner already holds Key is refused like one of another owner (an error
	// matching ErrLocked, preferably a *HeldError), changing nothing on the server:
	// no TTL extension, no new token, no queued place, no taking of a grant handed
	// to a queued place of that owner. The same owner id may be in use by another
	// client or process, and two callers must never both hold the key. Only when
	// Reenter is set does such an attempt succeed.
	Owner string
	// Reenter says that the caller may already hold Key under Owner and takes that
	// grant over: an attempt whose Owner holds Key then succeeds again, extends the
	// TTL and returns the existing grant's token (and drops any mark of a grant
	// handed to a queued place, as a claim of it would). The core sets it only when
	// that is safe: the owner id is a random one made for this lock call alone; the
	// call has already been granted the key by an earlier attempt (a grant whose
	// reply came too late, or one handed over long ago, asked again); or the caller
	// resumes explicitly (dlock.WithResume), asserting that no other live process
	// uses the owner id. A backend may also let an attempt with Wait set claim a
	// grant a release handed to the caller's own queued place when it can tell that
	// place from another client's of the same owner (redislock does, by channel).
	Reenter bool
	// Resume says that the caller resumes explicitly (dlock.WithResume): a grant
	// Owner holds may have been made through another client, by an earlier
	// process of that owner id. Reenter is then set too. Without Resume, every
	// grant Owner may hold of Key was made through this Backend by the same lock
	// call (a generated owner id is that call's alone), so a backend that keeps
	// grants under the client's name (etcdlock's member keys) need not look for
	// one under another client's, which costs a read of the queue's head on every
	// attempt that queues.
	Resume bool
	// TTL is how long the server keeps the grant without a Refresh.
	TTL time.Duration
	// Wait tells a queueing backend that the caller will wait if the key is held.
	// The backend may then keep the caller's place in a server-side queue until
	// Waiter.Stop is called or the place expires (see Patience), and hand the key
	// over to that place when it is released (see Waiter).
	Wait bool
	// Patience is how long a queued place may go without another attempt from its
	// owner before the backend may drop it (a crashed waiter must not block the
	// queue). Zero when Wait is false.
	Patience time.Duration
	// Value, for a Valuer, is stored with the grant this request makes, including
	// a grant handed over later to the place it queues, and Inspect returns it
	// (Info.Value); an attempt that re-enters a grant (Reenter) replaces the
	// stored value with its own. At most MaxValueLen bytes; nil for none. A
	// backend that is not a Valuer never sees a non-empty Value.
	Value []byte
	// Limit, for a Semaphorer, is how many owners may hold Key at once: 0 or 1
	// for one (a mutex), N > 1 for a semaphore of N permits. The limit is part of
	// the key's state while the key has holders or queued places: an attempt with
	// another limit (counting 0 as 1) fails with an error matching
	// ErrLimitMismatch and changes nothing; once the key has neither, the next
	// attempt sets it. A backend that is not a Semaphorer never sees Limit > 1.
	Limit int
	// Shared, for a Sharer, asks for a shared (read) grant: shared grants of a key
	// hold together, an exclusive grant (Shared false) holds alone. Queued places
	// keep their order: the leading run of shared places in the queue holds
	// together once no exclusive grant is held, an exclusive place holds alone
	// when it reaches the front with no holder left, and a shared attempt does not
	// pass a queued place (so a stream of readers cannot starve a waiting
	// writer). Every grant, shared or exclusive, takes its token from the key's
	// one sequence: a writer's token is larger than every earlier reader's. Shared
	// keys have one writer: a shared attempt on a key held as a semaphore (Limit
	// > 1) fails with ErrLimitMismatch. A backend that is not a Sharer never sees
	// Shared set; the core never sets it with Limit > 1.
	Shared bool
}

// Grant is a successful acquire.
type Grant struct {
	// Token is the fencing token: strictly larger than the token of every earlier
	// grant of the same key (one that completed before this one's attempt began),
	// as far as the backend can promise. Grants do not share a token, except that a
	// backend may give two shared grants (readers) whose attempts overlapped the
	// same one (Redlock does). Zero means the backend cannot fence.
	Token uint64
	// Lost, optional, is closed by the backend the moment it knows the grant is
	// gone without waiting for the next Refresh (an etcd lease or a ZooKeeper
	// session expired). The core then ends the lease at once. A backend that
	// cannot tell leaves it nil; the core still learns at the next Refresh or at
	// the validity deadline.
	Lost <-chan struct{}
	// Age is zero for a grant made by this Acquire call: the server started its
	// TTL after the call began. It is positive for a grant the server made
	// earlier, handed over to the caller's queued place by the previous holder's
	// release (see Waiter): an upper bound on how long before this call the
	// server may have started the grant's TTL, measured on the local monotonic
	// clock. The core starts the local validity that much earlier, so the lease
	// still ends before the server lets anyone else in.
	Age time.Duration
}

// HeldError is returned by Acquire when the key is held. It matches ErrLocked with
// errors.Is. RetryAfter, when positive, is the backend's estimate of when the
// current grant expires if it is not renewed; the core uses it to bound how long a
// waiter sleeps when no wake-up arrives.
type HeldError struct {
	RetryAfter time.Duration
	// Ahead, for an attempt with Request.Wait set that left the caller queued, is
	// how many live queued places are ahead of the caller's (the holder not
	// counted): 0 when the caller is next in line, or when the backend cannot tell
	// cheaply. A backend sets it only from what the attempt's own reply says,
	// without a request of its own. The core spaces a notified waiter's fallback
	// attempts (its guard against a lost wake-up) further apart the further back it
	// is, within a bound, so that a long queue does not cost a write per waiter per
	// second; a backend that leaves it 0 gets the shortest fallback interval.
	Ahead int
	// Queued says that Ahead is known: the attempt left the caller queued with
	// Ahead places in front (0: next in line). A backend that counts only up to a
	// cap reports the cap, a lower bound, and says so in its documentation. The
	// core passes it to WithQueueReport's function; false means the backend did
	// not tell (Ahead is then 0).
	Queued bool
}

// Error says that the key is held and, if known, when the grant expires.
func (e *HeldError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v (expires in %v unless renewed)", ErrLocked, e.RetryAfter.Round(time.Millisecond))
	}
	return ErrLocked.Error()
}

// Is reports whether target is ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }

// Backend is the required part of the contract. Implementations must be safe for
// concurrent use. Every method respects ctx: it returns promptly when ctx ends,
// with an error that wraps ctx.Err().
type Backend interface {
	// Acquire makes one attempt. When the key is held by another owner it returns
	// an error matching ErrLocked (preferably a *HeldError), never a zero Grant
	// with a nil error. An error of any other kind leaves nothing held: if the
	// outcome is unknown (a lost reply), the backend must make sure a later
	// Release with the same owner cleans it up, and the core calls Release.
	Acquire(ctx context.Context, req Request) (Grant, error)
	// Refresh extends the owner's grant of key to ttl from now. It returns an
	// error matching ErrNotHeld when owner does not hold key.
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error
	// Release frees the owner's grant of key and wakes the next waiter. It returns
	// an error matching ErrNotHeld when owner does not hold key.
	Release(ctx context.Context, key, owner string) error
	// Close frees the backend's connections. Grants still held stay on the server
	// until they expire.
	Close() error
}

// Notifier is implemented by backends that can wake a waiter when a key may have
// become free, so the core does not poll.
type Notifier interface {
	// Watch registers interest in key for owner before the first attempt with
	// Wait set, so that no wake-up between a failed attempt and the wait is lost.
	// The core then alternates Acquire (with Wait set) and receiving from
	// Waiter.C, with a bounded fallback timer in case a wake-up is lost.
	Watch(ctx context.Context, key, owner string) (Waiter, error)
}

// WatchAdvisor is implemented by a Notifier that can tell when registering a wait
// before the first attempt is worth its cost. When WatchFirst(key) reports false,
// the core makes a waiting Lock's first attempt without Watch and without Wait, and
// registers the wait (then attempts again, with Wait) only if that attempt finds
// the key held: an attempt without Wait holds no place in a queue, so no wake-up
// can be lost, and an uncontended Lock costs one Acquire and nothing else. A
// backend answers from what it saw lately (true for a key it recently found held,
// where the first attempt would most likely have to queue).
type WatchAdvisor interface {
	WatchFirst(key string) bool
}

// Waiter is one registered wait.
//
// # Direct handoff
//
// A queueing backend may grant a released key directly to the first queued waiter,
// on the server, as part of the release (the waiter's TTL is kept with its place),
// and send the grant along with the wake-up. The waiter's next Acquire (with Wait
// set, same key and owner) then returns that grant without asking the server, with
// Grant.Age set, so a handoff costs one request (the release) instead of two. A
// handed grant is returned at most once; an attempt after that asks the server,
// where the owner already holds the key: the core sets Request.Reenter on such an
// attempt only once this lock call has been granted the key.
//
// Grant.Age must bound how long before the Acquire call the server may have
// started the grant's TTL. A backend can get that bound without trusting any
// clock but the local monotonic one: it numbers each of the waiter's attempts and
// notes when each was sent; the attempt stores its number with the queued place;
// the release grants only after that attempt ran on the server (which was after
// it was sent) and sends the number back with the grant. The time since that
// attempt was sent is then a safe Age.
type Waiter interface {
	// C receives a value when the key may be free for this owner, or was handed
	// to it. The channel is buffered; wake-ups may coalesce. A backend whose
	// queued places live on a session it keeps (an etcd lease, a ZooKeeper
	// session) also sends when that session is lost, and the next Acquire then
	// returns an error that does not match ErrLocked: a waiting Lock, or a
	// Campaign, fails at once rather than wait on a place that is gone.
	C() <-chan struct{}
	// Stop ends the wait. When acquired is false the backend gives up any place it
	// holds in a server-side queue and passes the turn on, so a cancelled waiter
	// leaves nothing behind: that includes a grant handed to this waiter, whether
	// Acquire returned it or not, and one that may still be on its way. Stop is
	// called exactly once.
	Stop(ctx context.Context, acquired bool) error
}

// Bounder is implemented by a backend whose grants live on something it keeps
// alive itself rather than through Refresh: an etcd lease, a ZooKeeper session. A
// grant can then be younger than the session that carries it, so a TTL counted
// from the attempt would outrun the session. After every successful Acquire and
// Refresh the core asks for the bound and ends the lease's local validity no later
// than it, so Lease.Expiry and Lease.Context never outlast the session on the
// server.
type Bounder interface {
	// Bound returns how long from now the server keeps the grant of owner on key
	// at least, with no further request and whatever the network does: a lower
	// bound on the local monotonic clock, with the backend's own margin for clock
	// rate and timer lateness already taken off. ok is false when the backend
	// holds no such grant (it has just been lost). A grant the backend cannot
	// bound (it lives on a session this backend does not keep) gets NoBound.
	// Bound must not block on the network.
	Bound(key, owner string) (d time.Duration, ok bool)
}

// NoBound is what Bounder.Bound returns for a grant it cannot bound: the core's own
// deadline applies alone.
const NoBound = time.Duration(math.MaxInt64)

// Info describes the current holder of a key.
type Info struct {
	Key   string
	Owner string
	Token uint64
	// TTL is the time left before the server expires the grant; zero if the
	// backend does not know.
	TTL time.Duration
	// Waiters is the number of queued waiters, or -1 if the backend does not know.
	Waiters int
	// Value is the value stored with the grant (see Valuer); nil if none.
	Value []byte
	// Shared is true for a shared (read) grant (see Sharer).
	Shared bool
}

// Inspector is implemented by backends that can read who holds a key.
type Inspector interface {
	// Inspect returns the holder of key, or an error matching ErrNotHeld if no one
	// holds it.
	Inspect(ctx context.Context, key string) (Info, error)
}

// ForceReleaser is implemented by backends that can release a key whatever its
// owner. The old holder may still be running; the next grant's token is larger,
// so fenced resources stay safe.
type ForceReleaser interface {
	// ForceRelease frees key, or returns an error matching ErrNotHeld if no one
	// holds it.
	ForceRelease(ctx context.Context, key string) error
}

// Valuer is implemented by backends that store a value with each grant: the value
// of Request.Value, replaced by SetValue, returned by Inspect in Info.Value, and
// gone with the grant (the next grant of the key has its own value, or none).
type Valuer interface {
	// SetValue replaces the value stored with owner's grant of key (at most
	// MaxValueLen bytes; nil or empty for none), comparing the owner on the
	// server in the same step. It returns an error matching ErrNotHeld when owner
	// does not hold key; the grant's TTL is left as it was.
	SetValue(ctx context.Context, key, owner string, value []byte) error
}

// Semaphorer is implemented by backends that admit up to Request.Limit holders of
// a key at once. Each holder has its own grant: Refresh and Release act on the
// (key, owner) grant alone, and every grant of the key, whatever the limit, takes
// a token from the key's one rising sequence. Waiting is FIFO, as for a mutex: a
// release hands the freed permit to the first queued place (see Waiter), and a
// newcomer does not take a permit while places are queued ahead of it.
// ForceRelease frees every holder; Inspect reports one of them (the oldest grant)
// with Waiters counting the queued places.
type Semaphorer interface {
	// Holders returns the key's limit (1 for a mutex) and every live holder, the
	// oldest grant first; no holders and limit 0 when the key is free.
	Holders(ctx context.Context, key string) (limit int, holders []Info, err error)
}

// Sharer is implemented by backends that honour Request.Shared: read-write locks.
// Holders (Semaphorer) or ListHolders (HolderLister) lists shared holders with
// Info.Shared set; Inspect reports the oldest holder.
type Sharer interface {
	// Shares reports whether the backend honours Request.Shared; a wrapper
	// answers for the backend it wraps.
	Shares() bool
}

// HolderLister is implemented by a Sharer that is not a Semaphorer (it admits no
// limit above 1) but can list a key's holders: its readers, or its one writer.
type HolderLister interface {
	// ListHolders returns every live holder of key, the oldest grant first (the
	// smallest token first where the backend cannot tell the order of grants);
	// none when the key is free.
	ListHolders(ctx context.Context, key string) ([]Info, error)
}

// MultiAcquirer is implemented by backends that can take several keys in one
// atomic step on the server (one script, transaction, statement or multi), so a
// set of keys is granted all at once or not at all, and nobody ever sees part of
// it held.
type MultiAcquirer interface {
	// AcquireAll makes one attempt at every request at once. The core passes at
	// least two requests with distinct keys in ascending byte order, one owner (a
	// fresh random id, holding none of the keys) and one TTL; Reenter and Wait
	// are false, Limit is at most 1, Shared is false and Value is nil. If every
	// key is free (no holder, no live queued place, as Acquire without Wait would
	// find it), AcquireAll grants them all, each as Acquire would (a token from
	// each key's own sequence, a grant that Refresh, Release, Bound, Inspect and
	// the rest treat like any other), and returns one Grant per request, in
	// order. Otherwise it changes nothing and returns an error matching ErrLocked
	// (preferably a *HeldError) whose message names the first key it found
	// taken. An error of any other kind leaves nothing held: if the outcome is
	// unknown, a later Release of each key with the owner cleans it up, and the
	// core calls it.
	AcquireAll(ctx context.Context, reqs []Request) ([]Grant, error)
}

// SetChecker is implemented by a MultiAcquirer that can take only some sets of
// keys in one step: in a Redis Cluster, only keys of one hash slot. The core asks
// it before AcquireAll and takes any other set one key at a time, as it does
// without a MultiAcquirer.
type SetChecker interface {
	// AtomicSet reports, without I/O, whether AcquireAll can take keys (at
	// least two, distinct, in ascending order) in one step. For a set it
	// rejects, AcquireAll changes nothing and returns an error matching
	// ErrUnsupported.
	AtomicSet(keys []string) bool
}

// Queuer is implemented by backends that keep waiters' places on the server and
// can list them.
type Queuer interface {
	// Queue returns the live queued places of key in the order they will be
	// served: for each, Key, Owner, Shared (a reader's place) and, if the backend
	// keeps it, Value; Token is 0, Waiters -1, and TTL how long the place lives
	// without another attempt of its owner (0 if the backend does not know). A
	// place already granted (handed over, not yet claimed) is a holder, not a
	// queued place. No places is an empty list, not an error.
	Queue(ctx context.Context, key string) ([]Info, error)
}

// Lister is implemented by backends that can enumerate the keys they hold.
type Lister interface {
	// List returns the live holders of every key that starts with prefix (every
	// key for ""), ordered by key and, within a key, oldest grant first: one Info
	// per holder (a semaphore's or readers' key has several), with Waiters as
	// Inspect reports it. Expired grants are not listed; a key with queued
	// places but no holder is not listed. It may read every lock of the
	// backend's namespace: an administrative call, not one for a hot path.
	List(ctx context.Context, prefix string) ([]Info, error)
}

// HolderWatcher is implemented by backends that can tell when the holder of a key
// may have changed: a grant, a release, a force release, a SetValue, and, where
// the server signals it, an expiry. dlock.Client.Observe reads the holder with
// Inspect after each notification, and also when the holder's TTL runs out, so a
// backend that cannot signal expiry (a Redis key's TTL) still gets it right.
type HolderWatcher interface {
	// WatchHolder starts watching key. The watch may send spurious notifications
	// but must not miss a change made after WatchHolder returns; if it may have
	// missed some (a reconnect), it sends one. It ends when Stop is called.
	WatchHolder(ctx context.Context, key string) (HolderWatch, error)
}

// HolderWatch is one watch started by HolderWatcher.WatchHolder.
type HolderWatch interface {
	// C receives a value when the holder of the key or its value may have
	// changed. The channel is buffered; notifications may coalesce.
	C() <-chan struct{}
	// Stop ends the watch and frees what it holds; it is called exactly once.
	Stop()
}

// ValidateValue reports whether value fits in MaxValueLen bytes.
func ValidateValue(value []byte) error {
	if len(value) > MaxValueLen {
		return fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(value), MaxValueLen)
	}
	return nil
}

// ValidateKey reports whether key is acceptable to every backend: 1 to MaxKeyLen
// bytes of valid UTF-8 without control characters.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalid, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c >= 0x7f {
			return validateKeySlow(key) // control character or non-ASCII
		}
	}
	return nil
}

func validateKeySlow(key string) error {
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalid, key)
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: key %q contains control character %U", ErrInvalid, key, r)
		}
	}
	return nil
}

// ValidateOwner reports whether owner is an acceptable owner id: 1 to MaxOwnerLen
// bytes from [A-Za-z0-9._:-].
func ValidateOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: empty owner id", ErrInvalid)
	}
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: owner id is %d bytes, the limit is %d", ErrInvalid, len(owner), MaxOwnerLen)
	}
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return fmt.Errorf("%w: owner id %q may only contain letters, digits and . _ : -", ErrInvalid, owner)
		}
	}
	return nil
}
