package redlock

import (
	"fmt"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// NodeError is the failure of one node in an operation. Errors from several nodes are
// combined with errors.Join; use errors.As to find them.
type NodeError struct {
	Addr string
	Err  error
}

// Error names the node and its error.
func (e *NodeError) Error() string { return "redlock node " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *NodeError) Unwrap() error { return e.Err }

// QuorumError reports an operation that did not reach a majority of the nodes. An
// acquire's QuorumError matches driver.ErrLocked (it wraps a *driver.HeldError), so the
// core retries; a refresh or release that proves the owner no longer holds a majority
// matches driver.ErrNotHeld. Err joins the nodes' *NodeError values.
type QuorumError struct {
	Op    string // "acquire", "refresh", "release", ...
	Key   string
	OK    int // nodes that did what was asked
	Need  int // the majority
	Nodes int
	Held  int    // acquire: nodes that answered that another owner holds the key
	Note  string // why a majority of OKs was still not enough, if so
	Err   error  // errors.Join of *NodeError, or nil

	held    *driver.HeldError // for acquire
	notHeld bool
}

// Error says how many nodes answered and why that was not enough.
func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "redlock: %s %q: no majority: %d of %d nodes ok (need %d)", e.Op, e.Key, e.OK, e.Nodes, e.Need)
	if e.Held > 0 {
		fmt.Fprintf(&b, ", %d held by another owner", e.Held)
	}
	if e.Note != "" {
		b.WriteString(", " + e.Note)
	}
	if e.held != nil && e.held.RetryAfter > 0 {
		fmt.Fprintf(&b, " (free in %v unless renewed)", e.held.RetryAfter)
	}
	if e.notHeld {
		b.WriteString(": " + driver.ErrNotHeld.Error())
	}
	if e.Err != nil {
		b.WriteString(": " + strings.ReplaceAll(e.Err.Error(), "\n", "; "))
	}
	return b.String()
}

// Unwrap returns the node errors and, for an acquire, a *driver.HeldError, or, when
// the owner provably holds no majority, driver.ErrNotHeld.
func (e *QuorumError) Unwrap() []error {
	var errs []error
	if e.held != nil {
		errs = append(errs, e.held)
	}
	if e.notHeld {
		errs = append(errs, driver.ErrNotHeld)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
