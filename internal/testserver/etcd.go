package testserver

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EtcdMemberEnv names the etcd member executable: a program that serves one member
// when its environment has DLOCK_ETCD_MEMBER_RUN=1 and its flags say how (the dlock
// command, or cmd/dlock/internal/etcdmember). When it is not set, the launcher
// builds cmd/dlock/internal/etcdmember from the source tree the test runs in, once
// per test process. etcd runs as a process of its own, as the other servers do, so
// the library's tests need no embedded etcd server and tests can kill members.
const EtcdMemberEnv = "DLOCK_ETCD_MEMBER"

// memberRunEnv must match devserver.MemberEnv (the tools module).
const memberRunEnv = "DLOCK_ETCD_MEMBER_RUN"

// memberReady must match devserver.ReadyFile.
const memberReady = "ready"

const memberPackage = "github.com/dlockio/dlock/cmd/dlock/internal/etcdmember"

var built struct {
	once sync.Once
	path string
	err  error
}

// etcdMemberExe returns the member executable, building it the first time.
func etcdMemberExe(t TB) string {
	t.Helper()
	if p := os.Getenv(EtcdMemberEnv); p != "" {
		return p
	}
	built.once.Do(func() {
		dir := filepath.Join(os.TempDir(), "dlock-etcd-member-"+strconv.Itoa(os.Getuid()))
		if built.err = os.MkdirAll(dir, 0o700); built.err != nil {
			return
		}
		tmp := filepath.Join(dir, "etcd-member."+strconv.Itoa(os.Getpid()))
		out, err := exec.Command("go", "build", "-o", tmp, memberPackage).CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build %s: %v: %s", memberPackage, err, strings.TrimSpace(string(out)))
			return
		}
		built.path = filepath.Join(dir, "etcd-member")
		built.err = os.Rename(tmp, built.path) // atomic: other test processes may run the old one
	})
	if built.err != nil {
		t.Fatalf("etcd member executable (set %s to one, or run from the source tree with Go installed): %v", EtcdMemberEnv, built.err)
	}
	return built.path
}

// EtcdMember is one etcd member running as a process of its own on free loopback
// ports, with its data in a temporary directory.
type EtcdMember struct {
	*Process
	name                 string
	clientPort, peerPort int
	tls                  bool
}

// memberConfig is what a new member needs besides its ports.
type memberConfig struct {
	name, token                 string
	tickMs, electionMs          uint
	certFile, keyFile, clientCA string
}

func newEtcdMember(t TB, dir string, c memberConfig) *EtcdMember {
	t.Helper()
	m := &EtcdMember{name: c.name, clientPort: FreePort(t), peerPort: FreePort(t), tls: c.certFile != ""}
	args := []string{"-dir", dir, "-name", c.name, "-client-port", strconv.Itoa(m.clientPort),
		"-peer-port", strconv.Itoa(m.peerPort), "-cluster-token", c.token,
		"-tick-ms", strconv.FormatUint(uint64(c.tickMs), 10), "-election-ms", strconv.FormatUint(uint64(c.electionMs), 10),
		"-cert", c.certFile, "-key", c.keyFile, "-client-ca", c.clientCA}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("etcd member: %v", err)
	}
	m.Process = &Process{Name: "etcd-" + c.name, Dir: dir, t: t, path: etcdMemberExe(t), args: args,
		env: []string{memberRunEnv + "=1"},
		ready: func() error {
			_, err := os.Stat(filepath.Join(dir, memberReady))
			return err
		}}
	return m
}

// Name returns the member's name.
func (m *EtcdMember) Name() string { return m.name }

// Endpoint returns the member's client address, host:port.
func (m *EtcdMember) Endpoint() string { return "127.0.0.1:" + strconv.Itoa(m.clientPort) }

// ClientURL returns the member's client URL (https when it serves TLS).
func (m *EtcdMember) ClientURL() string {
	if m.tls {
		return "https://" + m.Endpoint()
	}
	return "http://" + m.Endpoint()
}

// PeerURL returns the member's peer URL.
func (m *EtcdMember) PeerURL() string { return "http://127.0.0.1:" + strconv.Itoa(m.peerPort) }

