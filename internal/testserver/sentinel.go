package testserver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SentinelMaster is the master name the sentinels of StartSentinel monitor.
const SentinelMaster = "dlockmaster"

// Sentinel is a Redis master with replicas (redis-server processes started with
// --replicaof) and redis-server --sentinel processes monitoring it, all on free
// loopback ports, stopped when the test ends.
type Sentinel struct {
	Name      string   // the master name
	Master    *Redis   // the current master (Failover and KillMaster change it)
	Replicas  []*Redis // the current replicas that run
	Sentinels []*Redis // the sentinel processes
	Down      []*Redis // data nodes KillMaster killed

	t        TB
	tls      *TLSFiles
	tlsPorts map[*Redis]int // each process's TLS port, with StartSentinelTLS
}

// SentinelDownAfter is the sentinels' down-after-milliseconds: how long a master
// must not answer before a sentinel thinks it is down. Long enough that a busy test
// machine does not fail the master over by mistake in the middle of a test.
const SentinelDownAfter = 2 * time.Second

// StartSentinel starts a master, replicas replicas of it and sentinels sentinels
// (quorum a majority of them), and returns once every replica is in sync, every
// sentinel knows every replica, and (with several sentinels) every other sentinel.
func StartSentinel(t TB, replicas, sentinels int) *Sentinel {
	t.Helper()
	return startSentinel(t, nil, replicas, sentinels)
}

// StartSentinelTLS is StartSentinel with every process also listening for TLS
// (clients need not present a certificate), replicas replicating and sentinels
// monitoring over TLS: the sentinels name the master by its TLS port. The plain
// ports stay open for readiness checks and test inspection (Addr); URL with the
// scheme rediss+sentinel lists the sentinels' TLS ports.
func StartSentinelTLS(t TB, f TLSFiles, replicas, sentinels int) *Sentinel {
	t.Helper()
	return startSentinel(t, &f, replicas, sentinels)
}

func startSentinel(t TB, f *TLSFiles, replicas, sentinels int) *Sentinel {
	t.Helper()
	if sentinels < 1 {
		t.Fatalf("StartSentinel: %d sentinels", sentinels)
	}
	s := &Sentinel{Name: SentinelMaster, t: t, tls: f, tlsPorts: make(map[*Redis]int)}
	s.Master = s.startData()
	for range replicas {
		s.Replicas = append(s.Replicas, s.startData("--replicaof", "127.0.0.1", strconv.Itoa(s.port(s.Master))))
	}
	s.waitReplication(s.Master, replicas)
	path := Require(t, "redis", "redis-server", "install it with: apt-get install -y redis-server")
	quorum := sentinels/2 + 1
	for range sentinels {
		s.Sentinels = append(s.Sentinels, s.startSentinel(path, quorum))
	}
	s.waitSentinels(replicas)
	return s
}

// startData starts a data node, with a TLS port under StartSentinelTLS.
func (s *Sentinel) startData(extra ...string) *Redis {
	s.t.Helper()
	if s.tls == nil {
		return StartRedis(s.t, extra...)
	}
	n, port := StartRedisTLS(s.t, *s.tls, append([]string{"--tls-replication", "yes"}, extra...)...)
	s.tlsPorts[n] = port
	return n
}

// port returns the port the sentinels and replicas know n by: its TLS port under
// StartSentinelTLS.
func (s *Sentinel) port(n *Redis) int {
	if p, ok := s.tlsPorts[n]; ok {
		return p
	}
	return n.Port
}

func (s *Sentinel) startSentinel(path string, quorum int) *Redis {
	t := s.t
	t.Helper()
	dir := t.TempDir()
	var last error
	for range 3 {
		port := FreePort(t)
		// Sentinel rewrites its configuration file: one per process, writable.
		cfg := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %[1]d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %[2]s\n"+
			"sentinel monitor %[3]s 127.0.0.1 %[4]d %[5]d\n"+
			"sentinel down-after-milliseconds %[3]s %[6]d\n"+
			"sentinel failover-timeout %[3]s 10000\n"+
			"sentinel parallel-syncs %[3]s 1\n",
			port, dir, s.Name, s.port(s.Master), quorum, SentinelDownAfter.Milliseconds())
		tlsPort := 0
		if f := s.tls; f != nil {
			tlsPort = FreePort(t)
			text += fmt.Sprintf("tls-port %d\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"+
				"tls-auth-clients no\ntls-replication yes\n", tlsPort, f.Cert, f.Key, f.CA)
		}
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		ready := func() error { return redisPing(port) }
		p := &Process{Name: "sentinel-" + strconv.Itoa(port), Dir: dir, t: t, path: path, args: []string{cfg, "--sentinel"}, ready: ready}
		if last = p.Restart(); last == nil {
			t.Cleanup(func() { p.Kill() })
			r := &Redis{Process: p, Port: port}
			if tlsPort != 0 {
				s.tlsPorts[r] = tlsPort
			}
			return r
		}
	}
	t.Fatalf("start redis-server --sentinel: %v", last)
	return nil
}

