package testserver

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ZooKeeper install locations of the Debian package "zookeeper" (3.8 in bookworm):
// the server jar, whose manifest class path names its dependencies, and an optional
// slf4j binding so that the server's log reaches the log file.
const (
	zooKeeperJar  = "/usr/share/java/zookeeper.jar"
	zooKeeperSLF4 = "/usr/share/java/slf4j-simple.jar"
	zooKeeperHint = "install it with: apt-get install -y zookeeper"
)

// zooKeeperNetty are the jars the Netty connection factory (TLS) needs beyond those
// named in zookeeper.jar's manifest; the package's dependencies install them.
var zooKeeperNetty = []string{"/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar"}

// ZooKeeper is a ZooKeeper server started for a test, standalone or as a member of
// an ensemble.
type ZooKeeper struct {
	*Process
	Port       int // client port on 127.0.0.1
	SecurePort int // TLS client port on 127.0.0.1, 0 without TLS
}

// SecureAddr returns host:port of the TLS client port.
func (z *ZooKeeper) SecureAddr() string { return "127.0.0.1:" + strconv.Itoa(z.SecurePort) }

// Addr returns host:port of the client port.
func (z *ZooKeeper) Addr() string { return "127.0.0.1:" + strconv.Itoa(z.Port) }

// URL returns a zk:// URL for the server with the given chroot path ("" for none).
func (z *ZooKeeper) URL(chroot string) string { return "zk://" + z.Addr() + chroot }

// FourLetter sends a ZooKeeper four-letter-word command ("srvr", "mntr", "ruok") to
// the server and returns the answer. The test servers allow srvr, mntr, ruok, stat
// and cons.
func (z *ZooKeeper) FourLetter(cmd string) (string, error) { return zkFourLetter(z.Addr(), cmd) }

// requireZooKeeper returns the java binary and the class path of the ZooKeeper server,
// or fails (or skips, see Require) with an install hint.
func requireZooKeeper(t TB) (java, classpath string) {
	t.Helper()
	if _, err := os.Stat(zooKeeperJar); err != nil {
		if skipped("zookeeper") {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not found and DLOCK_TEST_SKIP=%s is refused in CI: %s", zooKeeperJar, os.Getenv("DLOCK_TEST_SKIP"), zooKeeperHint)
			}
			t.Skipf("%s not found; skipped because DLOCK_TEST_SKIP includes %q", zooKeeperJar, "zookeeper")
		}
		t.Fatalf("%s not found: %s (or run the README's test command, which installs it; DLOCK_TEST_SKIP=zookeeper skips these tests outside CI)", zooKeeperJar, zooKeeperHint)
	}
	java = Require(t, "zookeeper", "java", zooKeeperHint+" (it pulls in a Java runtime)")
	classpath = zooKeeperJar
	for _, jar := range append([]string{zooKeeperSLF4}, zooKeeperNetty...) {
		if _, err := os.Stat(jar); err == nil {
			classpath += ":" + jar
		}
	}
	return java, classpath
}

// zkConfig is the common part of every test server's zoo.cfg: a short tick so that
// session timeouts down to 400ms are allowed (and up to 60s), no admin HTTP server,
// the few four-letter words the tests use, and no fsync (a killed process keeps its
// data in the page cache; the machine is not expected to crash under a test).
func zkConfig(dir string, port int, extra []string) string {
	lines := []string{
		"tickTime=200",
		"initLimit=50",
		"syncLimit=10",
		"dataDir=" + filepath.Join(dir, "data"),
		"clientPort=" + strconv.Itoa(port),
		"clientPortAddress=127.0.0.1",
		"admin.enableServer=false",
		"4lw.commands.whitelist=srvr,mntr,ruok,stat,cons",
		"maxSessionTimeout=60000",
		"maxClientCnxns=0",
		"forceSync=no",
		"autopurge.purgeInterval=0",
	}
	return strings.Join(append(lines, extra...), "\n") + "\n"
}

func zkJavaArgs(classpath, cfg string) []string {
	return []string{
		"-Xmx256m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
		"-Dzookeeper.admin.enableServer=false",
		// Empty containers (lock parents) are reaped every second rather than every
		// minute, so tests can see that nothing is left behind.
		"-Dznode.container.checkIntervalMs=1000",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-cp", classpath,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg,
	}
}

// StartZooKeeper starts a standalone ZooKeeper server from the Debian package on a
// free loopback port, with a zoo.cfg generated in a temporary directory. extra adds
// zoo.cfg lines ("key=value"). The server runs in the foreground of the test and is
// killed when the test ends.
func StartZooKeeper(t TB, extra ...string) *ZooKeeper {
	t.Helper()
	return startZooKeeper(t, nil, extra)
}

// ZooKeeperTLS configures a TLS client port (served by the Netty connection
// factory, next to the plain one).
type ZooKeeperTLS struct {
	// KeyCertPEM is a PEM file with the server's PKCS#8 private key followed by its
	// certificate chain.
	KeyCertPEM string
	// CAPEM is a PEM file with the CA certificates that client certificates must
	// chain to.
	CAPEM string
	// ClientAuth requires clients to present a certificate.
	ClientAuth bool
}

