package redlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/callers"
)

// Scheme is the URL scheme of the backend: redlock://h1,h2,h3.
const Scheme = "redlock"

const defaultPort = "6379"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		return Open(ctx, u)
	})
}

// New returns a backend over existing go-redis clients, one per independent master,
// which the caller keeps owning: Close does not close them. Give the clients
// ContextTimeoutEnabled (so the node timeout bounds every call) and MaxRetries -1
// (one attempt per node per round; the algorithm retries as a whole). New makes no
// network call today; it takes ctx so that every backend's New has one shape.
func New(ctx context.Context, clients []*redis.Client, opts ...Option) (*Backend, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newBackend(clients, cfg)
}

func newBackend(clients []*redis.Client, cfg config) (*Backend, error) {
	if err := checkCount(len(clients), cfg.allowFew); err != nil {
		return nil, err
	}
	seen := make(map[string]bool)
	b := &Backend{quorum: len(clients)/2 + 1, cfg: cfg, closing: make(chan struct{}), callers: callers.New(),
		fence: make(map[string]uint64), flights: make(map[driver.Holder]*flight), grants: make(map[driver.Holder]grant), yield: make(map[string]yielding),
		waiters: make(map[driver.Holder]*waiter), holders: make(map[string]*holderSub),
		settles: make(map[uint64]*settling), releases: make(map[driver.Holder]*releaseRecord)}
	for _, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: nil redis client", driver.ErrInvalid)
		}
		addr := c.Options().Addr
		if seen[addr] {
			return nil, fmt.Errorf("%w: redlock node %s listed twice; the nodes must be distinct, independent masters", driver.ErrInvalid, addr)
		}
		seen[addr] = true
		b.nodes = append(b.nodes, &node{idx: len(b.nodes), addr: addr, rdb: c})
	}
	b.id = driver.RandomHex(8)
	b.wakeCh = wakeChannel(cfg.prefix, b.id)
	return b, nil
}

func checkCount(n int, allowFew bool) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: redlock needs at least one node", driver.ErrInvalid)
	case n < 3 && !allowFew:
		return fmt.Errorf("%w: redlock with %d node(s) has no fault tolerance; use 3 or more independent masters (5 tolerates 2 failures), or allow_few_nodes=true for development", driver.ErrInvalid, n)
	}
	return nil
}

// Open returns a backend for a redlock:// URL; see the package documentation for its
// parameters. The URL's parameters are applied first, then opts, which win. Open
// checks the nodes before returning: a majority must answer, every node that
// answers must accept the credentials and be a master, and no server may be listed
// twice. Close closes the clients Open made.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme {
		return nil, fmt.Errorf("%w: redlock URL must use the redlock:// scheme", driver.ErrInvalid)
	}
	dest, urlOpts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cfg, err := newConfig(append(urlOpts, opts...))
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(dest.addrs), cfg.allowFew); err != nil {
		return nil, err
	}
	clients := dest.clients(cfg)
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	b, err := newBackend(clients, cfg)
	if err != nil {
		closeAll()
		return nil, err
	}
	b.own = true
	if err := b.check(ctx); err != nil {
		closeAll()
		return nil, fmt.Errorf("redlock: open %s: %w", driver.Redact(u), err)
	}
	return b, nil
}

// nodesURL is what a URL says about reaching the nodes.
type nodesURL struct {
	addrs          []string
	db             int
	user, password string
	tls            *tls.Config // nil: plain connections
}

