package testserver

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PostgresInstallHint says how to get the PostgreSQL server binaries.
const PostgresInstallHint = "install it with: apt-get install -y postgresql"

// Postgres is a PostgreSQL server started for a test: a fresh cluster made by initdb
// in a temporary directory, listening on a free 127.0.0.1 port, with its Unix socket in
// that directory. The superuser is "postgres" with a random password; TCP connections
// authenticate with scram-sha-256, the Unix socket trusts local users.
//
// Its Restart, Stop, Kill, Pause and Resume act on the whole server (the postmaster and
// its backends, one process group), unlike the plain Process methods.
type Postgres struct {
	*Process
	Port      int
	SocketDir string
	DataDir   string
	Password  string // of the superuser "postgres"

	cred *credential // non-nil when running as root: the user that runs the server
}

// Addr returns host:port.
func (s *Postgres) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns a postgres:// URL for the superuser on the database "postgres".
func (s *Postgres) URL() string { return s.URLFor("postgres", s.Password, "postgres") }

// URLFor returns a postgres:// URL for user with password on database db, without TLS.
func (s *Postgres) URLFor(user, password, db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: s.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// postgresBinDir finds the directory of initdb and postgres: PATH first, then the
// newest /usr/lib/postgresql/*/bin (Debian keeps them off PATH).
func postgresBinDir(t TB) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d
		}
	}
	return filepath.Dir(Require(t, "postgres", "initdb", PostgresInstallHint))
}

func pgVersion(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// StartPostgres makes a new cluster with initdb and starts it. extra holds postgres
// command-line options, for example "-c", "fsync=off"; without them the server runs
// with its default settings (fsync on, synchronous_commit on).
func StartPostgres(t TB, extra ...string) *Postgres {
	t.Helper()
	return startPostgres(t, nil, extra)
}

// StartPostgresTLS is StartPostgres with TLS on (ssl=on) using the server certificate
// and key in f; clients may still connect without TLS.
func StartPostgresTLS(t TB, f TLSFiles, extra ...string) *Postgres {
	t.Helper()
	return startPostgres(t, &f, extra)
}

// startPostgres makes the cluster and starts it. It is one script (about 80 lines):
// initdb, ownership, TLS files and the start, each needed by the next.
func startPostgres(t TB, tlsFiles *TLSFiles, extra []string) *Postgres {
	t.Helper()
	bin := postgresBinDir(t)
	cred, err := serverCredential()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	dir := t.TempDir()
	sockDir := dir
	if len(sockDir)+len("/.s.PGSQL.65535.lock") > 100 { // sun_path holds 108 bytes
		sockDir, err = os.MkdirTemp("", "pg")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(sockDir) })
	}
	if cred != nil {
		for _, d := range []string{dir, sockDir} {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatalf("start postgres: %v", err)
			}
			// t.TempDir's parent is private to root: let the server user through.
			parent := filepath.Dir(d)
			if st, err := os.Stat(parent); err == nil && st.Mode().Perm()&0o001 == 0 && strings.HasPrefix(parent, os.TempDir()) && parent != os.TempDir() {
				_ = os.Chmod(parent, st.Mode().Perm()|0o011)
			}
		}
	}
	var pw [12]byte
	_, _ = rand.Read(pw[:])
	s := &Postgres{SocketDir: sockDir, DataDir: filepath.Join(dir, "data"), Password: hex.EncodeToString(pw[:]), cred: cred}

	pwFile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(s.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		_ = os.Chown(pwFile, int(cred.Uid), int(cred.Gid))
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.DataDir, "-U", "postgres", "--pwfile", pwFile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
		"--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	initdb.SysProcAttr = procAttr(false, cred)
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	_ = os.Remove(pwFile)
	if tlsFiles != nil {
		// The server reads its certificate and key (which must be private to it)
		// from its data directory.
		for src, dst := range map[string]string{tlsFiles.Cert: "server.crt", tlsFiles.Key: "server.key"} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(s.DataDir, dst)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if cred != nil {
				_ = os.Chown(path, int(cred.Uid), int(cred.Gid))
			}
		}
		extra = append([]string{"-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key"}, extra...)
	}

	var last error
	for range 3 {
		port := FreePort(t)
		args := append([]string{"-D", s.DataDir, "-p", strconv.Itoa(port), "-k", sockDir,
			"-c", "listen_addresses=127.0.0.1"}, extra...)
		s.Port = port
		s.Process = &Process{Name: "postgres-" + strconv.Itoa(port), Dir: dir, t: t, path: filepath.Join(bin, "postgres"), args: args}
		if last = s.Restart(); last == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start postgres: %v", last)
	return nil
}

