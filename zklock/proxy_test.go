package zklock_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy is a loopback TCP proxy in front of one ZooKeeper server that understands
// just enough of the protocol to inject faults: cut every connection (a network
// blip), refuse connections (a partition), or drop the reply to a create and cut the
// connection right after the server applied it (a lost reply). It also remembers the
// last session id and password the server handed out, so a test can take the
// session over and close it from outside.
type proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu         sync.Mutex
	pairs      map[*pair]bool
	refuse     bool
	cutCreate  string // cut after the reply to a create whose path contains this
	armed      string // the last substring given
	thenRefuse bool   // and partition once it is cut
	cuts       int    // lost replies staged so far
	accepted   int
	requests   int // client frames after the connect request, pings not counted
	sessionID  int64
	passwd     []byte
	wg         sync.WaitGroup
	closed     bool
}

type pair struct {
	client, server net.Conn
	once           sync.Once
}

func (p *pair) close() {
	p.once.Do(func() {
		p.client.Close()
		p.server.Close()
	})
}

func newProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, target: target, pairs: make(map[*pair]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for pr := range p.pairs {
		pr.close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// Cut closes every open connection; new ones are accepted as usual.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		pr.close()
	}
}

// Partition cuts every connection and refuses new ones until Heal.
func (p *proxy) Partition() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	p.Cut()
}

// Heal ends a partition.
func (p *proxy) Heal() {
	p.mu.Lock()
	p.refuse = false
	p.mu.Unlock()
}

// LoseNextCreateReply makes the proxy forward the next create whose path contains
// substr, wait for the server's reply, drop it, and cut the connection; with
// thenPartition, it also refuses connections from then on, until Heal.
func (p *proxy) LoseNextCreateReply(substr string, thenPartition bool) {
	p.mu.Lock()
	p.cutCreate, p.armed, p.thenRefuse = substr, substr, thenPartition
	p.mu.Unlock()
}

// Lost reports how many create replies were dropped.
func (p *proxy) Lost() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Session returns the last session id and password the server handed out.
func (p *proxy) Session() (int64, []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sessionID, p.passwd
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		if p.refuse || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.pairs[pr] = true
		p.wg.Add(2)
		p.mu.Unlock()
		drop := make(chan int32, 1) // xid whose reply is to be dropped
		go p.upstream(pr, drop)
		go p.downstream(pr, drop)
	}
}

func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 16<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	b := make([]byte, 4+n)
	copy(b, hdr[:])
	_, err := io.ReadFull(r, b[4:])
	return b, err
}

func (p *proxy) forget(pr *pair) {
	pr.close()
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// upstream copies client frames to the server, spotting the create to sabotage.
func (p *proxy) upstream(pr *pair, drop chan<- int32) {
	defer p.wg.Done()
	defer p.forget(pr)
	first := true
	for {
		f, err := readFrame(pr.client)
		if err != nil {
			return
		}
		if !first && len(f) >= 12 && int32(binary.BigEndian.Uint32(f[8:12])) == 1 { // opCreate
			xid := int32(binary.BigEndian.Uint32(f[4:8]))
			path := ""
			if len(f) >= 16 {
				l := int(binary.BigEndian.Uint32(f[12:16]))
				if 16+l <= len(f) {
					path = string(f[16 : 16+l])
				}
			}
			p.mu.Lock()
			if p.cutCreate != "" && strings.Contains(path, p.cutCreate) {
				p.cutCreate = ""
				drop <- xid
			}
			p.mu.Unlock()
		}
		if !first && len(f) >= 12 && int32(binary.BigEndian.Uint32(f[8:12])) != 11 { // not opPing
			p.mu.Lock()
			p.requests++
			p.mu.Unlock()
		}
		first = false
		if _, err := pr.server.Write(f); err != nil {
			return
		}
	}
}

// downstream copies server frames to the client, noting the session and dropping the
// sabotaged reply.
func (p *proxy) downstream(pr *pair, drop <-chan int32) {
	defer p.wg.Done()
	defer p.forget(pr)
	first := true
	dropXid := int32(-100)
	for {
		f, err := readFrame(pr.server)
		if err != nil {
			return
		}
		if first && len(f) >= 24 {
			p.mu.Lock()
			p.sessionID = int64(binary.BigEndian.Uint64(f[12:20]))
			l := int(binary.BigEndian.Uint32(f[20:24]))
			if 24+l <= len(f) {
				p.passwd = bytes.Clone(f[24 : 24+l])
			}
			p.mu.Unlock()
		}
		first = false
		select {
		case x := <-drop:
			dropXid = x
		default:
		}
		if len(f) >= 20 && int32(binary.BigEndian.Uint32(f[4:8])) == dropXid {
			if binary.BigEndian.Uint32(f[16:20]) != 0 {
				// The create failed (no parent yet, say): nothing to lose. Wait for
				// the next one.
				p.mu.Lock()
				p.cutCreate = p.armed
				p.mu.Unlock()
				dropXid = -100
				if _, err := pr.client.Write(f); err != nil {
					return
				}
				continue
			}
			// The server applied the create; the client never hears of it.
			p.mu.Lock()
			p.cuts++
			if p.thenRefuse {
				p.refuse = true
				p.thenRefuse = false
			}
			p.mu.Unlock()
			return
		}
		if _, err := pr.client.Write(f); err != nil {
			return
		}
	}
}

// closeSessionFromOutside attaches to a session with its id and password, as another
// client would after a network change, and closes it: the ensemble ends the session
// and deletes its ephemeral nodes, and the original client learns on reconnection
// that its session expired.
func closeSessionFromOutside(server string, sid int64, passwd []byte) error {
	c, err := net.DialTimeout("tcp", server, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var body bytes.Buffer
	w := func(v any) { _ = binary.Write(&body, binary.BigEndian, v) }
	w(int32(0))     // protocol version
	w(int64(0))     // last zxid seen
	w(int32(10000)) // timeout
	w(sid)
	w(int32(len(passwd)))
	body.Write(passwd)
	frame := binary.BigEndian.AppendUint32(nil, uint32(body.Len()))
	if _, err := c.Write(append(frame, body.Bytes()...)); err != nil {
		return err
	}
	resp, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("connect response: %w", err)
	}
	if len(resp) < 20 || int64(binary.BigEndian.Uint64(resp[12:20])) != sid {
		return errors.New("the server did not attach the session")
	}
	closeReq := []byte{0, 0, 0, 8, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xf5} // xid 1, opCloseSession (-11)
	if _, err := c.Write(closeReq); err != nil {
		return err
	}
	if _, err := readFrame(c); err != nil {
		return fmt.Errorf("close response: %w", err)
	}
	return nil
}

// Accepted reports how many connections the proxy has accepted.
// Requests returns how many requests clients sent through the proxy, pings and
// connect requests not counted.
func (p *proxy) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

func (p *proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}