// parseURL reads a redlock:// URL: where the nodes are, and the options its
// parameters set.
func parseURL(u *url.URL) (nodesURL, []Option, error) {
	var dest nodesURL
	p, err := driver.ParseParams(u)
	if err != nil {
		return dest, nil, fmt.Errorf("redlock: %w", err)
	}
	opts, err := paramOptions(p)
	if err != nil {
		return dest, nil, err
	}
	if dest.tls, err = driver.ReadTLS(p); err != nil {
		return dest, nil, fmt.Errorf("redlock: %w", err)
	}
	if err := p.Unknown(); err != nil {
		return dest, nil, err
	}
	if path := strings.Trim(u.Path, "/"); path != "" {
		if dest.db, err = strconv.Atoi(path); err != nil || dest.db < 0 {
			return dest, nil, fmt.Errorf("%w: redlock URL path must be a database number, got %q", driver.ErrInvalid, u.Path)
		}
	}
	if dest.addrs, err = parseHosts(u.Host); err != nil {
		return dest, nil, err
	}
	if u.User != nil {
		dest.user = u.User.Username()
		dest.password, _ = u.User.Password()
	}
	return dest, opts, nil
}

// paramOptions turns the URL parameters prefix, node_timeout, dial_timeout,
// allow_few_nodes and allow_eviction into options.
func paramOptions(p *driver.Params) ([]Option, error) {
	prefix, err := p.String("prefix", DefaultPrefix)
	if err != nil {
		return nil, err
	}
	nodeTimeout, err := p.Duration("node_timeout", DefaultNodeTimeout)
	if err != nil {
		return nil, err
	}
	dialTimeout, err := p.Duration("dial_timeout", DefaultDialTimeout)
	if err != nil {
		return nil, err
	}
	allowFew, err := p.Bool("allow_few_nodes", false)
	if err != nil {
		return nil, err
	}
	allowEviction, err := p.Bool("allow_eviction", false)
	if err != nil {
		return nil, err
	}
	opts := []Option{WithPrefix(prefix), WithNodeTimeout(nodeTimeout), WithDialTimeout(dialTimeout)}
	if allowFew {
		opts = append(opts, WithAllowFewNodes())
	}
	if allowEviction {
		opts = append(opts, WithAllowEviction())
	}
	return opts, nil
}

// clients makes one go-redis client per node (no network call yet).
func (d nodesURL) clients(cfg config) []*redis.Client {
	clients := make([]*redis.Client, len(d.addrs))
	for i, addr := range d.addrs {
		opt := &redis.Options{
			Addr:                  addr,
			DB:                    d.db,
			Username:              d.user,
			Password:              d.password,
			DialTimeout:           cfg.dialTimeout,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1, // one call per node per round: the algorithm retries as a whole
			DialerRetries:         1,  // one dial per call, so a dead node fails fast with its own error
			DisableIdentity:       true,
		}
		if d.tls != nil {
			opt.TLSConfig = d.tls.Clone()
			if opt.TLSConfig.ServerName == "" {
				opt.TLSConfig.ServerName, _, _ = net.SplitHostPort(addr)
			}
		}
		clients[i] = redis.NewClient(opt)
	}
	return clients
}

// parseHosts splits "h1:6379,h2,h3:7000" into host:port addresses, refusing empty
// entries, bad ports and duplicates.
func parseHosts(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, fmt.Errorf("%w: redlock URL lists no nodes; write redlock://h1:6379,h2:6379,h3:6379", driver.ErrInvalid)
	}
	var addrs []string
	seen := make(map[string]bool)
	for h := range strings.SplitSeq(hosts, ",") {
		host, port := h, defaultPort
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			host, port = h[:i], h[i+1:]
		}
		if host == "" {
			return nil, fmt.Errorf("%w: empty node in redlock host list %q", driver.ErrInvalid, hosts)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: redlock node %q has a bad port", driver.ErrInvalid, h)
		}
		addr := net.JoinHostPort(strings.ToLower(host), port)
		if seen[addr] {
			return nil, fmt.Errorf("%w: redlock node %s listed twice; the nodes must be distinct, independent masters", driver.ErrInvalid, addr)
		}
		seen[addr] = true
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// serverInfo is what check reads from a node's INFO.
type serverInfo struct {
	runID, role string
	maxMemory   int64
	policy      string // maxmemory_policy
}

