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

// wireHooks observe the ZooKeeper protocol below the client library, which keeps to
// itself what the backend needs: the session id and timeout the server granted (in
// the connect response), and the zxid of the transaction that created a node (in the
// create reply's header), which is the node's czxid, the fencing token. Knowing it
// from the reply saves a round trip per grant.
type wireHooks struct {
	connect func(sessionID int64, timeout time.Duration)
	// wrote is called for every create request written, with its xid and path.
	wrote func(xid int32, path string)
	// replied is called for every reply, with its xid, zxid and error code.
	replied func(xid int32, zxid int64, code int32)
	// dialed, if set, is called with every connection made (below the sniffer).
	dialed func(net.Conn)
}

// sniffConn wraps a connection to a server. The library writes one whole frame per
// Write call; replies are parsed from the read stream however it is chunked.
type sniffConn struct {
	net.Conn
	hooks *wireHooks

	wmu     sync.Mutex
	wrFirst bool // the connect request has been written

	rmu     sync.Mutex
	rdFirst bool   // the connect response has been decoded
	head    []byte // first bytes of the current frame
	left    int    // bytes of the current frame still to skip, after its head
}

// Frame heads: a reply is int32 length, int32 xid, int64 zxid, int32 error code; the
// connect response is int32 length, int32 protocol version, int32 timeout in
// milliseconds, int64 session id. Both fit in 20 bytes.
const headLen = 20

const opCreate, opCreate2 = 1, 15

func (c *sniffConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	first := !c.wrFirst
	c.wrFirst = true
	c.wmu.Unlock()
	if !first && len(p) >= 16 && int(binary.BigEndian.Uint32(p[:4])) == len(p)-4 {
		if op := int32(binary.BigEndian.Uint32(p[8:12])); op == opCreate || op == opCreate2 {
			if l := int(binary.BigEndian.Uint32(p[12:16])); l >= 0 && 16+l <= len(p) {
				c.hooks.wrote(int32(binary.BigEndian.Uint32(p[4:8])), string(p[16:16+l]))
			}
		}
	}
	return c.Conn.Write(p)
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.parse(p[:n])
	}
	return n, err
}

func (c *sniffConn) parse(data []byte) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(data) > 0 {
		if c.left > 0 {
			skip := min(c.left, len(data))
			c.left -= skip
			data = data[skip:]
			continue
		}
		if len(c.head) < 4 {
			take := min(4-len(c.head), len(data))
			c.head = append(c.head, data[:take]...)
			data = data[take:]
			continue
		}
		total := 4 + int(binary.BigEndian.Uint32(c.head[:4]))
		want := min(headLen, total)
		take := min(want-len(c.head), len(data))
		c.head = append(c.head, data[:take]...)
		data = data[take:]
		if len(c.head) < want {
			continue
		}
		c.left = total - want
		if want == headLen {
			c.frame(c.head)
		}
		c.head = c.head[:0]
	}
}

// frame handles the head of one frame from the server.
func (c *sniffConn) frame(h []byte) {
	if !c.rdFirst {
		c.rdFirst = true
		timeout := time.Duration(int32(binary.BigEndian.Uint32(h[8:12]))) * time.Millisecond
		c.hooks.connect(int64(binary.BigEndian.Uint64(h[12:20])), timeout)
		return
	}
	c.hooks.replied(int32(binary.BigEndian.Uint32(h[4:8])), int64(binary.BigEndian.Uint64(h[8:16])), int32(binary.BigEndian.Uint32(h[16:20])))
}

// dialer returns the function the client library dials servers with: TCP, then TLS
// when configured, wrapped so the protocol is observed. Failures are reported to
// onErr so that a connection that never comes up can say why.
func dialer(tlsConfig *tls.Config, hooks *wireHooks, onErr func(error)) func(network, address string, timeout time.Duration) (net.Conn, error) {
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
		if hooks.dialed != nil {
			hooks.dialed(c)
		}
		return &sniffConn{Conn: c, hooks: hooks}, nil
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

// createWait follows one create request on the wire.
type createWait struct {
	written chan struct{} // closed when the request has been written
	wrote   bool
	zxid    int64 // of the successful reply: the node's czxid
}

func (b *Backend) expectCreate(p string) *createWait {
	cw := &createWait{written: make(chan struct{})}
	b.cmu.Lock()
	b.creates[p] = cw
	b.cmu.Unlock()
	return cw
}

func (b *Backend) forgetCreate(p string) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	cw := b.creates[p]
	delete(b.creates, p)
	for x, c := range b.createXid {
		if c == cw {
			delete(b.createXid, x)
		}
	}
}

func (b *Backend) createZxid(cw *createWait) int64 {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	return cw.zxid
}

// onCreateWritten is called by the connection wrapper for every create request.
func (b *Backend) onCreateWritten(xid int32, p string) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	cw := b.creates[p]
	if cw == nil {
		return
	}
	b.createXid[xid] = cw
	if !cw.wrote {
		cw.wrote = true
		close(cw.written)
	}
}

// onReply is called by the connection wrapper for every reply.
func (b *Backend) onReply(xid int32, zxid int64, code int32) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	if len(b.createXid) == 0 {
		return
	}
	if cw := b.createXid[xid]; cw != nil {
		delete(b.createXid, xid)
		if code == 0 {
			cw.zxid = zxid
		}
	}
}