// Hosts returns the sentinels' host:port list, comma-separated.
func (s *Sentinel) Hosts() string {
	addrs := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		addrs[i] = n.Addr()
	}
	return strings.Join(addrs, ",")
}

// TLSHosts returns the sentinels' host:TLS-port list, comma-separated, under
// StartSentinelTLS.
func (s *Sentinel) TLSHosts() string {
	addrs := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(s.port(n))
	}
	return strings.Join(addrs, ",")
}

// URL returns scheme://sentinels/NAME, the scheme "redis+sentinel" when scheme is
// empty; add a query as needed. With the scheme rediss+sentinel it lists the
// sentinels' TLS ports.
func (s *Sentinel) URL(scheme string) string {
	if scheme == "" {
		scheme = "redis+sentinel"
	}
	if scheme == "rediss+sentinel" {
		return scheme + "://" + s.TLSHosts() + "/" + s.Name
	}
	return scheme + "://" + s.Hosts() + "/" + s.Name
}

// AnnouncedAddr returns the address the sentinels and replicas know n by: its
// TLS port under StartSentinelTLS, else Addr.
func (s *Sentinel) AnnouncedAddr(n *Redis) string { return "127.0.0.1:" + strconv.Itoa(s.port(n)) }

// Failover makes the first sentinel fail the master over to a replica (SENTINEL
// FAILOVER: the old master is demoted and becomes a replica of the new one), waits
// until every sentinel reports the new master and every other node replicates from
// it, and returns the new master.
func (s *Sentinel) Failover() *Redis {
	s.t.Helper()
	if _, err := respDo(s.Sentinels[0].Addr(), "SENTINEL", "FAILOVER", s.Name); err != nil {
		s.t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	return s.waitNewMaster()
}

// KillMaster kills the master with SIGKILL (a crash), waits until the sentinels
// notice it (after SentinelDownAfter), promote a replica and every sentinel reports
// it, and every other replica replicates from it, and returns the new master. The
// killed node stays down (in Down).
func (s *Sentinel) KillMaster() *Redis {
	s.t.Helper()
	s.Master.Kill()
	return s.waitNewMaster()
}

// MasterAddr returns the master's host:port as the first sentinel that answers
// reports it.
func (s *Sentinel) MasterAddr() (string, error) {
	var last error
	for _, sn := range s.Sentinels {
		addr, err := s.masterAddr(sn)
		if err == nil {
			return addr, nil
		}
		last = err
	}
	return "", last
}

func (s *Sentinel) masterAddr(sn *Redis) (string, error) {
	r, err := respDo(sn.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Name)
	if err != nil {
		return "", err
	}
	a, ok := r.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME answered %v", r)
	}
	return net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])), nil
}

func (s *Sentinel) waitNewMaster() *Redis {
	t := s.t
	t.Helper()
	old := s.Master
	nodes := append([]*Redis{old}, s.Replicas...)
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		if time.Now().After(deadline) {
			t.Fatalf("sentinels did not report a new master within 30s: %v; the first sentinel's last log lines:\n%s",
				last, tail(filepath.Join(s.Sentinels[0].Dir, s.Sentinels[0].Name+".log")))
		}
		time.Sleep(50 * time.Millisecond)
		var addr string
		last = nil
		for _, sn := range s.Sentinels {
			a, err := s.masterAddr(sn)
			switch {
			case err != nil:
				last = err
			case a == s.AnnouncedAddr(old):
				last = fmt.Errorf("sentinel %s still reports the old master %s", sn.Addr(), a)
			case addr != "" && a != addr:
				last = fmt.Errorf("sentinels disagree: %s and %s", addr, a)
			}
			addr = a
		}
		if last != nil {
			continue
		}
		var master *Redis
		for _, n := range nodes {
			if s.AnnouncedAddr(n) == addr {
				master = n
			}
		}
		if master == nil {
			t.Fatalf("the sentinels report %s, which is none of the data nodes", addr)
		}
		if info, err := respInfo(master.Addr(), "replication"); err != nil {
			last = err
			continue
		} else if info["role"] != "master" {
			last = fmt.Errorf("%s reports role %s", addr, info["role"])
			continue
		}
		var replicas []*Redis
		for _, n := range nodes {
			if n == master {
				continue
			}
			if n.Pid() == 0 {
				s.Down = append(s.Down, n)
				continue
			}
			replicas = append(replicas, n)
		}
		// Sentinel reconfigures a demoted master as a replica of the new one only
		// when it next reads the node's INFO (every 10s): do it now, as Sentinel
		// will, so that a test need not wait.
		for _, n := range replicas {
			if ri, err := respInfo(n.Addr(), "replication"); err == nil && ri["role"] == "master" {
				if _, err := respDo(n.Addr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(s.port(master))); err != nil {
					t.Fatalf("REPLICAOF on the old master %s: %v", n.Addr(), err)
				}
			}
		}
		s.Master, s.Replicas = master, replicas
		s.waitReplication(master, len(replicas))
		return master
	}
}

