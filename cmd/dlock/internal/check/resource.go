package check

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/etcdfence"
	"github.com/dlockio/dlock/fence/pgfence"
	"github.com/dlockio/dlock/fence/redisfence"
	"github.com/dlockio/dlock/internal/testserver"
)

// Resources: what the workers write to from their critical sections.
const (
	// ResourceStore is the checker's own store (see Store).
	ResourceStore = "store"
	// ResourcePostgres is a PostgreSQL server; fenced writes go through pgfence.
	ResourcePostgres = "postgres"
	// ResourceRedis is a redis-server; fenced writes go through redisfence.
	ResourceRedis = "redis"
	// ResourceEtcd is a single-member etcd of its own; fenced writes go through
	// etcdfence.
	ResourceEtcd = "etcd"
)

// ResourceEnv is the environment variable that gives a worker the URL of a real
// resource (it may carry a password, which must not show in the process list).
const ResourceEnv = "DLOCK_CHECK_RESOURCE_URL"

var resourceDocs = map[string]string{
	ResourceStore:    "the checker's own store: a tiny TCP server that compares tokens itself (fenced) or accepts every write (unfenced)",
	ResourcePostgres: "a PostgreSQL server of its own; each write is one transaction that bumps the key's row and appends (worker, lease, token, key) to a log table, guarded by pgfence.Guard.Do (fenced) or not (unfenced)",
	ResourceRedis:    "a redis-server of its own; each write appends (worker, lease, token, key) to a list, inside redisfence.Exec's script (fenced) or as a plain RPUSH (unfenced)",
	ResourceEtcd:     "a single-member etcd of its own; each write puts (worker, lease, token, key) under a log prefix, in an etcdfence.Txn (fenced) or as a plain Put (unfenced)",
}

// Resources lists the resource names in order, the checker's own store first.
func Resources() []string {
	return []string{ResourceStore, ResourceEtcd, ResourcePostgres, ResourceRedis}
}

// ResourceDoc describes a resource in one sentence.
func ResourceDoc(name string) string { return resourceDocs[name] }

// Names in the resources.
const (
	resPrefix   = "dlock-check"           // fence resource names, etcd prefix, redis key prefix
	pgDataTable = "dlock_check_data"      // one row per key: the number of writes it committed
	pgLogTable  = "dlock_check_log"       // one row per committed write
	redisLogKey = "dlock-check:log"       // list of committed writes, in commit order
	etcdLogPref = "dlock-check/log/"      // one key per committed write
	etcdFence   = "dlock-check/fence/"    // etcdfence's fence keys, one per lock key
	redisFence  = "dlock-check:fence:"    // redisfence's fence keys, one per lock key
	pgFenceName = resPrefix + "/"         // pgfence resource names: prefix + lock key
	rejectedMsg = "rejected by the guard" // prefix of a write op's Err when the resource refused it
)

// resource is a started real resource as the checker sees it: the URL workers
// write to, and the log read back after the run.
type resource struct {
	name string
	url  string // for the workers (in ResourceEnv)
	desc string // for the history: the URL with secrets redacted
	// log reads back the committed writes: per key in commit order.
	log func(ctx context.Context) ([]loggedWrite, error)
}

// loggedWrite is one write the resource committed, as its log holds it.
type loggedWrite struct {
	Process, Lease int
	Token          uint64
	Key            string
	Sent           int64 // the worker's CLOCK_MONOTONIC when it sent the write (its op's Start)
}

func (w loggedWrite) encode() string {
	return fmt.Sprintf("%d %d %d %d %s", w.Process, w.Lease, w.Token, w.Sent, w.Key)
}

func decodeWrite(s string) (loggedWrite, error) {
	f := strings.SplitN(s, " ", 5)
	if len(f) != 5 {
		return loggedWrite{}, fmt.Errorf("check: bad log entry %q", s)
	}
	var w loggedWrite
	var e [4]error
	w.Process, e[0] = strconv.Atoi(f[0])
	w.Lease, e[1] = strconv.Atoi(f[1])
	w.Token, e[2] = strconv.ParseUint(f[2], 10, 64)
	w.Sent, e[3] = strconv.ParseInt(f[3], 10, 64)
	w.Key = f[4]
	if err := errors.Join(e[:]...); err != nil || w.Key == "" {
		return loggedWrite{}, fmt.Errorf("check: bad log entry %q", s)
	}
	return w, nil
}

