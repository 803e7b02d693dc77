// Package zkops registers the storeops store of the zk scheme: a go-zookeeper
// session, the floor (create an ephemeral node, delete it) and the packets the
// server received (mntr).
package zkops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

func init() { storeops.Register("zk", openZK) }

// zkStore is a ZooKeeper session of its own on the servers of a zk:// URL.
type zkStore struct {
	conn *zk.Conn
	root string
}

// zkFloorParent holds the floor's nodes under the URL's root: a container the
// server removes once it is empty. zklock's lock nodes are named "k-...", the
// floor's "f-...", so the two never meet.
const zkFloorParent = "/floor"

// openZK connects to the hosts of u (port 2181 by default) and takes u's path as
// the root under which the floor's nodes go. Credentials, TLS and other parameters
// are ignored: the benchmarks and tests run on plain loopback servers.
func openZK(ctx context.Context, u *url.URL) (storeops.Store, error) {
	if u.Host == "" {
		return nil, errors.New("storeops: zk URL lists no servers")
	}
	var hosts []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "2181")
		}
		hosts = append(hosts, h)
	}
	conn, events, err := zk.Connect(hosts, 10*time.Second, zk.WithLogger(zk.Logger(log.New(io.Discard, "", 0))))
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				go func() {
					for range events { // drained until the connection closes
					}
				}()
				return &zkStore{conn: conn, root: strings.TrimSuffix(u.Path, "/")}, nil
			}
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("storeops: connect to %s: %w", driver.Redact(u), ctx.Err())
		}
	}
}

// FloorCycle implements Store with the least a ZooKeeper lock does: create an
// ephemeral node and delete it, two requests and two round trips, with no queue,
// no listing and no watch. The node lives in the container <root>/floor.
func (s *zkStore) FloorCycle(_ context.Context, key string) error {
	parent := s.root + zkFloorParent
	p := parent + "/f-" + url.PathEscape(key)
	var err error
	for range 3 {
		_, err = s.conn.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		// The container (or the root) is missing: never made, or reaped when empty.
		if err = s.ensure(parent); err != nil {
			return fmt.Errorf("storeops: floor parent %s: %w", parent, err)
		}
	}
	if err != nil {
		return fmt.Errorf("storeops: floor create %s: %w", p, err)
	}
	if err := s.conn.Delete(p, -1); err != nil {
		return fmt.Errorf("storeops: floor delete %s: %w", p, err)
	}
	return nil
}

// ensure creates path's missing ancestors as persistent nodes and path itself as
// a container.
func (s *zkStore) ensure(path string) error {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	cur := ""
	for i, part := range parts {
		cur += "/" + part
		var err error
		if i == len(parts)-1 {
			_, err = s.conn.CreateContainer(cur, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll))
		} else {
			_, err = s.conn.Create(cur, nil, 0, zk.WorldACL(zk.PermAll))
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// Ops implements Store: the packets the server has received (zk_packets_received
// from the mntr four-letter word: requests and session pings), from the server
// this session is connected to. It needs mntr in the server's
// 4lw.commands.whitelist and a plain client port, and a standalone server: in an
// ensemble other clients' requests reach other members. Each read is itself one
// packet (measure.OpsOverhead finds that out).
func (s *zkStore) Ops(ctx context.Context) (int64, error) {
	addr := s.conn.Server()
	if addr == "" {
		return 0, errors.New("storeops: zk: not connected")
	}
	out, err := zkFourLetter(ctx, addr, "mntr")
	if err != nil {
		return 0, fmt.Errorf("storeops: zk mntr from %s: %w", addr, err)
	}
	var total int64 = -1
	state := ""
	for line := range strings.SplitSeq(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if !ok {
			continue
		}
		switch k {
		case "zk_packets_received":
			if total, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				return 0, fmt.Errorf("storeops: zk mntr zk_packets_received %q", v)
			}
		case "zk_server_state":
			state = strings.TrimSpace(v)
		}
	}
	if total < 0 {
		first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
		return 0, fmt.Errorf("storeops: zk mntr answered without zk_packets_received (is mntr in 4lw.commands.whitelist?): %q", first)
	}
	if state != "standalone" {
		return 0, fmt.Errorf("%w: zk packets are counted on a standalone server only (this one is %q)", driver.ErrUnsupported, state)
	}
	return total, nil
}

// zkFourLetter sends a four-letter-word command and returns the answer.
func zkFourLetter(ctx context.Context, addr, cmd string) (string, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline := time.Now().Add(2 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 1<<20))
	return string(b), err
}

// OpsSource implements Store.
func (s *zkStore) OpsSource() string { return "ZooKeeper packets received (mntr), pings included" }

// Close implements Store.
func (s *zkStore) Close() error {
	s.conn.Close()
	return nil
}
