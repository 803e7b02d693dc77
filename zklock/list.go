package zklock

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
)

var _ driver.Lister = (*Backend)(nil)

// lockNodePrefix starts the name of every lock node under the root (LockPath).
const lockNodePrefix = "k-"

// listParallel is how many keys List reads at once: their requests share the
// session's connection, pipelined.
const listParallel = 64

// List implements driver.Lister. It lists the root's children, keeps the lock
// nodes (named as LockPath names them) whose key starts with prefix, and reads
// the holders of each as Holders does: a listing of its queue, then the holders'
// nodes. The keys are read a few dozen at a time, their requests sent together on
// the session's connection. The reads are not one snapshot: each key's holders
// are as of its own reads, and a lock node the server has not yet removed since
// its last contender left is skipped as one without holders.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	var names []string
	err := b.call(ctx, func() error {
		var err error
		names, _, err = b.conn.Children(b.rootPath())
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil // no root (create_root=false): no locks
	}
	if err != nil {
		return nil, wrap("list", prefix, err)
	}
	var keys []string
	for _, n := range names {
		if key, ok := lockNodeKey(n); ok && strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	holders := make([][]driver.Info, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, listParallel)
	var wg sync.WaitGroup
	for i, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, holders[i], errs[i] = b.Holders(ctx, key)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(holders...), nil
}

// lockNodeKey returns the key of the lock node named name (LockPath's last
// part), and false for a name LockPath does not make: no "k-", or an escaping
// that url.PathEscape would not have written.
func lockNodeKey(name string) (string, bool) {
	esc, ok := strings.CutPrefix(name, lockNodePrefix)
	if !ok {
		return "", false
	}
	key, err := url.PathUnescape(esc)
	if err != nil || key == "" || url.PathEscape(key) != esc || driver.ValidateKey(key) != nil {
		return "", false
	}
	return key, true
}
