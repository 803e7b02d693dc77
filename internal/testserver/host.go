package testserver

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// TB is what the server helpers of this package need from their caller: the part
// of testing.TB they use. A *testing.T or *testing.B is one; so is a Host, which
// lets the helpers run outside a test without linking package testing.
type TB interface {
	Helper()
	Cleanup(func())
	TempDir() string
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Error(args ...any)
	Errorf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Host lets the server helpers of this package run outside a test (dlock bench and
// dlock check start real servers with them). It is a TB whose Fatal and Skip end
// the helper with an error (returned by Try), whose Cleanup functions run at Close,
// and whose TempDir is under one directory removed at Close.
type Host struct {
	name, dir string

	mu       sync.Mutex
	cleanups []func()
	n        int
}

// NewHost makes a Host whose temporary directories live under a new directory in
// the system's temporary directory, named after name.
func NewHost(name string) (*Host, error) {
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		return nil, err
	}
	return &Host{name: name, dir: dir}, nil
}

// Dir returns the directory that holds the host's temporary directories.
func (h *Host) Dir() string { return h.dir }

type hostAbort struct{ err error }

// Helper does nothing.
func (h *Host) Helper() {}

// Fatalf ends the running helper with an error.
func (h *Host) Fatalf(f string, a ...any) { panic(hostAbort{fmt.Errorf(f, a...)}) }

// Fatal ends the running helper with an error.
func (h *Host) Fatal(a ...any) { panic(hostAbort{errors.New(fmt.Sprint(a...))}) }

// Errorf ends the running helper with an error.
func (h *Host) Errorf(f string, a ...any) { panic(hostAbort{fmt.Errorf(f, a...)}) }

// Error ends the running helper with an error.
func (h *Host) Error(a ...any) { panic(hostAbort{errors.New(fmt.Sprint(a...))}) }

// Skipf ends the running helper with an error.
func (h *Host) Skipf(f string, a ...any) { panic(hostAbort{fmt.Errorf(f, a...)}) }

// Cleanup registers f to run at Close.
func (h *Host) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}

// TempDir returns a new directory under the host's directory.
func (h *Host) TempDir() string {
	h.mu.Lock()
	h.n++
	n := h.n
	h.mu.Unlock()
	d, err := os.MkdirTemp(h.dir, fmt.Sprintf("%03d-", n))
	if err != nil {
		h.Fatalf("temporary directory: %v", err)
	}
	return d
}

// Try runs f with the host as its TB, turning a Fatal or Skip into an error.
func Try[T any](h *Host, f func(TB) T) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			a, ok := r.(hostAbort)
			if !ok {
				panic(r)
			}
			err = a.err
		}
	}()
	return f(h), nil
}

// Close runs the cleanups (last registered first: servers stop) and removes the
// host's directory.
func (h *Host) Close() {
	h.mu.Lock()
	fs := h.cleanups
	h.cleanups = nil
	h.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	_ = os.RemoveAll(h.dir)
}
