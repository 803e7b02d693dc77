// Package zkfence is dlock's fencing guard for ZooKeeper, on github.com/go-zookeeper/zk:
// a multi-op that sets a fence node's data to the caller's token on the condition of
// its version, together with the caller's own operations.
//
// # Guarantees
//
//   - Guard.Write applies the caller's operations only if the fence node held no
//     token higher than the caller's, and then the node holds the caller's token:
//     the token is compared with the node's data as read at version v, and the
//     multi sets the data only if the node is still at version v, so a write by
//     anyone in between makes the multi fail (and Write reads again). ZooKeeper
//     applies a multi all or nothing. Equal tokens pass.
//   - One round trip per write in the steady state: the guard remembers each fence
//     node's version and token from its last successful write, and reads the node
//     only when that guess turns out wrong (another writer moved it).
//
// # Not promised
//
//   - Deleting a fence node resets its resource: ZooKeeper restarts the version of
//     a re-created node at 0, so afterwards any token may pass once, including a
//     stale one. Never delete a fence node while its resource is in use.
//   - Operations outside the multi, and writers that do not use the fence node, are
//     not fenced.
//
// Tokens are the node's data, as 20 zero-padded decimal digits.
package zkfence

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/fence"
)

const guardName = "zkfence"

// attempts bounds the retries when other writers keep moving the fence node.
const attempts = 16

// Guard writes through fence nodes under one root path. It is safe for concurrent
// use.
type Guard struct {
	conn *zk.Conn
	root string
	acl  []zk.ACL

	mu    sync.Mutex
	known map[string]state // fence path -> state after our last write or read
}

type state struct {
	exists  bool
	version int32
	token   uint64
}

// New returns a guard whose fence nodes live under root (an absolute path such as
// "/app/fences", created on first use), created with acl (zk.WorldACL(zk.PermAll)
// when nil).
func New(conn *zk.Conn, root string, acl []zk.ACL) (*Guard, error) {
	if !strings.HasPrefix(root, "/") || (len(root) > 1 && strings.HasSuffix(root, "/")) || strings.Contains(root, "//") {
		return nil, fence.Invalid(guardName, "root %q: want an absolute path without a trailing slash", root)
	}
	for _, part := range strings.Split(root[1:], "/") {
		if part == "." || part == ".." {
			return nil, fence.Invalid(guardName, "root %q: no . or .. components", root)
		}
	}
	if root == "/" {
		root = ""
	}
	if acl == nil {
		acl = zk.WorldACL(zk.PermAll)
	}
	return &Guard{conn: conn, root: root, acl: acl, known: map[string]state{}}, nil
}

// Path returns the fence node of resource: root/<resource, path-escaped>.
func (g *Guard) Path(resource string) string { return g.root + "/" + url.PathEscape(resource) }

func (g *Guard) remembered(path string) (state, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st, ok := g.known[path]
	return st, ok
}

func (g *Guard) remember(path string, st state) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.known[path] = st
}

func (g *Guard) read(path string) (state, error) {
	data, stat, err := g.conn.Get(path)
	if errors.Is(err, zk.ErrNoNode) {
		return state{}, nil
	}
	if err != nil {
		return state{}, err
	}
	tk, err := fence.Decode(string(data))
	if err != nil {
		return state{}, fmt.Errorf("%w (node %s)", err, path)
	}
	return state{exists: true, version: stat.Version, token: tk}, nil
}

func opPath(op any) (string, error) {
	switch o := op.(type) {
	case *zk.CreateRequest:
		return o.Path, nil
	case *zk.SetDataRequest:
		return o.Path, nil
	case *zk.DeleteRequest:
		return o.Path, nil
	case *zk.CheckVersionRequest:
		return o.Path, nil
	}
	return "", fence.Invalid(guardName, "operation of type %T (want *zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest or *zk.CheckVersionRequest)", op)
}