// startResource starts the named real resource's server (cleaned up by tb) and
// prepares it for the workers.
func startResource(tb testserver.TB, name string) *resource {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch name {
	case ResourcePostgres:
		p := testserver.StartPostgres(tb)
		pool, err := pgxpool.New(ctx, p.URL())
		if err != nil {
			tb.Fatalf("resource postgres: %v", err)
		}
		tb.Cleanup(pool.Close)
		g, err := pgfence.New()
		if err != nil {
			tb.Fatalf("resource postgres: %v", err)
		}
		if err := g.Setup(ctx, pool); err != nil {
			tb.Fatalf("resource postgres: %v", err)
		}
		ddl := `CREATE TABLE ` + pgDataTable + ` (key text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE ` + pgLogTable + ` (key text NOT NULL, n bigint NOT NULL, worker int NOT NULL, lease int NOT NULL,
	token numeric(20,0) NOT NULL, sent bigint NOT NULL, PRIMARY KEY (key, n))`
		if _, err := pool.Exec(ctx, ddl); err != nil {
			tb.Fatalf("resource postgres: %v", err)
		}
		return &resource{name: name, url: p.URL(), desc: p.Addr(), log: func(ctx context.Context) ([]loggedWrite, error) {
			return pgLog(ctx, pool)
		}}
	case ResourceRedis:
		r := testserver.StartRedis(tb)
		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
		tb.Cleanup(func() { c.Close() })
		return &resource{name: name, url: r.URL(), desc: r.Addr(), log: func(ctx context.Context) ([]loggedWrite, error) {
			return redisLog(ctx, c)
		}}
	case ResourceEtcd:
		e := testserver.StartEtcd(tb)
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			tb.Fatalf("resource etcd: %v", err)
		}
		tb.Cleanup(func() { c.Close() })
		return &resource{name: name, url: "http://" + e.Endpoint(), desc: e.Endpoint(), log: func(ctx context.Context) ([]loggedWrite, error) {
			return etcdLog(ctx, c)
		}}
	}
	tb.Fatalf("unknown resource %q", name)
	return nil
}

