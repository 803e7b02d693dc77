package etcdlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// opsMetric is the Prometheus counter ServerOps sums: the gRPC messages each member
// received from clients, one per unary request (Range, Txn, Put, DeleteRange,
// LeaseGrant, ...) and one per message on a stream (a watch created or cancelled, a
// lease keep-alive). Reads of the metrics page are HTTP, not gRPC, and are not
// counted; Raft traffic between members is not counted either.
const opsMetric = "grpc_server_msg_received_total"

// WithMetrics names the Prometheus metrics pages of the etcd members the client
// talks to (such as http://10.0.0.1:2379/metrics), read by ServerOps. Without it,
// ServerOps reads <endpoint>/metrics of every endpoint when they are all plain http
// on a loopback address (as with a local development or test server), and is
// unsupported otherwise. Only benchmarks call ServerOps; locking never depends on it.
func WithMetrics(urls ...string) Option {
	return func(o *options) error {
		if len(urls) == 0 {
			return fmt.Errorf("%w: WithMetrics needs at least one URL", driver.ErrInvalid)
		}
		var ms []string
		for _, s := range urls {
			u, err := url.Parse(s)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("%w: etcd metrics URL must be http:// or https://host[:port]/path, got %q", driver.ErrInvalid, redactURL(s))
			}
			ms = append(ms, u.String())
		}
		o.metrics = ms
		return nil
	}
}

// redactURL hides the password of a URL that may not parse.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return driver.Redact(u)
	}
	return "(unparsable URL)"
}

// loopbackMetrics returns <endpoint>/metrics for every endpoint when they are all
// http://host:port on a loopback address, else nil.
func loopbackMetrics(endpoints []string) []string {
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

func newMetricsClient(tlsConf *tls.Config) *http.Client {
	// No proxy from the environment: the members are named directly.
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf, MaxIdleConnsPerHost: 1}}
}

// ServerOps implements driver.OpsCounter: the gRPC messages received by the etcd
// members of the metrics pages (see WithMetrics), summed over them: one per request,
// and one per keep-alive or watch request on a stream. The reads themselves are not
// counted. It returns an error wrapping driver.ErrUnsupported when no metrics page is
// known, and any error reading one; nothing else in the backend depends on it.
func (b *Backend) ServerOps(ctx context.Context) (int64, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	if len(b.metrics) == 0 {
		return 0, fmt.Errorf("etcdlock: server ops: %w: no metrics page known (the endpoints are not plain http on loopback; use WithMetrics or metrics=URL)", driver.ErrUnsupported)
	}
	var total float64
	for _, m := range b.metrics {
		n, err := b.readMetric(ctx, m)
		if err != nil {
			return 0, fmt.Errorf("etcdlock: server ops from %s: %w", redactURL(m), err)
		}
		total += n
	}
	return int64(total), nil
}

func (b *Backend) readMetric(ctx context.Context, m string) (float64, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := b.metricsHTTP.Do(req)
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
	return sumCounter(io.LimitReader(resp.Body, 64<<20), opsMetric)
}

// sumCounter sums the samples of the counter name, with any labels, in a Prometheus
// text exposition.
func sumCounter(r io.Reader, name string) (float64, error) {
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