// Restart starts the server again (after Stop or Kill) on the same port and data
// directory, and waits until it accepts connections (after crash recovery, if any).
// Right after a kill -9 the postmaster sometimes exits at once with status 1 and
// nothing in its log (seen on a loaded 2-CPU machine, before and after the test
// server's platform split); it is started again, up to three times.
func (s *Postgres) Restart() error {
	var err error
	for range 3 {
		if err = s.restart(); !errors.Is(err, errStartupExit) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

// errStartupExit marks a server that exited during start-up.
var errStartupExit = errors.New("exited during start-up")

func (s *Postgres) restart() error {
	p := s.Process
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is running", p.Name)
	}
	logPath := filepath.Join(p.Dir, p.Name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(true, s.cred)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done, p.log = cmd, done, logf
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := s.ready(cmd.Process.Pid)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			p.cmd = nil
			logf.Close()
			return fmt.Errorf("%s %w (%v); last log lines:\n%s", p.Name, errStartupExit, cmd.ProcessState, tail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			_ = killGroup(cmd.Process.Pid, syscall.SIGKILL)
			<-done
			p.cmd = nil
			logf.Close()
			return fmt.Errorf("%s not ready after 60s: %v; last log lines:\n%s", p.Name, err, tail(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ready reports whether the postmaster with this pid says it accepts connections
// (line 8 of postmaster.pid) and its TCP port answers.
func (s *Postgres) ready(pid int) error {
	b, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(pid) {
		return fmt.Errorf("postmaster.pid not written yet")
	}
	if st := strings.TrimSpace(lines[7]); st != "ready" {
		return fmt.Errorf("postmaster status %q", st)
	}
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// signalGroup sends sig to the server (first to the postmaster only when group is
// false), waits up to wait for it to exit, then kills the whole process group.
func (s *Postgres) signalGroup(sig syscall.Signal, group bool, wait time.Duration) {
	p := s.Process
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	pid := p.cmd.Process.Pid
	if group {
		_ = killGroup(pid, sig)
	} else {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = killGroup(pid, syscall.SIGKILL)
		<-p.done
	}
	// Backends exit on their own once the postmaster is gone; make sure of it, and
	// wait until they have, so a restart does not find the old shared memory still
	// attached.
	_ = killGroup(pid, syscall.SIGKILL)
	waitGroupGone(pid, 10*time.Second)
	p.log.Close()
	p.cmd = nil
}

// waitGroupGone waits until no live (non-zombie) process is in process group pgid.
func waitGroupGone(pgid int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && groupAlive(pgid) {
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill crashes the server: SIGKILL to the postmaster and every backend. Committed
// data survives (fsync is on by default); the next start runs crash recovery.
func (s *Postgres) Kill() { s.signalGroup(syscall.SIGKILL, true, 10*time.Second) }

// Stop shuts the server down cleanly ("fast" shutdown: SIGINT, which disconnects
// clients and writes a checkpoint), or kills it after 20s.
func (s *Postgres) Stop() { s.signalGroup(syscall.SIGINT, false, 20*time.Second) }

// Pause stops every server process (SIGSTOP to the process group); Resume continues them.
func (s *Postgres) Pause() { s.signalAll(sigStop) }

// Resume continues a paused server.
func (s *Postgres) Resume() { s.signalAll(sigCont) }

func (s *Postgres) signalAll(sig syscall.Signal) {
	p := s.Process
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = killGroup(p.cmd.Process.Pid, sig)
	}
}
