package zklock

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// Child names: lock-<owner>-<32 hex GUID>-<10 digit sequence>.
const (
	childPrefix = "lock-"
	guidLen     = 32
	seqLen      = 10
)

type child struct {
	name, owner, guid string
	seq               int64
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
	return child{name: name, owner: owner, guid: name[n-seqLen-1-guidLen : n-seqLen-1], seq: seq}, true
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

// newGUID returns the random part of a child's name (guidLen hex digits).
func newGUID() string { return driver.RandomHex(guidLen / 2) }

func pathBase(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }
