package testserver

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
)

// MariaDBInstallHint says how to get the MariaDB server binaries.
const MariaDBInstallHint = "install it with: apt-get install -y mariadb-server"

// MariaDB is a MariaDB server started for a test: a fresh data directory made by
// mariadb-install-db in a temporary directory, mariadbd listening on a free
// 127.0.0.1 port (and a Unix socket in that directory), with its default durability
// settings (innodb_flush_log_at_trx_commit=1). A user "dlock" with a random password
// and every privilege (an administrator, for tests) and a database "dlock" are made
// at every start.
//
// mariadbd is one process; the Process methods (Kill, Stop, Pause, Resume, Restart)
// act on it, and Restart keeps the data directory and port.
type MariaDB struct {
	*Process
	Port     int
	DataDir  string
	Socket   string
	User     string // "dlock"
	Password string
	Database string // "dlock"
}

// Addr returns host:port.
func (s *MariaDB) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns a mysql:// URL for the administrator on the test database.
func (s *MariaDB) URL() string { return s.URLFor(s.User, s.Password, s.Database) }

// URLFor returns a mysql:// URL for user with password on database db, without TLS.
func (s *MariaDB) URLFor(user, password, db string) string {
	u := url.URL{Scheme: "mysql", User: url.UserPassword(user, password), Host: s.Addr(), Path: "/" + db}
	return u.String()
}

// StartMariaDB makes a data directory with mariadb-install-db and starts mariadbd on
// it. extra holds mariadbd options, for example "--innodb-flush-log-at-trx-commit=2".
func StartMariaDB(t TB, extra ...string) *MariaDB {
	t.Helper()
	server := Require(t, "mariadb", "mariadbd", MariaDBInstallHint)
	install := Require(t, "mariadb", "mariadb-install-db", MariaDBInstallHint)
	dir := t.TempDir()
	sockDir := dir
	if len(sockDir)+len("/mysqld.sock") > 100 { // sun_path holds 108 bytes
		d, err := os.MkdirTemp("", "my")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		sockDir = d
	}
	var pw [12]byte
	_, _ = rand.Read(pw[:])
	s := &MariaDB{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(sockDir, "mysqld.sock"),
		User: "dlock", Password: hex.EncodeToString(pw[:]), Database: "dlock"}
	// mariadbd runs as the test's user; as root it must be told so.
	runAs := []string{}
	if os.Geteuid() == 0 {
		runAs = []string{"--user=root"}
	} else if u, err := user.Current(); err == nil {
		runAs = []string{"--user=" + u.Username}
	}
	// A temporary directory of its own: a starting server deletes every "#sql"
	// file in its tmpdir (temporary tables left by a crash), which in a shared /tmp
	// are those of the other servers and installs running at the same time.
	tmpDir := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmpDir, 0o700); err != nil {
		t.Fatal(err)
	}
	initArgs := append([]string{"--no-defaults", "--datadir=" + s.DataDir, "--tmpdir=" + tmpDir, "--auth-root-authentication-method=socket",
		"--skip-test-db", "--skip-name-resolve"}, runAs...)
	cmd := exec.Command(install, initArgs...)
	cmd.Dir = dir
	cmd.SysProcAttr = procAttr(false, nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	// The init file runs at every start, before the server takes connections.
	initFile := filepath.Join(dir, "init.sql")
	initSQL := fmt.Sprintf("CREATE USER IF NOT EXISTS '%[1]s'@'%%' IDENTIFIED BY '%[2]s';\n"+
		"GRANT ALL PRIVILEGES ON *.* TO '%[1]s'@'%%' WITH GRANT OPTION;\n"+
		"CREATE DATABASE IF NOT EXISTS `%[3]s`;\n", s.User, s.Password, s.Database)
	if err := os.WriteFile(initFile, []byte(initSQL), 0o600); err != nil {
		t.Fatal(err)
	}
	var last error
	for range 3 {
		port := FreePort(t)
		args := append([]string{"--no-defaults", "--datadir=" + s.DataDir, "--port=" + strconv.Itoa(port),
			"--bind-address=127.0.0.1", "--socket=" + s.Socket, "--tmpdir=" + tmpDir, "--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
			"--skip-name-resolve", "--init-file=" + initFile, "--log-error=" + filepath.Join(dir, "error.log"),
			"--innodb-buffer-pool-size=64M", "--max-connections=400"}, runAs...)
		args = append(args, extra...)
		s.Port = port
		s.Process = &Process{Name: "mariadb-" + strconv.Itoa(port), Dir: dir, t: t, path: server, args: args,
			ready: func() error { return mysqlGreeting(port) }}
		if last = s.Restart(); last == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start mariadbd: %v (error log: %s)", last, tail(filepath.Join(dir, "error.log")))
	return nil
}

// mysqlGreeting reads the server's handshake packet: a protocol-10 greeting means
// the server takes connections (an error packet, 0xff, means it does not yet).
func mysqlGreeting(port int) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	var b [5]byte
	if _, err := c.Read(b[:]); err != nil {
		return err
	}
	if b[4] != 10 {
		return fmt.Errorf("handshake starts with 0x%02x, not protocol 10", b[4])
	}
	return nil
}