// StartZooKeeperTLS starts a standalone server like StartZooKeeper with a TLS client
// port as well (SecurePort).
func StartZooKeeperTLS(t TB, tlsCfg ZooKeeperTLS, extra ...string) *ZooKeeper {
	t.Helper()
	return startZooKeeper(t, &tlsCfg, extra)
}

func startZooKeeper(t TB, tlsCfg *ZooKeeperTLS, extra []string) *ZooKeeper {
	t.Helper()
	java, cp := requireZooKeeper(t)
	dir := t.TempDir()
	var last error
	for range 3 {
		port, secure := FreePort(t), 0
		lines := extra
		if tlsCfg != nil {
			secure = FreePort(t)
			auth := "none"
			if tlsCfg.ClientAuth {
				auth = "need"
			}
			lines = append([]string{
				"secureClientPort=" + strconv.Itoa(secure),
				"secureClientPortAddress=127.0.0.1",
				"serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
				"ssl.keyStore.location=" + tlsCfg.KeyCertPEM,
				"ssl.keyStore.type=PEM",
				"ssl.trustStore.location=" + tlsCfg.CAPEM,
				"ssl.trustStore.type=PEM",
				"ssl.clientAuth=" + auth,
			}, extra...)
		}
		cfg := filepath.Join(dir, "zoo.cfg")
		if err := os.WriteFile(cfg, []byte(zkConfig(dir, port, lines)), 0o644); err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p := &Process{Name: "zookeeper-" + strconv.Itoa(port), Dir: dir, t: t, path: java,
			args: zkJavaArgs(cp, cfg), ready: func() error { return zkServing(addr) }}
		if last = p.Restart(); last == nil {
			t.Cleanup(func() { p.Kill() })
			return &ZooKeeper{Process: p, Port: port, SecurePort: secure}
		}
	}
	t.Fatalf("start zookeeper: %v", last)
	return nil
}

// ZooKeeperEnsemble is a replicated ZooKeeper ensemble on loopback ports.
type ZooKeeperEnsemble struct {
	Servers []*ZooKeeper
}

// Hosts returns the comma-separated host:port list of the members' client ports.
func (e *ZooKeeperEnsemble) Hosts() string {
	hs := make([]string, len(e.Servers))
	for i, s := range e.Servers {
		hs[i] = s.Addr()
	}
	return strings.Join(hs, ",")
}

// URL returns a zk:// URL naming every member, with the given chroot ("" for none).
func (e *ZooKeeperEnsemble) URL(chroot string) string { return "zk://" + e.Hosts() + chroot }

// Leader returns the member that is currently the leader, or nil.
func (e *ZooKeeperEnsemble) Leader() *ZooKeeper {
	for _, s := range e.Servers {
		if out, err := s.FourLetter("srvr"); err == nil && strings.Contains(out, "Mode: leader") {
			return s
		}
	}
	return nil
}

// StartZooKeeperEnsemble starts an ensemble of n servers (n odd, 3 or 5) and waits
// until every member serves clients. extra adds zoo.cfg lines to every member.
func StartZooKeeperEnsemble(t TB, n int, extra ...string) *ZooKeeperEnsemble {
	t.Helper()
	java, cp := requireZooKeeper(t)
	if n < 1 {
		t.Fatalf("ensemble of %d servers", n)
	}
	type member struct {
		dir                    string
		client, peer, election int
	}
	ms := make([]member, n)
	var servers []string
	for i := range ms {
		ms[i] = member{dir: t.TempDir(), client: FreePort(t), peer: FreePort(t), election: FreePort(t)}
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ms[i].peer, ms[i].election))
	}
	e := &ZooKeeperEnsemble{}
	for i, m := range ms {
		if err := os.MkdirAll(filepath.Join(m.dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.dir, "data", "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		lines := append(append([]string{}, servers...), extra...)
		cfg := filepath.Join(m.dir, "zoo.cfg")
		if err := os.WriteFile(cfg, []byte(zkConfig(m.dir, m.client, lines)), 0o644); err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(m.client)
		p := &Process{Name: "zookeeper-" + strconv.Itoa(m.client), Dir: m.dir, t: t, path: java,
			args: zkJavaArgs(cp, cfg), ready: func() error { return zkServing(addr) }}
		e.Servers = append(e.Servers, &ZooKeeper{Process: p, Port: m.client})
	}
	// A member serves only once a quorum is up, so start them all at once.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range e.Servers {
		wg.Go(func() { errs[i] = s.Restart() })
	}
	wg.Wait()
	for _, s := range e.Servers {
		t.Cleanup(func() { s.Kill() })
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start zookeeper ensemble member %d: %v", i+1, err)
		}
	}
	return e
}

// zkServing reports whether the server at addr serves clients (srvr shows a Mode).
func zkServing(addr string) error {
	out, err := zkFourLetter(addr, "srvr")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "Mode: ") {
		return fmt.Errorf("not serving yet: %q", strings.TrimSpace(out))
	}
	return nil
}

func zkFourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