// Write runs ops (as for zk.Conn.Multi) in one multi with the fence node's update
// if the resource's fence holds no token higher than token, and returns their
// responses. Otherwise nothing is written and the error is a *fence.StaleError
// (matching fence.ErrStale) with the fence's token. Token 0 is refused with
// fence.ErrNoToken, a bad resource name or operation with an error matching
// fence.ErrInvalid. If one of ops fails, nothing is written and the error names it.
// ctx is checked between attempts (the ZooKeeper client takes no context).
func (g *Guard) Write(ctx context.Context, resource string, token uint64, ops ...any) ([]zk.MultiResponse, error) {
	if err := fence.CheckToken(token); err != nil {
		return nil, err
	}
	if err := fence.CheckResource(guardName, resource); err != nil {
		return nil, err
	}
	path, err := g.checkOps(resource, ops)
	if err != nil {
		return nil, err
	}
	enc := []byte(fence.Encode(token))
	st, fresh := g.remembered(path)
	fresh = !fresh
	for range attempts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if fresh {
			var err error
			if st, err = g.read(path); err != nil {
				return nil, err
			}
		}
		if st.exists && !fence.Admits(st.token, token) {
			if !fresh { // a remembered token only bounds the current one from below
				fresh = true
				continue
			}
			return nil, &fence.StaleError{Resource: path, Token: token, Current: st.token}
		}
		var first any = &zk.SetDataRequest{Path: path, Data: enc, Version: st.version}
		if !st.exists {
			first = &zk.CreateRequest{Path: path, Data: enc, Acl: g.acl}
		}
		resp, err := g.conn.Multi(append([]any{first}, ops...)...)
		if err == nil {
			next := state{exists: true, token: token}
			if st.exists {
				next.version = st.version + 1
			}
			if len(resp) > 0 && resp[0].Stat != nil {
				next.version = resp[0].Stat.Version
			}
			g.remember(path, next)
			return resp[1:], nil
		}
		if len(resp) == 0 {
			return nil, err
		}
		switch fe := resp[0].Error; {
		case fe == nil:
			for i, r := range resp[1:] {
				if r.Error != nil {
					return nil, fmt.Errorf("dlock: fence: %s: operation %d: %w", guardName, i, r.Error)
				}
			}
			return nil, err
		case errors.Is(fe, zk.ErrBadVersion), errors.Is(fe, zk.ErrNodeExists):
			fresh = true // another writer moved or created the node: read it again
		case errors.Is(fe, zk.ErrNoNode) && !st.exists:
			if err := g.ensureRoot(); err != nil {
				return nil, err
			}
			fresh = true
		case errors.Is(fe, zk.ErrNoNode):
			fresh = true // deleted (a reset): read again
		default:
			return nil, fmt.Errorf("dlock: fence: %s: fence node %s: %w", guardName, path, fe)
		}
	}
	return nil, fmt.Errorf("dlock: fence: %s: the fence node %s kept moving, %d attempts", guardName, path, attempts)
}

// checkOps returns the fence node's path for resource, refusing a bad name and
// operations that would write the fence node itself.
func (g *Guard) checkOps(resource string, ops []any) (string, error) {
	if resource == "." || resource == ".." {
		return "", fence.Invalid(guardName, "resource name %q", resource)
	}
	path := g.Path(resource)
	for i, op := range ops {
		p, err := opPath(op)
		if err != nil {
			return "", err
		}
		if p == path {
			return "", fence.Invalid(guardName, "operation %d writes the fence node %s itself", i, path)
		}
	}
	return path, nil
}

// ensureRoot creates the root path, a component at a time.
func (g *Guard) ensureRoot() error {
	p := ""
	for _, part := range strings.Split(strings.TrimPrefix(g.root, "/"), "/") {
		if part == "" {
			continue
		}
		p += "/" + part
		if _, err := g.conn.Create(p, nil, 0, g.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("dlock: fence: %s: create %s: %w", guardName, p, err)
		}
	}
	return nil
}
