// Package testserver starts real servers (redis-server, ...) for tests, on free
// loopback ports in temporary directories, and stops them when the test ends.
//
// A missing server binary fails the test with a hint on how to install it. Setting
// DLOCK_TEST_SKIP to a comma-separated list of server names (for example "redis")
// skips such tests instead, on a developer machine only: when CI is set, the variable
// is refused and the test fails.
package testserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Require returns the path of binary, or fails (or, with DLOCK_TEST_SKIP, skips) the
// test with an install hint.
func Require(t TB, name, binary, hint string) string {
	t.Helper()
	path, err := exec.LookPath(binary)
	if err == nil {
		return path
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/lib/postgresql/15/bin"} {
		if p := filepath.Join(dir, binary); isExec(p) {
			return p
		}
	}
	if skipped(name) {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found and DLOCK_TEST_SKIP=%s is refused in CI: %s", binary, os.Getenv("DLOCK_TEST_SKIP"), hint)
		}
		t.Skipf("%s not found; skipped because DLOCK_TEST_SKIP includes %q", binary, name)
	}
	t.Fatalf("%s not found on PATH: %s (or run the README's test command, which installs it; DLOCK_TEST_SKIP=%s skips these tests outside CI)", binary, hint, name)
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

func skipped(name string) bool {
	for s := range strings.SplitSeq(os.Getenv("DLOCK_TEST_SKIP"), ",") {
		if strings.TrimSpace(s) == name || strings.TrimSpace(s) == "all" {
			return true
		}
	}
	return false
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Process is a server process under test control.
type Process struct {
	Name string
	Dir  string // its working directory, kept across restarts

	t     TB
	path  string
	args  []string
	env   []string // added to the test process's environment
	ready func() error

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// Start runs path with args in dir and waits until ready returns nil. The process is
// killed when the test ends, and on Linux also if the test binary dies (parent-death
// signal; other systems have none, see procAttr).
func Start(t TB, name, path, dir string, args []string, ready func() error) *Process {
	t.Helper()
	p := &Process{Name: name, Dir: dir, t: t, path: path, args: args, ready: ready}
	if err := p.Restart(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { p.Kill() })
	return p
}

// Restart starts the process again (after Stop or Kill) with the same arguments and
// directory, and waits until it is ready.
func (p *Process) Restart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is running", p.Name)
	}
	logf, err := os.OpenFile(filepath.Join(p.Dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Dir = p.Dir
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(true, nil)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done, p.log = cmd, done, logf
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := p.ready()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			p.cmd = nil
			logf.Close()
			return fmt.Errorf("%s exited during start-up; last log lines:\n%s", p.Name, tail(filepath.Join(p.Dir, p.Name+".log")))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30s: %v; last log lines:\n%s", p.Name, err, tail(filepath.Join(p.Dir, p.Name+".log")))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid returns the process id, or 0 when not running.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *Process) signalAndWait(sig syscall.Signal, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
	p.cmd = nil
}

// Kill stops the process with SIGKILL (a crash) and waits for it to exit.
func (p *Process) Kill() { p.signalAndWait(syscall.SIGKILL, 10*time.Second) }

// Stop stops the process with SIGTERM (a clean shutdown), or SIGKILL after 10s.
func (p *Process) Stop() { p.signalAndWait(syscall.SIGTERM, 10*time.Second) }

// Pause sends SIGSTOP; Resume sends SIGCONT. Both do nothing on Windows, which has
// neither signal.
func (p *Process) Pause() { p.signal(sigStop) }

// Resume continues a paused process.
func (p *Process) Resume() { p.signal(sigCont) }

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 20 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Redis is a redis-server started for a test.
type Redis struct {
	*Process
	Port int
}

// Addr returns host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// URL returns a redis:// URL for the server.
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// StartRedis starts redis-server on a free loopback port with no persistence unless
// extra arguments (redis-server command-line options such as "--appendonly", "yes")
// say otherwise.
func StartRedis(t TB, extra ...string) *Redis {
	t.Helper()
	path := Require(t, "redis", "redis-server", "install it with: apt-get install -y redis-server")
	dir := t.TempDir()
	var last error
	for range 3 {
		port := FreePort(t)
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no",
			"--repl-diskless-sync-delay", "0"}, extra...)
		ready := func() error { return redisPing(port) }
		p := &Process{Name: "redis-" + strconv.Itoa(port), Dir: dir, t: t, path: path, args: args, ready: ready}
		if last = p.Restart(); last == nil {
			t.Cleanup(func() { p.Kill() })
			return &Redis{Process: p, Port: port}
		}
	}
	t.Fatalf("start redis-server: %v", last)
	return nil
}

// redisPing speaks just enough RESP to check readiness without a client library.
func redisPing(port int) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}
