// Package etcdops registers the storeops store of the etcd scheme: a clientv3
// client, the floor (a lease-bound create-if-absent transaction and a delete) and
// the gRPC messages the members received, from their /metrics pages.
package etcdops

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

func init() { storeops.Register("etcd", openEtcd) }

// etcdOpsMetric is the Prometheus counter etcd's Ops sums: the gRPC messages each
// member received from clients, one per unary request (Range, Txn, Put,
// DeleteRange, LeaseGrant, ...) and one per message on a stream (a watch created or
// cancelled, a lease keep-alive). Reads of the metrics page are HTTP, not gRPC, and
// are not counted; Raft traffic between members is not counted either.
const etcdOpsMetric = "grpc_server_msg_received_total"

// etcdTimeout bounds each request, as etcdlock's default request timeout does.
const etcdTimeout = 5 * time.Second

// etcdStore is a plain etcd client, and the members' metrics pages.
type etcdStore struct {
	cli     *clientv3.Client
	prefix  string   // the URL's path, default "dlock": the floor's keys live under it
	metrics []string // the members' Prometheus metrics pages
	http    *http.Client

	mu      sync.Mutex
	leaseID clientv3.LeaseID // the floor's lease, 0 until the first FloorCycle
}

// openEtcd connects to the endpoints of an etcd:// URL, with its user info and TLS
// parameters. The parameter metrics, read only here, names the members' metrics
// pages (comma-separated http:// or https:// URLs); without it they are
// <endpoint>/metrics of every endpoint when all are plain http on a loopback
// address (etcd serves /metrics on the client port, as the test servers do), and
// Ops is unsupported otherwise. Other parameters are ignored.
func openEtcd(ctx context.Context, u *url.URL) (storeops.Store, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("storeops: etcd: %w", err)
	}
	tlsConf, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("storeops: etcd: %w", err)
	}
	endpoints, err := etcdEndpoints(u.Host, tlsConf != nil)
	if err != nil {
		return nil, err
	}
	s := &etcdStore{prefix: strings.Trim(u.Path, "/")}
	if s.prefix == "" {
		s.prefix = "dlock"
	}
	if s.metrics, err = etcdMetrics(p, endpoints); err != nil {
		return nil, err
	}
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: etcdTimeout, TLS: tlsConf, Logger: zap.NewNop()}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("storeops: etcd: connect to %s: %w", driver.Redact(u), err)
	}
	s.cli = cli
	// A read, so that an unreachable cluster fails here, within ctx.
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	if _, err := cli.Get(rctx, s.prefix+"/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("storeops: etcd: connect to %s: %w", driver.Redact(u), err)
	}
	// No proxy from the environment: the members are named directly.
	s.http = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf, MaxIdleConnsPerHost: 1}}
	return s, nil
}

// etcdEndpoints turns a URL's host list into clientv3 endpoints (port 2379 when
// omitted).
func etcdEndpoints(host string, secure bool) ([]string, error) {
	if host == "" {
		return nil, fmt.Errorf("%w: storeops: etcd URL names no endpoint", driver.ErrInvalid)
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	var eps []string
	for ep := range strings.SplitSeq(host, ",") {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			ep = net.JoinHostPort(strings.Trim(ep, "[]"), "2379")
		}
		eps = append(eps, scheme+ep)
	}
	return eps, nil
}

// etcdMetrics returns the metrics pages: the metrics parameter's, or those of
// loopback plain-http endpoints, or none.
func etcdMetrics(p *driver.Params, endpoints []string) ([]string, error) {
	given, err := p.String("metrics", "")
	if err != nil {
		return nil, err
	}
	if given == "" {
		return etcdLoopbackMetrics(endpoints), nil
	}
	var ms []string
	for s := range strings.SplitSeq(given, ",") {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: storeops: etcd metrics URL must be http:// or https://host[:port]/path, got %q", driver.ErrInvalid, etcdRedactURL(s))
		}
		ms = append(ms, u.String())
	}
	return ms, nil
}