// Restart starts the member again (after Stop or Kill) and waits until it serves
// clients, which for a cluster member needs a quorum.
func (m *EtcdMember) Restart() error {
	if err := os.Remove(filepath.Join(m.Dir, memberReady)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return m.Process.Restart()
}

// Running reports whether the member's process runs.
func (m *EtcdMember) Running() bool { return m.Pid() != 0 }

// IsLeader reports whether the member runs and is the Raft leader, from the
// etcd_server_is_leader gauge its client port serves on /metrics (plain HTTP members
// only; a TLS member reports false).
func (m *EtcdMember) IsLeader() bool {
	if !m.Running() || m.tls {
		return false
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(m.ClientURL() + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_server_is_leader "); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}

// Etcd is a single-member etcd.
type Etcd struct {
	*EtcdMember
}

// URL returns an etcd:// URL for the member with the given key prefix.
func (e *Etcd) URL(prefix string) string { return "etcd://" + e.Endpoint() + "/" + prefix }

// StartEtcd starts a single-member etcd.
func StartEtcd(t TB) *Etcd {
	t.Helper()
	return StartEtcdTLS(t, "", "", "")
}

// StartEtcdTLS starts a single-member etcd whose client port serves TLS with the
// given certificate and key (PEM files), and, when clientCA is not empty, requires
// client certificates signed by that CA. Empty certFile means no TLS.
func StartEtcdTLS(t TB, certFile, keyFile, clientCA string) *Etcd {
	t.Helper()
	dir := t.TempDir()
	var last error
	for attempt := range 3 { // a free port may be taken before etcd binds it
		m := newEtcdMember(t, filepath.Join(dir, strconv.Itoa(attempt)), memberConfig{
			name: "etcd-test", token: "dlock-test", certFile: certFile, keyFile: keyFile, clientCA: clientCA})
		if last = m.Restart(); last == nil {
			t.Cleanup(m.Kill)
			return &Etcd{EtcdMember: m}
		}
	}
	t.Fatalf("start etcd: %v", last)
	return nil
}

// EtcdCluster is a cluster of etcd members, each a process, that can be stopped,
// killed and restarted one at a time.
type EtcdCluster struct {
	Members []*EtcdMember
}

// URL returns an etcd:// URL listing every member, with the given key prefix.
func (c *EtcdCluster) URL(prefix string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + "/" + prefix
}

// Endpoints returns host:port of every member.
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint())
	}
	return eps
}

// Leader returns the running member that is the leader, waiting up to timeout for
// one to be elected, or nil.
func (c *EtcdCluster) Leader(timeout time.Duration) *EtcdMember {
	deadline := time.Now().Add(timeout)
	for {
		for _, m := range c.Members {
			if m.IsLeader() {
				return m
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop stops every member.
func (c *EtcdCluster) Stop() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Go(m.Stop)
	}
	wg.Wait()
}

// start starts every member concurrently (a new cluster needs a quorum before any
// member is ready) and waits until all are ready.
func (c *EtcdCluster) start() error {
	errs := make([]error, len(c.Members))
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.Restart() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// StartEtcdCluster starts an n-member cluster with the given Raft heartbeat and
// election timeout (0 for etcd's defaults).
func StartEtcdCluster(t TB, n int, tickMs, electionMs uint) *EtcdCluster {
	t.Helper()
	dir := t.TempDir()
	var last error
	for attempt := range 3 {
		c := &EtcdCluster{}
		var initial []string
		token := "dlock-test-" + strconv.Itoa(attempt)
		for i := range n {
			name := "m" + strconv.Itoa(i)
			m := newEtcdMember(t, filepath.Join(dir, strconv.Itoa(attempt), name), memberConfig{
				name: name, token: token, tickMs: tickMs, electionMs: electionMs})
			c.Members = append(c.Members, m)
			initial = append(initial, name+"="+m.PeerURL())
		}
		// The peer ports are known once every member is made; a single member
		// (StartEtcd) leaves the flag out and forms a cluster of its own.
		for _, m := range c.Members {
			m.args = append(m.args, "-initial-cluster", strings.Join(initial, ","))
		}
		if last = c.start(); last == nil {
			t.Cleanup(func() {
				for _, m := range c.Members {
					m.Kill()
				}
			})
			return c
		}
		for _, m := range c.Members {
			m.Kill()
		}
	}
	t.Fatalf("start etcd cluster: %v", last)
	return nil
}
