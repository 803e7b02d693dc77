package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

// Store is the default resource of a check run (ResourceStore): a tiny server
// that worker processes write to from their critical sections, over TCP on
// 127.0.0.1, one line per write:
//
//	W <process> <lease> <token> <key>\n   ->   A <max>\n (accepted) or R <max>\n (rejected)
//
// where max is the highest token accepted for the key before this write. With
// fencing, the store accepts a write only if its token is at least the highest it
// has accepted for that key (equal tokens are the same holder writing again);
// without fencing it accepts every write. Either way it logs every decision, which
// is how the checker counts writes that fencing would have refused (P3).
type Store struct {
	fenced bool
	ln     net.Listener

	mu     sync.Mutex
	max    map[string]uint64
	writes []history.StoreWrite
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup
}

// StartStore listens on a free 127.0.0.1 port and serves until Close.
func StartStore(fenced bool) (*Store, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("check: store: %w", err)
	}
	s := &Store{fenced: fenced, ln: ln, max: map[string]uint64{}, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr returns host:port of the store.
func (s *Store) Addr() string { return s.ln.Addr().String() }

func (s *Store) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *Store) serve(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		reply, err := s.handle(strings.TrimSuffix(line, "\n"))
		if err != nil {
			reply = "E " + err.Error()
		}
		if _, err := c.Write([]byte(reply + "\n")); err != nil {
			return
		}
	}
}

// handle decides one write line.
func (s *Store) handle(line string) (string, error) {
	f := strings.SplitN(line, " ", 5)
	if len(f) != 5 || f[0] != "W" {
		return "", errors.New("want: W <process> <lease> <token> <key>")
	}
	p, err1 := strconv.Atoi(f[1])
	l, err2 := strconv.Atoi(f[2])
	tok, err3 := strconv.ParseUint(f[3], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || f[4] == "" {
		return "", fmt.Errorf("bad write %q", line)
	}
	key := f[4]
	s.mu.Lock()
	defer s.mu.Unlock()
	w := history.StoreWrite{Process: p, Key: key, Lease: l, Token: tok, Max: s.max[key]}
	w.Accepted = !s.fenced || tok >= w.Max
	if w.Accepted && tok > w.Max {
		s.max[key] = tok
	}
	w.Time = history.Now()
	s.writes = append(s.writes, w)
	if w.Accepted {
		return "A " + strconv.FormatUint(w.Max, 10), nil
	}
	return "R " + strconv.FormatUint(w.Max, 10), nil
}

// Writes returns a copy of the log of decisions so far.
func (s *Store) Writes() []history.StoreWrite {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]history.StoreWrite(nil), s.writes...)
}

// Close stops the store and waits for its goroutines.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// storeClient is a worker's connection to the store.
type storeClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialStore(addr string) (*storeClient, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("check: store: %w", err)
	}
	return &storeClient{c: c, r: bufio.NewReader(c)}, nil
}

// write sends one write and reports whether the store accepted it.
func (sc *storeClient) write(_ context.Context, w loggedWrite) (bool, string, error) {
	if _, err := fmt.Fprintf(sc.c, "W %d %d %d %s\n", w.Process, w.Lease, w.Token, w.Key); err != nil {
		return false, "", fmt.Errorf("check: store: %w", err)
	}
	line, err := sc.r.ReadString('\n')
	if err != nil {
		return false, "", fmt.Errorf("check: store: %w", err)
	}
	switch {
	case strings.HasPrefix(line, "A "):
		return true, "", nil
	case strings.HasPrefix(line, "R "):
		return false, "max " + strings.TrimSpace(line[2:]), nil
	}
	return false, "", fmt.Errorf("check: store: %s", strings.TrimSpace(line))
}

func (sc *storeClient) Close() error { return sc.c.Close() }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}
