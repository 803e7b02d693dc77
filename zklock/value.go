package zklock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// A contender's node data is a header line, then, when the grant has a value, a
// newline and the value's bytes:
//
//	30000                     the TTL in milliseconds (all that older versions write)
//	30000\n10.0.0.7:8080      with a value
//	30000 1767225600000\n...  after SetValue: the TTL counts from that server time
//
// The header is the TTL in decimal milliseconds, optionally followed by a space and
// the server time (Unix milliseconds) from which the TTL counts, when that is not the
// node's mtime: SetValue writes the node without renewing the grant, so it keeps the
// start of the TTL. A renewal writes the TTL alone again. Further space-separated
// header fields are ignored, for later versions. A node without a value is written
// exactly as older versions wrote it, so they read it; an older version reads a
// node with a value as one whose TTL it does not know.
//
//	30000 0 h                 a semaphore's holder: a permit is held
//
// The third header field, "h", marks the node of a semaphore holder (a limit above
// 1; a base of 0 stands for the mtime). The holder writes it when granted with
// contenders behind it, and every later write of the node keeps it: the waiter
// behind a queued place watches that place's data, and the mark tells it, even when
// it reads the node after the write, that the place took a permit and it is now
// first in line (see queue).

// encodeData returns a node's data; held is only ever set for a semaphore's node.
func encodeData(ttl time.Duration, base int64, held bool, value []byte) []byte {
	n := 20
	if base > 0 || held {
		n += 21
	}
	if held {
		n += 2
	}
	if len(value) > 0 {
		n += 1 + len(value)
	}
	data := strconv.AppendInt(make([]byte, 0, n), ttl.Milliseconds(), 10)
	if base > 0 || held {
		data = append(data, ' ')
		data = strconv.AppendInt(data, base, 10)
	}
	if held {
		data = append(data, " h"...)
	}
	if len(value) > 0 {
		data = append(data, '\n')
		data = append(data, value...)
	}
	return data
}

// nodeData is a decoded node's data.
type nodeData struct {
	ttl   time.Duration // 0 when unknown
	base  int64         // server time the TTL counts from (Unix ms), 0 for the mtime
	value []byte        // nil for none
	held  bool          // a semaphore's node that holds a permit
}

// decodeData parses a node's data, of this version or an older one. What it cannot
// parse leaves the TTL unknown; the value is read whatever the header says.
func decodeData(data []byte) nodeData {
	var d nodeData
	header := data
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		header = data[:i]
		if v := data[i+1:]; len(v) > 0 {
			d.value = v
		}
	}
	fields := bytes.Fields(header)
	if len(fields) == 0 {
		return d
	}
	if ms, err := strconv.ParseInt(string(fields[0]), 10, 64); err == nil && ms > 0 && ms <= math.MaxInt64/int64(time.Millisecond) {
		d.ttl = time.Duration(ms) * time.Millisecond
	}
	if len(fields) > 1 {
		if b, err := strconv.ParseInt(string(fields[1]), 10, 64); err == nil && b > 0 {
			d.base = b
		}
	}
	d.held = len(fields) > 2 && string(fields[2]) == "h"
	return d
}

// ttlLeft estimates the time left of a grant whose node has data d and stat st:
// its TTL counted from its last renewal (on the server's clock), at least 1ms and
// at most the TTL; 0 when the TTL is unknown.
func (d nodeData) ttlLeft(st *zk.Stat) time.Duration {
	if d.ttl <= 0 {
		return 0
	}
	from := st.Mtime
	if d.base > 0 {
		from = d.base
	}
	return min(max(time.Until(time.UnixMilli(from).Add(d.ttl)), time.Millisecond), d.ttl)
}

