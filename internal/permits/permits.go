// Package permits remembers which of a client's grants it took as permits of a
// semaphore or a read-write lock, for the backends that keep permits in a table of
// their own beside the mutexes' rows (pglock, mysqllock): Refresh, Release and
// SetValue of a grant then go to the table where the client last saw it first, and
// a mutex's grant costs no lookup on a client that holds no permit.
package permits

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/dlockio/dlock/driver"
)

// Set is the (key, owner) grants a client took as permits, each marked a reader's
// or not. The zero Set is empty and ready; it is safe for concurrent use.
type Set struct {
	m sync.Map     // driver.Holder -> bool (a reader's permit)
	n atomic.Int64 // entries in m
}

// Remember records that owner's grant of key is a permit (a reader's if shared).
func (s *Set) Remember(key, owner string, shared bool) {
	if _, had := s.m.Swap(driver.Holder{Key: key, Owner: owner}, shared); !had {
		s.n.Add(1)
	}
}

// Has reports whether owner's grant of key was taken as a permit.
func (s *Set) Has(key, owner string) bool {
	if s.n.Load() == 0 {
		return false // no map lookup on a client that holds no permit
	}
	_, ok := s.m.Load(driver.Holder{Key: key, Owner: owner})
	return ok
}

// Shared reports whether owner's grant of key was taken as a reader's permit.
func (s *Set) Shared(key, owner string) bool {
	if s.n.Load() == 0 {
		return false
	}
	v, ok := s.m.Load(driver.Holder{Key: key, Owner: owner})
	return ok && v.(bool)
}

// Forget forgets owner's grant of key.
func (s *Set) Forget(key, owner string) {
	if s.n.Load() == 0 {
		return
	}
	if _, ok := s.m.LoadAndDelete(driver.Holder{Key: key, Owner: owner}); ok {
		s.n.Add(-1)
	}
}

// Either runs an operation on owner's grant of key where the client last saw it
// (sem first for a grant remembered as a permit, mutex first for any other) and,
// when that returns an error matching driver.ErrNotHeld and permits work here
// (semOK), the other one.
func (s *Set) Either(key, owner string, semOK bool, mutex, sem func() error) error {
	first, second := mutex, sem
	if s.Has(key, owner) {
		first, second = sem, mutex
	}
	err := first()
	if errors.Is(err, driver.ErrNotHeld) && semOK {
		err = second()
	}
	return err
}
