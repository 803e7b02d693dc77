//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// The election benchmarks measure, on each backend and beside etcd's own
// concurrency.Election on the same kind of etcd server, in one run:
//
//   - failover: a leader process campaigning with a 2 s TTL is killed with kill -9;
//     the time from the kill to the moment a follower's Campaign returns (its first
//     act as leader). Both sides wait for the dead leader's lease to expire, so the
//     TTL dominates; what differs is how soon the follower notices.
//   - observe: the time from a leader's Proclaim to an observer receiving the new
//     value.
//
// Run them with
//
//	go test -run XXX -bench Election -benchtime 5x ./cmd/dlock/
//
// The results are in docs/election.md.

// startLeader starts a leader process and waits until it leads: `dlock run` on
// url, or, with url "", an etcd concurrency candidate (etcdSpec).
func startLeader(b *testing.B, url, name, etcdSpec string) *exec.Cmd {
	b.Helper()
	file := filepath.Join(b.TempDir(), "leads")
	var cmd *exec.Cmd
	if url != "" {
		cmd = command(context.Background(), "run", "--backend", url, "--ttl", electionTTL.String(), "--wait", "forever", "--quiet",
			name, "--", "sh", "-c", `touch "$0" && exec sleep 1000`, file)
	} else {
		cmd = exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), etcdPeerEnv+"="+etcdSpec+" "+file)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(file); err == nil {
			return cmd
		}
		if time.Now().After(deadline) {
			b.Fatal("the leader process never led")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// failover runs b.N failovers: a leader process, a follower campaigning in this
// process (campaign blocks until it leads and returns a resign function), kill -9
// of the leader; it reports the mean and the largest time to the follower's lead.
func failover(b *testing.B, start func(i int) *exec.Cmd, campaign func(ctx context.Context, i int) (func(), error)) {
	var total, worst time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		n++
		leader := start(i)
		got := make(chan error, 1)
		var resign func()
		go func() {
			var err error
			resign, err = campaign(context.Background(), i)
			got <- err
		}()
		time.Sleep(300 * time.Millisecond) // the follower queues
		killed := time.Now()
		if err := leader.Process.Kill(); err != nil {
			b.Fatal(err)
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
		d := time.Since(killed)
		_ = leader.Wait()
		resign()
		total += d
		worst = max(worst, d)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(n), "ms/failover")
	b.ReportMetric(float64(worst.Milliseconds()), "max-ms")
}

// observe runs b.N proclamations and reports the mean and the largest time until
// an observer receives each.
func observe(b *testing.B, proclaim func(ctx context.Context, v string) error, next func() (string, error)) {
	ctx := context.Background()
	var total, worst time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		n++
		v := strconv.Itoa(i)
		start := time.Now()
		if err := proclaim(ctx, v); err != nil {
			b.Fatal(err)
		}
		for {
			got, err := next()
			if err != nil {
				b.Fatal(err)
			}
			if got == v {
				break
			}
		}
		d := time.Since(start)
		total += d
		worst = max(worst, d)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(n), "ms/change")
	b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
}

func openClient(b *testing.B, url string) *dlock.Client {
	b.Helper()
	c, err := dlock.Open(context.Background(), url, dlock.WithTTL(electionTTL))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func BenchmarkElection(b *testing.B) {
	for _, be := range electionBackends {
		b.Run(be.name, func(b *testing.B) {
			url := be.start(b)
			b.Run("failover", func(b *testing.B) {
				c := openClient(b, url)
				failover(b, func(i int) *exec.Cmd { return startLeader(b, url, fmt.Sprint("f", i), "") },
					func(ctx context.Context, i int) (func(), error) {
						l, err := c.Campaign(ctx, fmt.Sprint("f", i), nil)
						if err != nil {
							return nil, err
						}
						return func() { _ = l.Resign(ctx) }, nil
					})
			})
			b.Run("observe", func(b *testing.B) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				l, err := openClient(b, url).Campaign(ctx, "o", nil)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Resign(ctx)
				obs, err := openClient(b, url).Observe(ctx, "o")
				if err != nil {
					b.Fatal(err)
				}
				observe(b, func(ctx context.Context, v string) error { return l.Proclaim(ctx, []byte(v)) },
					func() (string, error) {
						ld, ok := <-obs
						if !ok {
							return "", errors.New("observe ended")
						}
						return string(ld.Value), nil
					})
			})
		})
	}
	b.Run("etcd-concurrency", func(b *testing.B) {
		srv := testserver.StartEtcd(b)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cli.Close() })
		session := func() *concurrency.Session {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(electionTTL/time.Second)))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
		b.Run("failover", func(b *testing.B) {
			failover(b, func(i int) *exec.Cmd { return startLeader(b, "", "", fmt.Sprintf("%s /peer/f%d", srv.Endpoint(), i)) },
				func(ctx context.Context, i int) (func(), error) {
					s := session()
					e := concurrency.NewElection(s, fmt.Sprintf("/peer/f%d", i))
					if err := e.Campaign(ctx, "follower"); err != nil {
						return nil, err
					}
					return func() { _ = e.Resign(ctx); _ = s.Close() }, nil
				})
		})
		b.Run("observe", func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ls := session()
			defer ls.Close()
			leader := concurrency.NewElection(ls, "/peer/o")
			if err := leader.Campaign(ctx, "start"); err != nil {
				b.Fatal(err)
			}
			obs := concurrency.NewElection(session(), "/peer/o").Observe(ctx)
			observe(b, leader.Proclaim, func() (string, error) {
				r, ok := <-obs
				if !ok || len(r.Kvs) == 0 {
					return "", errors.New("observe ended")
				}
				return string(r.Kvs[0].Value), nil
			})
		})
	})
}
