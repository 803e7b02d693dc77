// Package fence is the common vocabulary of dlock's resource-side guards: the rule a
// guard applies to fencing tokens, the errors it returns, and the checks on its input.
// It imports only the standard library and dlock's driver package; each store has its
// own small guard package beside it (pgfence, redisfence, etcdfence, zkfence,
// httpfence), importing only that store's client.
//
// # Why a guard
//
// A lock holder can stop at any moment (a GC pause, swapping, SIGSTOP, a slow
// network) and wake up after its lease expired and another process took the lock.
// It does not know: it goes on and writes. No timeout can prevent that, because the
// pause can fall between any check the holder makes and its write. Fencing can:
// every grant carries a token larger than every earlier grant's, the holder passes
// its token with each write, and the resource refuses a token lower than one it has
// already seen. The refusal must happen inside the write itself (a WHERE clause, a
// Lua script, an etcd compare, a ZooKeeper multi), never in a separate read before
// it, or the pause simply lands between the read and the write.
//
// # The rule
//
// A resource keeps the highest token it has accepted (its high-water mark). A write
// with token t is accepted if and only if t is not lower than that mark, and then t
// becomes the mark. Equal tokens pass: one holder writes many times under one grant.
// A lower token fails with a *StaleError (matching ErrStale) that carries the newer
// token the resource has seen. Token 0 is refused with ErrNoToken: it is what a
// backend that cannot fence hands out, and accepting it would switch the guard off.
//
// # Moving tokens
//
// Tokens only rise on one backend. A move to another backend, or a restore of the
// lock store from a backup, can make them start lower than marks the resources
// already hold, and then every new holder is refused (safe, but stuck). Offset lifts
// a deployment's tokens above such a floor; docs/fencing.md says how to use it.
package fence

import (
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/dlockio/dlock/driver"
)

var (
	// ErrStale matches every *StaleError: the resource has already accepted a
	// newer token than the one offered, so the writer's lease is over (it was
	// paused, or lost the lock) and its write was not applied.
	ErrStale = errors.New("dlock: fence: stale token")
	// ErrNoToken: the token is 0, which a backend that cannot fence hands out; a
	// guard refuses it rather than let every writer through.
	ErrNoToken = errors.New("dlock: fence: token 0: the lock backend gives no fencing tokens, so a guard cannot protect this write (use a backend that fences)")
	// ErrInvalid is dlock's ErrInvalid: bad input to a guard (resource name,
	// table or key name, option).
	ErrInvalid = driver.ErrInvalid
)

// StaleError is the error of a write refused by a guard. It matches ErrStale.
type StaleError struct {
	// Resource is the guarded resource's name (or key, or path).
	Resource string
	// Token is the token the write offered.
	Token uint64
	// Current is the newer token the resource had already accepted; 0 when the
	// guard could not read it.
	Current uint64
}

func (e *StaleError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("%v: resource %q: token %d is lower than one it has accepted", ErrStale, e.Resource, e.Token)
	}
	return fmt.Sprintf("%v: resource %q: token %d is lower than %d, which it has accepted (a newer holder has written)", ErrStale, e.Resource, e.Token, e.Current)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Admits reports whether a resource whose high-water mark is current accepts a
// write with token: token >= current. Equal tokens pass.
func Admits(current, token uint64) bool { return token >= current }

// Check applies the rule: nil if a resource whose mark is current accepts token,
// else a *StaleError. It also refuses token 0 with ErrNoToken.
func Check(resource string, current, token uint64) error {
	if token == 0 {
		return ErrNoToken
	}
	if !Admits(current, token) {
		return &StaleError{Resource: resource, Token: token, Current: current}
	}
	return nil
}

// CheckToken returns ErrNoToken for token 0, else nil.
func CheckToken(token uint64) error {
	if token == 0 {
		return ErrNoToken
	}
	return nil
}

// MaxResourceLen is the longest resource name, in bytes, that CheckResource
// accepts.
const MaxResourceLen = 1024

// CheckResource validates a resource name for guard (the guard's name, such as
// "pgfence", used in the message): not empty, at most MaxResourceLen bytes, valid
// UTF-8, and no control characters (NUL cannot be stored by PostgreSQL, and the
// others make error messages and logs ambiguous). A guard may add its store's own
// rules.
func CheckResource(guard, name string) error {
	switch {
	case name == "":
		return Invalid(guard, "empty resource name")
	case len(name) > MaxResourceLen:
		return Invalid(guard, "resource name of %d bytes (at most %d)", len(name), MaxResourceLen)
	case !utf8.ValidString(name):
		return Invalid(guard, "resource name %q is not valid UTF-8", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return Invalid(guard, "resource name %q contains the control character %U", name, r)
		}
	}
	return nil
}

// Invalid returns an error matching ErrInvalid, in dlock's form
// "dlock: invalid argument: <guard>: <message>".
func Invalid(guard, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, guard, fmt.Sprintf(format, args...))
}

// EncodedLen is the length of an encoded token: the 20 decimal digits of the
// largest uint64.
const EncodedLen = 20

// Encode writes token as 20 decimal digits, zero-padded, so that comparing two
// encoded tokens as byte strings orders them as numbers. Guards on stores that
// compare strings (etcd, Redis scripts, ZooKeeper data) store tokens this way.
func Encode(token uint64) string {
	var b [EncodedLen]byte
	for i := EncodedLen - 1; i >= 0; i-- {
		b[i] = byte('0' + token%10)
		token /= 10
	}
	return string(b[:])
}

// Decode reads a token written by Encode. Anything else is an error.
func Decode(s string) (uint64, error) {
	if len(s) != EncodedLen {
		return 0, fmt.Errorf("dlock: fence: stored token %q is not %d decimal digits", s, EncodedLen)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || s[0] == '+' {
		return 0, fmt.Errorf("dlock: fence: stored token %q is not a token", s)
	}
	return v, nil
}

// Offset lifts tokens above a floor: the token a guard sees is the grant's token
// plus the offset. Use it when a deployment's tokens went down (a move to another
// lock backend, a lock store restored from a backup) while resources still hold
// marks from before: set it above the highest mark any resource holds, the same for
// every writer of those resources.
//
// Adding a constant keeps the order of tokens, so the guard's rule still holds
// between writers that use the same offset. An offset may only ever be raised:
// a writer with a larger offset than a newer holder would beat it, which is the
// very failure fencing exists to prevent.
type Offset uint64

// Apply returns token + o. Token 0 is refused with ErrNoToken (an offset must not
// turn "cannot fence" into a valid token), and a sum that overflows uint64 with an
// error matching ErrInvalid.
func (o Offset) Apply(token uint64) (uint64, error) {
	if token == 0 {
		return 0, ErrNoToken
	}
	s := token + uint64(o)
	if s < token {
		return 0, Invalid("fence", "token %d plus offset %d overflows 64 bits", token, uint64(o))
	}
	return s, nil
}
