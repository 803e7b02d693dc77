package zklock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
)

var (
	_ driver.Floorer    = (*Backend)(nil)
	_ driver.OpsCounter = (*Backend)(nil)
)

// floorParent is the container node under the root that holds the floor's nodes; lock
// nodes are named "k-...", so it cannot meet one. The floor's nodes are named "f-"
// and the escaped key, so they cannot meet the lock nodes of a root that another
// client placed at <root>/floor either.
const floorParent = "/floor"

// FloorCycle implements driver.Floorer with the least a ZooKeeper lock does: create
// an ephemeral node and delete it, two requests and two round trips on this
// backend's session, with no queue, no listing and no watch. The nodes live under
// the container <root>/floor, which the server removes once it is empty.
func (b *Backend) FloorCycle(ctx context.Context, key string) error {
	parent := b.root + floorParent
	p := parent + "/f-" + url.PathEscape(key)
	var err error
	for range 3 {
		err = b.call(ctx, func() error {
			_, err := b.conn.Create(p, nil, zk.FlagEphemeral, b.acl)
			return err
		})
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		// The container is missing (never made, or reaped when empty).
		err = b.call(ctx, func() error {
			_, err := b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.acl)
			if errors.Is(err, zk.ErrNodeExists) {
				return nil
			}
			return err
		})
		if err != nil {
			return wrap("floor create", key, err)
		}
	}
	if err != nil {
		return wrap("floor create", key, err)
	}
	if err := b.call(ctx, func() error { return b.conn.Delete(p, -1) }); err != nil {
		return wrap("floor delete", key, err)
	}
	return nil
}

// ServerOps implements driver.OpsCounter: the packets the server has received
// (zk_packets_received from the mntr four-letter word: requests and session pings),
// read from the server this backend's session is connected to. It needs mntr in
// the server's 4lw.commands.whitelist and a plain (not TLS-only) client port, and
// works only on a standalone server: in an ensemble, other clients' requests reach
// other members and one member's count would not be the total. Each call is itself
// one packet (bench.OpsOverhead measures that).
func (b *Backend) ServerOps(ctx context.Context) (int64, error) {
	addr := b.conn.Server()
	if addr == "" {
		return 0, fmt.Errorf("zklock: server ops: not connected")
	}
	out, err := fourLetter(ctx, addr, "mntr")
	if err != nil {
		return 0, fmt.Errorf("zklock: server ops from %s: %w", addr, err)
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
			total, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("zklock: server ops: mntr zk_packets_received %q", v)
			}
		case "zk_server_state":
			state = strings.TrimSpace(v)
		}
	}
	if total < 0 {
		return 0, fmt.Errorf("zklock: server ops: mntr answered without zk_packets_received (is mntr in 4lw.commands.whitelist?): %q", firstLine(out))
	}
	if state != "standalone" {
		return 0, fmt.Errorf("%w: zklock: server ops are counted on a standalone server only (this one is %q)", driver.ErrUnsupported, state)
	}
	return total, nil
}

func fourLetter(ctx context.Context, addr, cmd string) (string, error) {
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

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
