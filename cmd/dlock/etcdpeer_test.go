package main

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// electionTTL is the lease TTL of every candidate: etcd's least lease TTL on the
// test server's timing is above 1 s, so both sides use 2 s.
const electionTTL = 2 * time.Second

// etcdPeerEnv makes the test binary an etcd concurrency.Election candidate:
// "endpoint|election prefix|file": it campaigns, creates the file once it leads,
// and waits to be killed.
const etcdPeerEnv = "DLOCK_TEST_ETCD_CANDIDATE"

// runEtcdPeer is the etcd candidate process (see etcdPeerEnv).
func runEtcdPeer(spec string) int {
	var endpoint, prefix, file string
	if _, err := fmt.Sscanf(spec, "%s %s %s", &endpoint, &prefix, &file); err != nil {
		fmt.Fprintln(os.Stderr, "bad", etcdPeerEnv, err)
		return 2
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(electionTTL/time.Second)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := concurrency.NewElection(s, prefix).Campaign(context.Background(), "peer"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		return 1
	}
	select {}
}