// evicts reports whether the node may evict keys before they expire (see
// redislock.ErrEvicts): a memory limit with a policy other than noeviction.
func (s serverInfo) evicts() bool {
	return s.maxMemory > 0 && s.policy != "" && s.policy != "noeviction"
}

// check is Open's look at the nodes: see Open.
func (b *Backend) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.dialTimeout)
	defer cancel()
	infos := make([]serverInfo, len(b.nodes))
	errs := make([]error, len(b.nodes))
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		wg.Go(func() { infos[i], errs[i] = readServerInfo(ctx, n.rdb) })
	}
	wg.Wait()
	var fatal, down []error
	byRun := make(map[string]string)
	for i, n := range b.nodes {
		if err := errs[i]; err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) && !strings.HasPrefix(err.Error(), "LOADING") {
				// The server answered with an error: credentials, ACL or
				// configuration. Waiting will not fix it.
				if authError(err) {
					err = fmt.Errorf("%w: %w", driver.ErrAuth, err)
				}
				fatal = append(fatal, &NodeError{n.addr, err})
			} else {
				down = append(down, &NodeError{n.addr, err})
			}
			continue
		}
		if infos[i].evicts() && !b.cfg.allowEviction {
			fatal = append(fatal, &NodeError{n.addr, fmt.Errorf("%w: the server may evict keys (maxmemory %d, maxmemory-policy %s) and drop held locks; set maxmemory-policy noeviction, or accept the risk with allow_eviction=true", driver.ErrInvalid, infos[i].maxMemory, infos[i].policy)})
		}
		if infos[i].role != "" && infos[i].role != "master" {
			fatal = append(fatal, &NodeError{n.addr, fmt.Errorf("%w: the server is a %s; redlock needs independent masters", driver.ErrInvalid, infos[i].role)})
		}
		if id := infos[i].runID; id != "" {
			if other, dup := byRun[id]; dup {
				fatal = append(fatal, &NodeError{n.addr, fmt.Errorf("%w: the same server as node %s (run_id %s); the nodes must be distinct", driver.ErrInvalid, other, id)})
			}
			byRun[id] = n.addr
		}
	}
	if len(fatal) > 0 {
		return driver.Join(append(fatal, down...)...)
	}
	if up := len(b.nodes) - len(down); up < b.quorum {
		return fmt.Errorf("only %d of %d nodes answered, a majority is %d: %w", up, len(b.nodes), b.quorum, driver.Join(down...))
	}
	return nil
}

// readServerInfo reads a node's run id, replication role and eviction settings.
func readServerInfo(ctx context.Context, rdb *redis.Client) (serverInfo, error) {
	var info serverInfo
	s, err := rdb.Info(ctx, "server", "replication", "memory").Result()
	if err != nil {
		return info, err
	}
	for line := range strings.SplitSeq(s, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "run_id":
			info.runID = v
		case "role":
			info.role = v
		case "maxmemory":
			info.maxMemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			info.policy = v
		}
	}
	return info, nil
}

// authError reports whether err is a node refusing the credentials or the ACL
// permission for a command.
func authError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR Client sent AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// Ping checks every node and returns the failures joined (*NodeError values), or nil
// when all answer. The backend works while a majority answers.
func (b *Backend) Ping(ctx context.Context) error {
	errs := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, n.rdb.Ping(ctx).Err()
	}).errs
	return b.nodeErrors(errs)
}

// Nodes returns the node addresses in order.
func (b *Backend) Nodes() []string {
	s := make([]string, len(b.nodes))
	for i, n := range b.nodes {
		s[i] = n.addr
	}
	return s
}

// Clients returns the go-redis clients, one per node, in order.
func (b *Backend) Clients() []*redis.Client {
	s := make([]*redis.Client, len(b.nodes))
	for i, n := range b.nodes {
		s[i] = n.rdb
	}
	return s
}

// Quorum returns the number of nodes that make a majority.
func (b *Backend) Quorum() int { return b.quorum }
