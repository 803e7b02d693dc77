package etcdlock

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

var _ driver.Lister = (*Backend)(nil)

// List implements driver.Lister. It is one range read, with values, of every key
// from prefix/E, E the escaped lock-key prefix (see Lock ranges: a lock key starts
// with the lock-key prefix exactly when its escaped form starts with E), keeping
// the member keys of locks under the backend's prefix itself; each lock's members
// are sorted by create revision and its holders decided as Holders decides them
// (the first member, the first N of a semaphore of N, or the readers at the
// front), then one lease query per distinct lease for the TTLs. A grant whose
// lease expired is gone from etcd, so it is not listed.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	start := b.prefix + "/" + keyEscaper.Replace(prefix)
	var g *clientv3.GetResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		g, err = b.cli.Get(ctx, start, clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, wrap("list", prefix, err)
	}
	members := map[string][]*mvccpb.KeyValue{}
	var keys []string
	for _, kv := range g.Kvs {
		key, ok := lockKeyOf(b.prefix, string(kv.Key))
		if !ok {
			continue
		}
		if _, seen := members[key]; !seen {
			keys = append(keys, key)
		}
		members[key] = append(members[key], kv)
	}
	// etcd orders the escaped keys, which is not the order of the keys ("/" is
	// escaped as %2F).
	slices.Sort(keys)
	ttls := map[int64]time.Duration{}
	var infos []driver.Info
	for _, key := range keys {
		kvs := members[key]
		slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
		held := heldCount(kvs)
		infos, err = b.holderInfos(ctx, key, kvs[:held], len(kvs)-held, ttls, infos)
		if err != nil {
			return nil, wrap("list", prefix, err)
		}
	}
	return infos, nil
}
