package zklock

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// Child names: lock-<owner>-<GUID>-<10 digit sequence>. The GUID is 32 characters:
// for a mutex (limit 1) or a read-write lock's writer 32 lowercase hex digits, as
// older versions write it; for a semaphore of N permits 22 hex digits, "-n" and N in
// 8 decimal digits; for a read-write lock's reader 22 hex digits, "-s" and
// "00000001". A listing thus tells every contender's limit and mode without reading
// its data. An older version parses them all alike (it takes any 32 characters for
// the GUID), and takes a reader's child for a mutex's.
const (
	childPrefix = "lock-"
	guidLen     = 32
	seqLen      = 10
	limitMark   = "-n"
	sharedMark  = "-s"
	limitLen    = 8
	randLen     = guidLen - len(limitMark) - limitLen
)

type child struct {
	name, owner, guid string
	seq               int64
	limit             int  // 1 for a mutex's child (and every older version's)
	shared            bool // a reader's child (limit 1)
}

func parseChild(name string) (child, bool) {
	n := len(name)
	if n < len(childPrefix)+1+1+guidLen+1+seqLen || !strings.HasPrefix(name, childPrefix) ||
		name[n-seqLen-1] != '-' || name[n-seqLen-1-guidLen-1] != '-' {
		return child{}, false
	}
	seq, err := strconv.ParseInt(name[n-seqLen:], 10, 64)
	if err != nil || seq < 0 {
		return child{}, false
	}
	owner := name[len(childPrefix) : n-seqLen-1-guidLen-1]
	if !validOwner(owner) {
		return child{}, false
	}
	guid := name[n-seqLen-1-guidLen : n-seqLen-1]
	return child{name: name, owner: owner, guid: guid, seq: seq, limit: guidLimit(guid), shared: guidShared(guid)}, true
}

// guidShared reports whether a GUID is a reader's.
func guidShared(guid string) bool {
	return len(guid) == guidLen && guid[randLen:randLen+len(sharedMark)] == sharedMark
}

// guidLimit returns the limit a GUID carries: 1 for a mutex's, 0 for one that
// carries a limit this version cannot read (such a child conflicts with every
// attempt, see checkLimit).
func guidLimit(guid string) int {
	if len(guid) != guidLen || guid[randLen:randLen+len(limitMark)] != limitMark {
		return 1
	}
	n := 0
	for _, c := range []byte(guid[randLen+len(limitMark):]) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	if n < 2 {
		return 0
	}
	return n
}

// ownerByte marks the bytes an owner id may contain (driver.ValidateOwner).
var ownerByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
	}
	return t
}()

// validOwner is driver.ValidateOwner(owner) == nil, without building an error: it
// runs for every child of every listing.
func validOwner(owner string) bool {
	if owner == "" || len(owner) > driver.MaxOwnerLen {
		return false
	}
	for i := 0; i < len(owner); i++ {
		if !ownerByte[owner[i]] {
			return false
		}
	}
	return true
}

// contenders parses the contenders among names, in no particular order.
func contenders(names []string) []child {
	cs := make([]child, 0, len(names))
	for _, n := range names {
		if c, ok := parseChild(n); ok {
			cs = append(cs, c)
		}
	}
	return cs
}

func bySeq(a, b child) int { return cmp.Compare(a.seq, b.seq) }

// queue parses and sorts the contenders among names.
func queue(names []string) []child {
	cs := contenders(names)
	slices.SortFunc(cs, bySeq)
	return cs
}

// maxLimit is the largest limit a child's name can carry.
const maxLimit = 99_999_999

// newGUID returns the GUID of a new child of an attempt with the given limit and
// mode: random, and carrying the limit when it is above 1, the reader's mark when
// shared is set (the limit is then 1).
func newGUID(limit int, shared bool) string {
	if shared {
		return driver.RandomHex(randLen/2) + sharedMark + fmt.Sprintf("%0*d", limitLen, 1)
	}
	if limit <= 1 {
		return driver.RandomHex(guidLen / 2)
	}
	return driver.RandomHex(randLen/2) + limitMark + fmt.Sprintf("%0*d", limitLen, limit)
}

func pathBase(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }
