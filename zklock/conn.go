package zklock

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// sniffConn wraps the connection the ZooKeeper client library reads from and
// decodes the first frame the server sends on it: the connect response, which holds
// the session id and the session timeout the server actually granted. The library
// keeps both to itself; the backend needs them to know which session its nodes
// belong to and how long that session is guaranteed to live.
type sniffConn struct {
	net.Conn
	onConnect func(sessionID int64, timeout time.Duration)

	mu   sync.Mutex
	head []byte // first bytes of the stream until the connect response is decoded
	done bool
}

// connectResponse layout: int32 frame length, int32 protocol version, int32 timeout
// in milliseconds, int64 session id, then the session password.
const connectHeadLen = 4 + 4 + 4 + 8

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if !c.done {
			need := connectHeadLen - len(c.head)
			c.head = append(c.head, p[:min(n, need)]...)
			if len(c.head) == connectHeadLen {
				c.done = true
				timeout := time.Duration(int32(binary.BigEndian.Uint32(c.head[8:12]))) * time.Millisecond
				sid := int64(binary.BigEndian.Uint64(c.head[12:20]))
				c.head = nil
				c.mu.Unlock()
				c.onConnect(sid, timeout)
				return n, err
			}
		}
		c.mu.Unlock()
	}
	return n, err
}

// dialer returns the function the client library dials servers with: TCP, then TLS
// when configured, wrapped so the connect response is observed. Failures are
// reported to onErr so that a connection that never comes up can say why.
func dialer(tlsConfig *tls.Config, onConnect func(int64, time.Duration), onErr func(error)) func(network, address string, timeout time.Duration) (net.Conn, error) {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		d := net.Dialer{Timeout: timeout}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			onErr(err)
			return nil, err
		}
		if tlsConfig != nil {
			cfg := tlsConfig.Clone()
			if cfg.ServerName == "" {
				host, _, _ := net.SplitHostPort(address)
				cfg.ServerName = host
			}
			tc := tls.Client(c, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				err = fmt.Errorf("TLS handshake with %s: %w", address, err)
				onErr(err)
				return nil, err
			}
			c = tc
		}
		return &sniffConn{Conn: c, onConnect: onConnect}, nil
	}
}

// zkLogger sends the client library's messages to slog at Debug level (the library
// otherwise prints to standard output).
type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, a ...any) {
	if z.l.Enabled(context.Background(), slog.LevelDebug) {
		z.l.Debug("zklock: zookeeper client: " + fmt.Sprintf(format, a...))
	}
}