// SetValue implements driver.Valuer. It reads the data of the owner's node, which
// must be a holder's (one of the lowest contenders, as many as the key admits: no
// contender can be created below an existing one, so the node is a holder's for as
// long as it exists), and writes
// it back with the new value on the condition that its version has not changed: a
// concurrent write (a renewal, another SetValue) makes it read and try again, and a
// deleted node (a release, a force release, the session's expiry) makes it fail
// with driver.ErrNotHeld. The TTL is kept, with its start (see the data format
// above), so the grant is not renewed. Two requests: the read and the write; a
// grant of another connection of the same owner id costs one more, the listing
// that finds its node.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if e := b.lookup(key, owner); e != nil {
		e.op.Lock()
		b.mu.Lock()
		local, p := !e.dead && e.granted, e.path
		b.mu.Unlock()
		if local {
			defer e.op.Unlock()
			err := b.setValue(ctx, key, owner, p, value, e)
			if errors.Is(err, driver.ErrNotHeld) {
				b.mu.Lock()
				b.dropLocked(e, false)
				b.mu.Unlock()
			}
			return err
		}
		e.op.Unlock()
	}
	// Not held here: the owner may hold the key through another connection.
	parent := b.LockPath(key)
	var names []string
	err := b.call(ctx, func() error {
		var err error
		names, _, err = b.conn.Children(parent)
		return err
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return wrap("set value", key, err)
	}
	q := queue(names)
	for _, c := range q[:holding(q)] {
		if c.owner == owner {
			return b.setValue(ctx, key, owner, parent+"/"+c.name, value, nil)
		}
	}
	return notHeld(key, owner)
}

func notHeld(key, owner string) error {
	return fmt.Errorf("%w: zklock: %q is not held by %q", driver.ErrNotHeld, key, owner)
}

// setValue writes value into the holder's node p, keeping its TTL, and notes it in
// e (this backend's entry for the node) if not nil. Called with e.op held.
func (b *Backend) setValue(ctx context.Context, key, owner, p string, value []byte, e *entry) error {
	for range 5 {
		var data []byte
		var st *zk.Stat
		err := b.call(ctx, func() error {
			var err error
			data, st, err = b.conn.Get(p)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return notHeld(key, owner)
		}
		if err != nil {
			return wrap("set value", key, err)
		}
		d := decodeData(data)
		base := d.base
		if base == 0 {
			base = st.Mtime
		}
		var nst *zk.Stat
		err = b.call(ctx, func() error {
			var err error
			nst, err = b.conn.Set(p, encodeData(d.ttl, base, d.held, value), st.Version)
			return err
		})
		switch {
		case errors.Is(err, zk.ErrBadVersion):
			continue // written meanwhile (a renewal): read it again
		case errors.Is(err, zk.ErrNoNode):
			return notHeld(key, owner)
		case err != nil:
			return wrap("set value", key, err)
		}
		if e != nil {
			b.mu.Lock()
			e.value, e.valueKnown, e.version = slices.Clone(value), true, nst.Version
			b.mu.Unlock()
		}
		return nil
	}
	return wrap("set value", key, errors.New("the node kept changing"))
}

// storeValue makes the data of e's node p carry req.Value when it may not (the node
// was adopted, or made by an attempt with another value), and always when req
// re-enters a grant (driver.Request.Reenter: the re-entering attempt's value
// replaces the stored one, also one another connection set). It writes the TTL too,
// as a renewal would. again means the node is gone and the attempt should start
// over. An attempt whose node carries its value already (every first attempt, and
// every later one of the same lock call) sends nothing. With mark set (a
// semaphore's grant with contenders behind it), the data carries the holding mark,
// and is written if it does not yet.
func (b *Backend) storeValue(ctx context.Context, e *entry, req driver.Request, p string, reenter, mark bool) (again bool, err error) {
	b.mu.Lock()
	need := reenter || !e.valueKnown || !bytes.Equal(e.value, req.Value) || mark && !e.marked
	held := mark || e.marked
	b.mu.Unlock()
	if !need {
		return false, nil
	}
	var st *zk.Stat
	sess, sent := b.currentSession(), time.Now()
	err = b.call(ctx, func() error {
		var err error
		st, err = b.conn.Set(p, encodeData(req.TTL, 0, held, req.Value), -1)
		return err
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if errors.Is(err, zk.ErrNoNode) || e.dead {
		b.dropLocked(e, false)
		return true, nil
	}
	if err != nil {
		return false, wrap("acquire", req.Key, err)
	}
	if sess == b.session && sent.After(b.heard) {
		b.heard = sent
	}
	e.value, e.valueKnown, e.version, e.marked = slices.Clone(req.Value), true, st.Version, held
	return false, nil
}