// waitReplication waits until master has n replicas online and each of them
// reports its link to master up.
func (s *Sentinel) waitReplication(master *Redis, n int) {
	t := s.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for !time.Now().After(deadline) {
		last = func() error {
			info, err := respInfo(master.Addr(), "replication")
			if err != nil {
				return err
			}
			online := 0
			for k, v := range info {
				if strings.HasPrefix(k, "slave") && strings.Contains(v, "state=online") {
					online++
				}
			}
			if online < n {
				return fmt.Errorf("master %s has %d of %d replicas online", master.Addr(), online, n)
			}
			for _, r := range s.Replicas {
				if r == master || r.Pid() == 0 {
					continue
				}
				ri, err := respInfo(r.Addr(), "replication")
				if err != nil {
					return err
				}
				if ri["master_port"] != strconv.Itoa(s.port(master)) || ri["master_link_status"] != "up" {
					return fmt.Errorf("replica %s: master_port %s, link %s", r.Addr(), ri["master_port"], ri["master_link_status"])
				}
			}
			return nil
		}()
		if last == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("replication not up within 30s: %v", last)
}

// waitSentinels waits until every sentinel lists the master's replicas replicas as
// healthy and knows the other sentinels.
func (s *Sentinel) waitSentinels(replicas int) {
	t := s.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for !time.Now().After(deadline) {
		last = func() error {
			for _, sn := range s.Sentinels {
				r, err := respDo(sn.Addr(), "SENTINEL", "REPLICAS", s.Name)
				if err != nil {
					return err
				}
				if got := countFlags(r, "slave"); got < replicas {
					return fmt.Errorf("sentinel %s knows %d of %d replicas", sn.Addr(), got, replicas)
				}
				r, err = respDo(sn.Addr(), "SENTINEL", "SENTINELS", s.Name)
				if err != nil {
					return err
				}
				if got := countFlags(r, "sentinel"); got < len(s.Sentinels)-1 {
					return fmt.Errorf("sentinel %s knows %d of %d other sentinels", sn.Addr(), got, len(s.Sentinels)-1)
				}
			}
			return nil
		}()
		if last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sentinels not ready within 30s: %v", last)
}

// countFlags counts the entries of a SENTINEL REPLICAS or SENTINELS reply whose
// flags are exactly flags (no s_down, disconnected, ...).
func countFlags(r any, flags string) int {
	list, _ := r.([]any)
	n := 0
	for _, e := range list {
		fields, _ := e.([]any)
		for i := 0; i+1 < len(fields); i += 2 {
			if fmt.Sprint(fields[i]) == "flags" && fmt.Sprint(fields[i+1]) == flags {
				n++
			}
		}
	}
	return n
}

// respInfo returns the key:value lines of INFO section.
func respInfo(addr, section string) (map[string]string, error) {
	r, err := respDo(addr, "INFO", section)
	if err != nil {
		return nil, err
	}
	text, ok := r.(string)
	if !ok {
		return nil, fmt.Errorf("INFO answered %v", r)
	}
	info := make(map[string]string)
	for line := range strings.SplitSeq(text, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			info[k] = v
		}
	}
	return info, nil
}

// respDo sends one command on a new connection and returns its reply: a string,
// an int64, nil, a []any of those, or an error for an error reply. Just enough RESP2
// for the test servers, without a client library.
func respDo(addr string, args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return respRead(bufio.NewReader(c))
}

func respRead(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			v, err := respRead(r)
			if err != nil {
				return nil, err
			}
			a[i] = v
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}
