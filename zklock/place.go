package zklock

// What an attempt reads from a listing of the contenders of a key: who holds
// (a mutex's lowest child, a semaphore's N lowest, a read-write lock's readers
// below the lowest writer or that writer alone), whether the attempt's limit
// agrees with theirs, and whether the owner already holds through another client.

import (
	"fmt"

	"github.com/dlockio/dlock/driver"
)

// rwPlace gathers, in one pass over an unsorted listing, what a read-write lock's
// attempt needs to know of the contenders below its child.
type rwPlace struct {
	writers, readers int
	nearest, lowest  child // the highest and the lowest writer's child below
	first            child // the lowest child below
}

func (p *rwPlace) add(c child) {
	if p.writers+p.readers == 0 || c.seq < p.first.seq {
		p.first = c
	}
	if c.shared {
		p.readers++
		return
	}
	if p.writers == 0 || c.seq > p.nearest.seq {
		p.nearest = c
	}
	if p.writers == 0 || c.seq < p.lowest.seq {
		p.lowest = c
	}
	p.writers++
}

// holding returns how many of the children of q below own hold the key: the lowest
// alone when it is a writer's, else the readers' below the lowest writer's.
func (p *rwPlace) holding(q []child, own int64) int {
	if p.writers+p.readers == 0 {
		return 0
	}
	if !p.first.shared {
		return 1
	}
	if p.writers == 0 {
		return p.readers
	}
	n := 0
	for _, c := range q {
		if c.shared && c.seq < p.lowest.seq && c.seq < own {
			n++
		}
	}
	return n
}

// checkLimit reports whether limit agrees with the contenders of q queued before
// the child of sequence own, and if not, the limit that disagrees. Every child
// carries its attempt's limit in its name (see names.go) and is checked this way
// once, when first listed, and deleted if it disagrees, before it counts as a
// holder: so of any two children that live past their check, the younger was
// checked against the older and their limits agree. The contenders after own are
// not looked at: each is checked against own.
func checkLimit(q []child, own int64, limit int) (cur int, ok bool) {
	for _, c := range q {
		if c.seq < own && c.limit != limit {
			return c.limit, false
		}
	}
	return 0, true
}

// twinReading returns the name of a reader's child of owner, other than those of
// the attempt's GUID, that holds the key in q (no writer's child below it); "" if
// none does.
func twinReading(q []child, owner, guid string) string {
	for _, c := range q {
		if c.owner != owner || c.guid == guid || !c.shared {
			continue
		}
		free := true
		for _, d := range q {
			if !d.shared && d.seq < c.seq {
				free = false
				break
			}
		}
		if free {
			return c.name
		}
	}
	return ""
}

// twinHolding returns the name of a child of owner, other than those of the
// attempt's GUID, that holds one of the limit's permits in q; "" if none does.
func twinHolding(q []child, owner, guid string, limit int) string {
	for _, c := range q {
		if c.owner != owner || c.guid == guid {
			continue
		}
		idx := 0
		for _, d := range q {
			if d.seq < c.seq {
				idx++
			}
		}
		if idx < limit {
			return c.name
		}
	}
	return ""
}

// mismatch is the error of an attempt whose limit is not the key's.
func mismatch(key string, cur, limit int) error {
	if cur == 0 {
		return fmt.Errorf("zklock: acquire %q: %w: the key's holders carry a limit this version cannot read, the attempt asked for %d",
			key, driver.ErrLimitMismatch, limit)
	}
	return fmt.Errorf("zklock: acquire %q: %w: the key admits %d holders, the attempt asked for %d",
		key, driver.ErrLimitMismatch, cur, limit)
}
