// Package devserver runs etcd inside the current process (go.etcd.io/etcd/server/v3/embed),
// listening on 127.0.0.1 only. It backs `dlock dev` and `dlock demo`, which need no
// server installed, and each etcd member that the test-server launcher starts as a
// process of its own for the tests, bench and check (RunMember, run by
// cmd/dlock/internal/etcdmember or by dlock itself), so that members can be stopped,
// killed and restarted one by one.
//
// It is a development and test tool: members listen without TLS or authentication,
// and only on the loopback interface.
package devserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config describes one member.
type Config struct {
	// Dir holds the member's data (required). Restarting a member with the same
	// Dir recovers its data.
	Dir string
	// Name is the member name (default "dlock-dev").
	Name string
	// ClientPort and PeerPort are the loopback ports to listen on; 0 picks a free
	// port.
	ClientPort, PeerPort int
	// InitialCluster lists every member of a new cluster as name=peerURL pairs
	// separated by commas; empty means a single-member cluster. Ignored when Dir
	// already holds data.
	InitialCluster string
	// ClusterToken tells clusters apart (default "dlock-dev").
	ClusterToken string
	// TickMs and ElectionMs are the Raft heartbeat and election timeout; 0 keeps
	// etcd's defaults (100ms, 1000ms). The smallest lease TTL etcd grants is
	// 1.5 election timeouts rounded up to whole seconds (2s by default).
	TickMs, ElectionMs uint
	// LogLevel of the member's log, written to Dir/etcd.log (default "warn").
	LogLevel string
	// CertFile and KeyFile, when set, make the client port serve TLS (https) with
	// that certificate; with ClientCAFile set too, clients must present a
	// certificate signed by that CA.
	CertFile, KeyFile, ClientCAFile string
}

// Member is one embedded etcd member. Its methods are safe for concurrent use.
type Member struct {
	cfg Config

	mu      sync.Mutex
	e       *embed.Etcd
	logFile *os.File
}

// NewMember returns a member that is not started yet. Free ports are picked now, so
// ClientURL and PeerURL are known before Start.
func NewMember(cfg Config) (*Member, error) {
	if cfg.Dir == "" {
		return nil, errors.New("devserver: no data directory")
	}
	if cfg.Name == "" {
		cfg.Name = "dlock-dev"
	}
	if cfg.ClusterToken == "" {
		cfg.ClusterToken = "dlock-dev"
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	var err error
	if cfg.ClientPort == 0 {
		if cfg.ClientPort, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if cfg.PeerPort == 0 {
		if cfg.PeerPort, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.Name + "=" + peerURL(cfg.PeerPort)
	}
	return &Member{cfg: cfg}, nil
}

// Start runs a new single-member etcd and waits until it serves clients.
func Start(ctx context.Context, cfg Config) (*Member, error) {
	m, err := NewMember(cfg)
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devserver: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func peerURL(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }

// Name returns the member name.
func (m *Member) Name() string { return m.cfg.Name }

// Dir returns the data directory.
func (m *Member) Dir() string { return m.cfg.Dir }

// Endpoint returns host:port of the client listener.
func (m *Member) Endpoint() string { return "127.0.0.1:" + strconv.Itoa(m.cfg.ClientPort) }

// ClientURL returns the client URL (http://127.0.0.1:port, or https:// with TLS).
func (m *Member) ClientURL() string {
	scheme := "http://"
	if m.cfg.CertFile != "" {
		scheme = "https://"
	}
	return scheme + m.Endpoint()
}

// PeerURL returns the peer URL, for Config.InitialCluster.
func (m *Member) PeerURL() string { return peerURL(m.cfg.PeerPort) }

// Start starts the member (again, after Stop or Kill) and waits until it is ready
// to serve clients, which for a cluster member needs a quorum, or until ctx ends.
func (m *Member) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e != nil {
		return fmt.Errorf("devserver: member %s is running", m.cfg.Name)
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("devserver: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(m.cfg.Dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("devserver: %w", err)
	}
	level, err := zapcore.ParseLevel(m.cfg.LogLevel)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("devserver: log level: %w", err)
	}
	lg := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(logFile), level))

	ec := embed.NewConfig()
	ec.Name = m.cfg.Name
	ec.Dir = filepath.Join(m.cfg.Dir, "data")
	cu, _ := url.Parse(m.ClientURL())
	pu, _ := url.Parse(m.PeerURL())
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = m.cfg.InitialCluster
	ec.InitialClusterToken = m.cfg.ClusterToken
	ec.ClusterState = embed.ClusterStateFlagNew
	if m.cfg.TickMs > 0 {
		ec.TickMs = m.cfg.TickMs
	}
	if m.cfg.ElectionMs > 0 {
		ec.ElectionMs = m.cfg.ElectionMs
	}
	ec.Metrics = "basic"
	ec.EnableGRPCGateway = false
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	if m.cfg.CertFile != "" {
		ec.ClientTLSInfo = transport.TLSInfo{
			CertFile: m.cfg.CertFile, KeyFile: m.cfg.KeyFile,
			TrustedCAFile: m.cfg.ClientCAFile, ClientCertAuth: m.cfg.ClientCAFile != "",
		}
	}
	ec.LogLevel = m.cfg.LogLevel

	e, err := embed.StartEtcd(ec)
	if err != nil {
		_ = lg.Sync()
		logFile.Close()
		return fmt.Errorf("devserver: start etcd member %s on %s: %w", m.cfg.Name, m.Endpoint(), err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		logFile.Close()
		return fmt.Errorf("devserver: etcd member %s failed during start-up: %v", m.cfg.Name, err)
	case <-ctx.Done():
		e.Close()
		logFile.Close()
		return fmt.Errorf("devserver: etcd member %s not ready: %w", m.cfg.Name, ctx.Err())
	}
	m.e, m.logFile = e, logFile
	return nil
}

// Running reports whether the member runs.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e != nil
}

// Err returns a channel that receives the member's fatal errors while it runs, or nil
// when it does not run.
func (m *Member) Err() <-chan error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e == nil {
		return nil
	}
	return m.e.Err()
}

// Stop shuts the member down cleanly: a leader first hands leadership to another
// member. Open client streams are given a few seconds to finish.
func (m *Member) Stop() { m.stop(false) }

// Kill stops the member abruptly, like a crash: Raft stops at once without handing
// over leadership, so the other members must notice the silence and elect a new
// leader. The data directory is kept (written with fsync, as etcd always does).
func (m *Member) Kill() { m.stop(true) }

func (m *Member) stop(abrupt bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e == nil {
		return
	}
	if abrupt {
		// Close the client listeners first so that clients move to another member
		// at once, then stop Raft before the graceful part of Close could hand
		// leadership over.
		for _, l := range m.e.Clients {
			_ = l.Close()
		}
		m.e.Server.HardStop()
	}
	m.e.Close()
	_ = m.e.GetLogger().Sync()
	m.logFile.Close()
	m.e, m.logFile = nil, nil
}
