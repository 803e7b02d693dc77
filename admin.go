package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Info describes the holder of a key, as Client.Inspect reads it from the server.
type Info struct {
	// Key is the key inspected.
	Key string
	// Owner is the holder's owner id (see WithOwner).
	Owner string
	// Token is the fencing token of the holder's grant; 0 when the backend cannot
	// fence.
	Token Token
	// TTL is the time left before the server expires the grant unless it is
	// renewed; 0 when the backend does not know.
	TTL time.Duration
	// Waiters is the number of callers queued for the key on the server, or -1
	// when the backend does not know.
	Waiters int
	// Value is the value stored with the holder's grant (WithValue, Campaign,
	// Proclaim); nil if none or the backend cannot store values.
	Value []byte
	// Shared is true for a shared (read) holder (WithShared).
	Shared bool
}

// Inspect reads who holds key on the server: the holder's owner id, its fencing
// token, the time left on its grant and the number of waiters. It returns an error
// matching ErrNotHeld when no one holds key, and one matching ErrUnsupported and
// errors.ErrUnsupported when the backend cannot tell (it is not a
// driver.Inspector). key is validated as Lock validates it.
//
// What it returns is a snapshot: the holder may release or lose the key, and
// another take it, by the time the call returns. Nothing here is a basis for
// deciding who may write a resource; that is what fencing tokens are for.
func (c *Client) Inspect(ctx context.Context, key string) (Info, error) {
	if err := c.adminCheck(key); err != nil {
		return Info{}, err
	}
	in, ok := c.b.(driver.Inspector)
	if !ok {
		return Info{}, unsupported("inspect", key)
	}
	di, err := in.Inspect(ctx, key)
	if err != nil {
		return Info{}, err
	}
	return infoOf(di), nil
}

// ForceRelease frees key whoever holds it, for an operator clearing a lock whose
// holder is stuck. It returns an error matching ErrNotHeld when no one holds key,
// and one matching ErrUnsupported and errors.ErrUnsupported when the backend cannot
// (it is not a driver.ForceReleaser). key is validated as Lock validates it.
//
// Safety: the old holder is not told and may still be running, believing it holds
// the key, until its next renewal fails (its lease then ends with ErrLeaseLost). In
// the meantime the next caller may be granted the key, so two processes may act as
// holder at once. The next grant's fencing token is larger than the old one's, so a
// resource that checks tokens rejects the old holder's writes: force-release only
// keys whose resources are fenced, or whose holder is known to be gone.
func (c *Client) ForceRelease(ctx context.Context, key string) error {
	if err := c.adminCheck(key); err != nil {
		return err
	}
	fr, ok := c.b.(driver.ForceReleaser)
	if !ok {
		return unsupported("force release", key)
	}
	return fr.ForceRelease(ctx, key)
}

// Holders lists every holder of key, the oldest grant first, and the key's holder
// limit (1 for an ordinary lock, n for a semaphore of WithLimit(n)); no holders
// and limit 0 when the key is free. It returns an error matching ErrUnsupported
// when the backend cannot list holders (neither a driver.Semaphorer nor a
// driver.HolderLister); Inspect then tells the one holder. A snapshot, like
// Inspect's.
func (c *Client) Holders(ctx context.Context, key string) (limit int, holders []Info, err error) {
	if err := c.adminCheck(key); err != nil {
		return 0, nil, err
	}
	var dh []driver.Info
	if c.sem != nil {
		limit, dh, err = c.sem.Holders(ctx, key)
	} else if hl, ok := c.b.(driver.HolderLister); ok {
		dh, err = hl.ListHolders(ctx, key)
		if len(dh) > 0 {
			limit = 1
		}
	} else {
		return 0, nil, unsupported("list holders", key)
	}
	if err != nil {
		return 0, nil, err
	}
	holders = make([]Info, len(dh))
	for i, di := range dh {
		holders[i] = infoOf(di)
	}
	return limit, holders, nil
}

// List returns the holders of every key that starts with prefix ("" for every
// key), ordered by key and, within a key, oldest grant first: one Info per holder,
// with its owner id, token, TTL left, value, Shared, and Waiters as Inspect reports
// them. On a backend that cannot enumerate its locks (see driver.Lister) it returns
// an error matching ErrUnsupported. It may read every lock the backend keeps: use
// it to look, not on a hot path.
func (c *Client) List(ctx context.Context, prefix string) ([]Info, error) {
	if prefix != "" {
		if err := driver.ValidateKey(prefix); err != nil {
			return nil, err
		}
	}
	if err := c.adminCheck("list"); err != nil {
		return nil, err
	}
	ls, ok := c.b.(driver.Lister)
	if !ok {
		return nil, unsupported("list locks", prefix)
	}
	dl, err := ls.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	infos := make([]Info, len(dl))
	for i, di := range dl {
		infos[i] = infoOf(di)
	}
	return infos, nil
}

// Waiters lists the queued places of key in the order they will be served: each
// with its owner id, Shared for a reader's place, its value if any, and TTL, how
// long the place lives if its owner stops asking (0 if the backend does not know).
// On a backend that cannot list them (see driver.Queuer) it returns an error
// matching ErrUnsupported.
func (c *Client) Waiters(ctx context.Context, key string) ([]Info, error) {
	if err := c.adminCheck(key); err != nil {
		return nil, err
	}
	q, ok := c.b.(driver.Queuer)
	if !ok {
		return nil, unsupported("list waiters", key)
	}
	dq, err := q.Queue(ctx, key)
	if err != nil {
		return nil, err
	}
	places := make([]Info, len(dq))
	for i, di := range dq {
		places[i] = infoOf(di)
	}
	return places, nil
}

func infoOf(di driver.Info) Info {
	return Info{Key: di.Key, Owner: di.Owner, Token: Token(di.Token), TTL: di.TTL, Waiters: di.Waiters, Value: di.Value, Shared: di.Shared}
}

// adminCheck validates key and refuses a closed client.
func (c *Client) adminCheck(key string) error {
	if err := driver.ValidateKey(key); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// unsupported is the error of an optional capability the backend lacks: it
// matches ErrUnsupported and errors.ErrUnsupported.
func unsupported(op, key string) error {
	return fmt.Errorf("dlock: %s %q: %w (%w)", op, key, ErrUnsupported, errors.ErrUnsupported)
}