// etcdLoopbackMetrics returns <endpoint>/metrics for every endpoint when they are all
// http://host:port on a loopback address, else nil.
func etcdLoopbackMetrics(endpoints []string) []string {
	var ms []string
	for _, ep := range endpoints {
		rest, ok := strings.CutPrefix(ep, "http://")
		if !ok {
			return nil
		}
		h, _, err := net.SplitHostPort(rest)
		if err != nil {
			return nil
		}
		if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil
		}
		ms = append(ms, "http://"+rest+"/metrics")
	}
	return ms
}

// etcdRedactURL hides the password of a URL that may not parse.
func etcdRedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return driver.Redact(u)
	}
	return "(unparsable URL)"
}

// FloorCycle is the least a correct etcd lock does: one create-if-absent
// transaction bound to a lease granted beforehand (kept alive while the store is
// open, as a lock client's session lease is), then a delete.
func (s *etcdStore) FloorCycle(ctx context.Context, key string) error {
	id, err := s.lease(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	k := s.prefix + "/\x00floor/" + key // in the prefix range, in no lock's
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, "floor", clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("floor key %q held", k)
	}
	_, err = s.cli.Delete(ctx, k)
	return err
}

// etcdFloorTTL is the floor's lease TTL.
const etcdFloorTTL = 15 // seconds

// lease returns the floor's lease, granted on first use and kept alive until Close.
func (s *etcdStore) lease(ctx context.Context) (clientv3.LeaseID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaseID != 0 {
		return s.leaseID, nil
	}
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	g, err := s.cli.Grant(ctx, etcdFloorTTL)
	if err != nil {
		return 0, err
	}
	ka, err := s.cli.KeepAlive(s.cli.Ctx(), g.ID)
	if err != nil {
		return 0, err
	}
	go func() {
		for range ka { // drain the keep-alive replies until Close
		}
	}()
	s.leaseID = g.ID
	return g.ID, nil
}

// Ops sums the gRPC messages received by the etcd members of the metrics pages:
// one per request, and one per keep-alive or watch request on a stream. The reads
// themselves are not counted. It returns an error wrapping errors.ErrUnsupported
// when no metrics page is known.
func (s *etcdStore) Ops(ctx context.Context) (int64, error) {
	if len(s.metrics) == 0 {
		return 0, fmt.Errorf("storeops: etcd ops: %w: no metrics page known (the endpoints are not plain http on loopback; pass metrics=URL,...)", errors.ErrUnsupported)
	}
	var total float64
	for _, m := range s.metrics {
		n, err := s.readMetric(ctx, m)
		if err != nil {
			return 0, fmt.Errorf("storeops: etcd ops from %s: %w", etcdRedactURL(m), err)
		}
		total += n
	}
	return int64(total), nil
}

// OpsSource says what Ops counts.
func (s *etcdStore) OpsSource() string { return "etcd " + etcdOpsMetric }

func (s *etcdStore) readMetric(ctx context.Context, m string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := s.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, which may hold a password
		}
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("HTTP status %s", resp.Status)
	}
	return etcdSumCounter(io.LimitReader(resp.Body, 64<<20), etcdOpsMetric)
}

// etcdSumCounter sums the samples of the counter name, with any labels, in a Prometheus
// text exposition.
func etcdSumCounter(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), name)
		if !ok || line == "" || (line[0] != '{' && line[0] != ' ') {
			continue
		}
		if line[0] == '{' {
			end := strings.LastIndexByte(line, '}')
			if end < 0 {
				return 0, fmt.Errorf("bad sample line for %s", name)
			}
			line = line[end+1:]
		}
		fields := strings.Fields(line) // value [timestamp]
		if len(fields) == 0 {
			return 0, fmt.Errorf("sample of %s without a value", name)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("sample of %s: %w", name, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s in the metrics (not an etcd metrics page?)", name)
	}
	return sum, nil
}

// Close revokes the floor's lease (so its keys go at once) and closes the client.
func (s *etcdStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaseID != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
		_, _ = s.cli.Revoke(ctx, s.leaseID)
		cancel()
	}
	s.http.CloseIdleConnections()
	return s.cli.Close()
}
