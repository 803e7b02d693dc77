// Package httpfence carries fencing tokens over HTTP: server middleware that checks
// a request's token header against a high-water store and answers 409 Conflict with
// the current token, and a client RoundTripper that adds the header from a lease.
// Standard library only (and dlock's core, for leases).
//
// # What the middleware promises, exactly
//
// For one resource, within one process: Handler admits a request only if its token
// is not lower than every token admitted before (Store.Admit raises the mark
// atomically), and it holds a per-resource lock from the check until the wrapped
// handler returns, so handlers of one resource never overlap and run in
// non-decreasing token order. So if the wrapped handlers are the only writers of the
// resource, run in this one process, and finish their writes before they return,
// no write with a stale token ever lands after a newer one.
//
// # What it does not promise
//
// The per-resource lock is local to the process. With several server processes
// (replicas behind a load balancer), even with one shared Store, a request admitted
// by one process can still be writing when another process admits and completes a
// newer one: the stale write lands after it. Then the middleware is only a front
// check that turns most stale requests away early; the write itself must be guarded
// by its store (pgfence, redisfence, etcdfence, zkfence), with the token that
// TokenFrom returns inside the handler. The same holds for handlers that write in
// the background after returning.
package httpfence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
)

const guardName = "httpfence"

// Header is the request header that carries the fencing token, in decimal.
const Header = "Dlock-Fence-Token"

// CurrentHeader is the response header of a 409 Conflict: the newer token the
// resource has accepted, in decimal.
const CurrentHeader = "Dlock-Fence-Current"

// Store keeps a high-water mark per resource.
type Store interface {
	// Admit applies the fencing rule atomically: if token is not lower than the
	// resource's mark, the mark becomes token and Admit returns nil; otherwise it
	// returns a *fence.StaleError with the mark, and changes nothing.
	Admit(ctx context.Context, resource string, token uint64) error
}

// StoreFunc adapts a function to Store, for example one that runs a store's guard
// with no other write (a mark shared by several processes; still only a front
// check, see the package documentation).
type StoreFunc func(ctx context.Context, resource string, token uint64) error

// Admit calls f.
func (f StoreFunc) Admit(ctx context.Context, resource string, token uint64) error {
	return f(ctx, resource, token)
}

// Memory is a Store in process memory. The zero value is ready to use.
type Memory struct {
	mu    sync.Mutex
	marks map[string]uint64
}

// Admit implements Store.
func (m *Memory) Admit(_ context.Context, resource string, token uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := fence.Check(resource, m.marks[resource], token); err != nil {
		return err
	}
	if m.marks == nil {
		m.marks = map[string]uint64{}
	}
	m.marks[resource] = token
	return nil
}

// Mark returns the resource's mark (0 if none).
func (m *Memory) Mark(resource string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marks[resource]
}

// Option configures Handler.
type Option func(*middleware)

// WithResource sets how a request names its resource (default: its URL path).
func WithResource(f func(*http.Request) string) Option {
	return func(m *middleware) { m.resource = f }
}

type middleware struct {
	store    Store
	next     http.Handler
	resource func(*http.Request) string

	mu    sync.Mutex
	locks map[string]*resLock
}

type resLock struct {
	ch   chan struct{} // holds one value while the resource is locked
	refs int
}

type tokenKey struct{}

// TokenFrom returns the token Handler admitted for the request, for the handler
// to pass on to the guard of the store it writes.
func TokenFrom(ctx context.Context) (uint64, bool) {
	t, ok := ctx.Value(tokenKey{}).(uint64)
	return t, ok
}

// Handler wraps next: a request runs next only with a Header token that store
// admits for its resource, while holding the resource's lock in this process. It
// answers 428 when the header is missing, 400 when it is not a token (or is 0, or
// the resource name is bad), 409 with CurrentHeader when the token is stale, and
// 503 when the store fails or the request ends while waiting for the lock.
func Handler(store Store, next http.Handler, opts ...Option) http.Handler {
	m := &middleware{store: store, next: next, resource: func(r *http.Request) string { return r.URL.Path }, locks: map[string]*resLock{}}
	for _, o := range opts {
		o(m)
	}
	return m
}

func (m *middleware) lock(ctx context.Context, res string) (func(), error) {
	m.mu.Lock()
	l := m.locks[res]
	if l == nil {
		l = &resLock{ch: make(chan struct{}, 1)}
		m.locks[res] = l
	}
	l.refs++
	m.mu.Unlock()
	drop := func() {
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, res)
		}
		m.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw := r.Header.Get(Header)
	if raw == "" {
		http.Error(w, fmt.Sprintf("dlock fence: missing %s header", Header), http.StatusPreconditionRequired)
		return
	}
	token, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		http.Error(w, fmt.Sprintf("dlock fence: %s header %q is not a token", Header, raw), http.StatusBadRequest)
		return
	}
	res := m.resource(r)
	if err := fence.CheckToken(token); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := fence.CheckResource(guardName, res); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	unlock, err := m.lock(r.Context(), res)
	if err != nil {
		http.Error(w, "dlock fence: request ended while waiting for its resource", http.StatusServiceUnavailable)
		return
	}
	defer unlock()
	if err := m.store.Admit(r.Context(), res, token); err != nil {
		var se *fence.StaleError
		if errors.As(err, &se) {
			w.Header().Set(CurrentHeader, strconv.FormatUint(se.Current, 10))
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		http.Error(w, "dlock fence: store: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	m.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenKey{}, token)))
}

// Transport is an http.RoundTripper that adds Header to every request, with the
// token Token returns; a request whose token source fails is not sent.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Token returns the token to send: LeaseToken, or your own.
	Token func() (uint64, error)
}

// RoundTrip implements http.RoundTripper. It does not modify req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Token == nil {
		return nil, fence.Invalid(guardName, "Transport without a Token source")
	}
	tk, err := t.Token()
	if err == nil {
		err = fence.CheckToken(tk)
	}
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Header.Set(Header, strconv.FormatUint(tk, 10))
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// LeaseToken returns a token source for Transport: the lease's token while the
// lease is held, and its error (matching dlock.ErrLeaseLost or dlock.ErrReleased)
// once it is not. A request already on its way is not recalled: the server's check
// is what stops it.
func LeaseToken(l *dlock.Lease) func() (uint64, error) {
	return func() (uint64, error) {
		if err := l.Err(); err != nil {
			return 0, err
		}
		return uint64(l.Token()), nil
	}
}

// ResponseError returns a *fence.StaleError (matching fence.ErrStale) for a 409
// response that carries CurrentHeader, and nil for any other response.
func ResponseError(resp *http.Response, token uint64) error {
	if resp.StatusCode != http.StatusConflict {
		return nil
	}
	cur, err := strconv.ParseUint(resp.Header.Get(CurrentHeader), 10, 64)
	if err != nil {
		return nil
	}
	res := ""
	if resp.Request != nil {
		res = resp.Request.URL.Path
	}
	return &fence.StaleError{Resource: res, Token: token, Current: cur}
}