// pgLog reads the log table: per key in the order of n, which is commit order
// (each write bumps the key's row, whose lock it holds until it commits).
func pgLog(ctx context.Context, pool *pgxpool.Pool) ([]loggedWrite, error) {
	rows, err := pool.Query(ctx, `SELECT worker, lease, token::text, sent, key FROM `+pgLogTable+` ORDER BY key, n`)
	if err != nil {
		return nil, fmt.Errorf("check: read the postgres log: %w", err)
	}
	var out []loggedWrite
	for rows.Next() {
		var w loggedWrite
		var tok string
		if err := rows.Scan(&w.Process, &w.Lease, &tok, &w.Sent, &w.Key); err != nil {
			rows.Close()
			return nil, fmt.Errorf("check: read the postgres log: %w", err)
		}
		if w.Token, err = strconv.ParseUint(tok, 10, 64); err != nil {
			rows.Close()
			return nil, fmt.Errorf("check: read the postgres log: token %q: %w", tok, err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("check: read the postgres log: %w", err)
	}
	return out, nil
}

// redisLog reads the log list, which Redis appended to in commit order.
func redisLog(ctx context.Context, c *redis.Client) ([]loggedWrite, error) {
	entries, err := c.LRange(ctx, redisLogKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("check: read the redis log: %w", err)
	}
	out := make([]loggedWrite, 0, len(entries))
	for _, s := range entries {
		w, err := decodeWrite(s)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// etcdLog reads the log prefix in the order of the keys' revisions, which is
// commit order.
func etcdLog(ctx context.Context, c *clientv3.Client) ([]loggedWrite, error) {
	resp, err := c.Get(ctx, etcdLogPref, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("check: read the etcd log: %w", err)
	}
	kvs := slices.Clone(resp.Kvs)
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.ModRevision, b.ModRevision) })
	out := make([]loggedWrite, 0, len(kvs))
	for _, kv := range kvs {
		w, err := decodeWrite(string(kv.Value))
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// resourceWrites turns the resource's log and the workers' write ops into the
// history's store writes. Committed writes come from the log: per key in commit
// order, each with the highest token committed on the key before it (Max), so
// that the checker's P3 (an accepted write with Token < Max) counts what the
// resource itself committed. A committed write's Time is the end of the worker's
// write op when the worker learned the outcome, else the time it sent it. Writes
// the guard refused come from the workers' ops (nothing of them is in the log);
// their Max is the highest token committed on the key by the time the worker
// heard the refusal. The result is sorted by Time.
func resourceWrites(log []loggedWrite, ops []history.Op) []history.StoreWrite {
	type opKey struct {
		p, l int
		s    int64
	}
	ends := map[opKey]int64{}
	for _, o := range ops {
		if o.Kind == history.Write {
			ends[opKey{o.Process, o.Lease, o.Start}] = o.End
		}
	}
	max := map[string]uint64{}
	out := make([]history.StoreWrite, 0, len(log))
	for _, w := range log {
		t, ok := ends[opKey{w.Process, w.Lease, w.Sent}]
		if !ok {
			t = w.Sent
		}
		out = append(out, history.StoreWrite{Process: w.Process, Key: w.Key, Lease: w.Lease, Token: w.Token, Time: t, Accepted: true, Max: max[w.Key]})
		max[w.Key] = maxU(max[w.Key], w.Token)
	}
	committed := slices.Clone(out)
	slices.SortStableFunc(committed, func(a, b history.StoreWrite) int { return cmp.Compare(a.Time, b.Time) })
	for _, o := range ops {
		if o.Kind != history.Write || !strings.HasPrefix(o.Err, rejectedMsg) {
			continue
		}
		var m uint64
		for _, c := range committed {
			if c.Time > o.End {
				break
			}
			if c.Key == o.Key {
				m = maxU(m, c.Token)
			}
		}
		out = append(out, history.StoreWrite{Process: o.Process, Key: o.Key, Lease: o.Lease, Token: o.Token, Time: o.End, Max: m})
	}
	slices.SortStableFunc(out, func(a, b history.StoreWrite) int { return cmp.Compare(a.Time, b.Time) })
	return out
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// resourceWriter is a worker's connection to the resource it writes to.
type resourceWriter interface {
	// write makes one write of the critical section, with the lease's token.
	// It returns ok=false with the refusal when the guard refused it (a stale
	// token), and an error when the resource could not be reached.
	write(ctx context.Context, w loggedWrite) (ok bool, refusal string, err error)
	Close() error
}

// openWriter connects a worker to its resource. fenced selects the guarded write.
func openWriter(ctx context.Context, cfg WorkerConfig) (resourceWriter, error) {
	switch cfg.Resource {
	case "", ResourceStore:
		return dialStore(cfg.Store)
	case ResourcePostgres:
		pool, err := pgxpool.New(ctx, cfg.ResourceURL)
		if err != nil {
			return nil, fmt.Errorf("check: resource postgres: %w", err)
		}
		g, err := pgfence.New()
		if err != nil {
			pool.Close()
			return nil, err
		}
		return &pgWriter{pool: pool, g: g, fenced: cfg.Fenced}, nil
	case ResourceRedis:
		opt, err := redis.ParseURL(cfg.ResourceURL)
		if err != nil {
			return nil, fmt.Errorf("check: resource redis: %w", err)
		}
		return &redisWriter{c: redis.NewClient(opt), fenced: cfg.Fenced}, nil
	case ResourceEtcd:
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{cfg.ResourceURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("check: resource etcd: %w", err)
		}
		return &etcdWriter{c: c, fenced: cfg.Fenced, id: cfg.ID}, nil
	}
	return nil, fmt.Errorf("unknown resource %q", cfg.Resource)
}

// refused tells a guard's refusal (a stale token) from a failure.
func refused(err error) (bool, string, error) {
	if err == nil {
		return true, "", nil
	}
	if errors.Is(err, fence.ErrStale) {
		return false, err.Error(), nil
	}
	return false, "", err
}

// pgWriter writes one transaction per write: the key's row counts the write
// (and holds the row lock until commit, which orders the log per key), and the
// log gets the write's row. Fenced, pgfence.Guard.Do checks the token first in
// the same transaction.
type pgWriter struct {
	pool   *pgxpool.Pool
	g      *pgfence.Guard
	fenced bool
}

const pgWrite = `WITH d AS (
	INSERT INTO ` + pgDataTable + ` AS d (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = d.n + 1 RETURNING n
) INSERT INTO ` + pgLogTable + ` (key, n, worker, lease, token, sent) SELECT $1, d.n, $2, $3, $4::numeric, $5 FROM d`

func (p *pgWriter) write(ctx context.Context, w loggedWrite) (bool, string, error) {
	fn := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, pgWrite, w.Key, w.Process, w.Lease, strconv.FormatUint(w.Token, 10), w.Sent)
		return err
	}
	if p.fenced {
		return refused(p.g.Do(ctx, p.pool, pgFenceName+w.Key, w.Token, fn))
	}
	return refused(pgx.BeginFunc(ctx, p.pool, fn))
}

func (p *pgWriter) Close() error { p.pool.Close(); return nil }

// redisWriter appends the write to the log list: inside redisfence.Exec's
// script when fenced, as a plain RPUSH when not.
type redisWriter struct {
	c      *redis.Client
	fenced bool
}

func (r *redisWriter) write(ctx context.Context, w loggedWrite) (bool, string, error) {
	if r.fenced {
		_, err := redisfence.Exec(ctx, r.c, redisFence+w.Key, w.Token, redisfence.Command("RPUSH", redisfence.Key(redisLogKey), w.encode()))
		return refused(err)
	}
	return refused(r.c.RPush(ctx, redisLogKey, w.encode()).Err())
}

func (r *redisWriter) Close() error { return r.c.Close() }

// etcdWriter puts the write under the log prefix, one key per write: in an
// etcdfence.Txn when fenced, as a plain Put when not.
type etcdWriter struct {
	c      *clientv3.Client
	fenced bool
	id     int
	n      int
}

func (e *etcdWriter) write(ctx context.Context, w loggedWrite) (bool, string, error) {
	e.n++
	key := fmt.Sprintf("%s%d/%d", etcdLogPref, e.id, e.n)
	if e.fenced {
		_, err := etcdfence.New(e.c, etcdFence+w.Key, w.Token).Then(clientv3.OpPut(key, w.encode())).Commit(ctx)
		return refused(err)
	}
	_, err := e.c.Put(ctx, key, w.encode())
	return refused(err)
}

func (e *etcdWriter) Close() error { return e.c.Close() }
