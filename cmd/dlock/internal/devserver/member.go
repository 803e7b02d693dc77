package devserver

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// MemberEnv, set to "1" in a process's environment, makes MaybeRunMember turn that
// process into one etcd member: the test-server launcher starts etcd members as
// processes of their own this way, so that tests can kill, stop and pause them.
const MemberEnv = "DLOCK_ETCD_MEMBER_RUN"

// ReadyFile is the file a member process creates in its directory once it serves
// clients; the launcher waits for it.
const ReadyFile = "ready"

// MaybeRunMember runs an etcd member and exits, if MemberEnv asks for it; otherwise
// it returns at once. A program that the launcher may start as an etcd member (the
// dlock command) calls it first thing in main.
func MaybeRunMember() {
	if os.Getenv(MemberEnv) != "1" {
		return
	}
	os.Exit(RunMember(os.Args[1:]))
}

// RunMember runs one member configured by command-line flags until SIGTERM or
// SIGINT (a clean stop) and returns the process exit code. The flags mirror Config.
func RunMember(args []string) int {
	fs := flag.NewFlagSet("etcd-member", flag.ContinueOnError)
	var cfg Config
	fs.StringVar(&cfg.Dir, "dir", "", "data directory (required)")
	fs.StringVar(&cfg.Name, "name", "", "member name")
	fs.IntVar(&cfg.ClientPort, "client-port", 0, "client port on 127.0.0.1")
	fs.IntVar(&cfg.PeerPort, "peer-port", 0, "peer port on 127.0.0.1")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "name=peerURL,... of a new cluster")
	fs.StringVar(&cfg.ClusterToken, "cluster-token", "", "cluster token")
	fs.UintVar(&cfg.TickMs, "tick-ms", 0, "Raft heartbeat")
	fs.UintVar(&cfg.ElectionMs, "election-ms", 0, "Raft election timeout")
	fs.StringVar(&cfg.CertFile, "cert", "", "client TLS certificate")
	fs.StringVar(&cfg.KeyFile, "key", "", "client TLS key")
	fs.StringVar(&cfg.ClientCAFile, "client-ca", "", "CA that client certificates must be signed by")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Dir == "" || cfg.ClientPort == 0 || cfg.PeerPort == 0 {
		fmt.Fprintln(os.Stderr, "etcd-member: -dir, -client-port and -peer-port are required")
		return 2
	}
	m, err := NewMember(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err = m.Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, ReadyFile), nil, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-member:", err)
		m.Kill()
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		m.Stop()
		return 0
	case err := <-m.Err():
		fmt.Fprintln(os.Stderr, "etcd-member: stopped:", err)
		m.Kill()
		return 1
	}
}
