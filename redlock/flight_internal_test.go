package redlock

import (
	"context"
	"errors"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/callers"
	"github.com/dlockio/dlock/internal/testserver"
)

// An acquire waits, node by node, for its own holder's calls still under way and
// for the releases of the key's other holders through this client, and for
// nothing else; a call about the key with no owner waits for every holder's.
func TestFlightsOf(t *testing.T) {
	b := &Backend{flights: map[driver.Holder]*flight{}}
	own, rel, acq, other := &flight{}, &flight{release: true}, &flight{}, &flight{release: true}
	b.flights[driver.Holder{Key: "k", Owner: "b"}] = own
	b.flights[driver.Holder{Key: "k", Owner: "a"}] = rel
	b.flights[driver.Holder{Key: "k", Owner: "c"}] = acq
	b.flights[driver.Holder{Key: "k2", Owner: "d"}] = other
	for _, c := range []struct {
		h        driver.Holder
		releases bool
		want     []*flight
	}{
		{driver.Holder{Key: "k", Owner: "b"}, false, []*flight{own}},
		{driver.Holder{Key: "k", Owner: "b"}, true, []*flight{own, rel}},
		{driver.Holder{Key: "k", Owner: "e"}, true, []*flight{rel}},
		{driver.Holder{Key: "k"}, false, []*flight{own, rel, acq}},
		{driver.Holder{Key: "k2", Owner: "b"}, true, []*flight{other}},
	} {
		got := b.flightsOf(c.h, c.releases)
		if len(got) != len(c.want) {
			t.Errorf("flightsOf(%v, %v) = %d flights, want %d", c.h, c.releases, len(got), len(c.want))
			continue
		}
		for _, f := range c.want {
			if !slices.Contains(got, f) {
				t.Errorf("flightsOf(%v, %v) misses a flight", c.h, c.releases)
			}
		}
	}
}

// On real nodes: while another holder's release through this client is still
// under way on every node, an acquire sends nothing (it would find the key held
// on the nodes the release has not reached yet); once the release's calls are
// over, it is granted. Another holder's acquire still under way holds nothing up.
func TestAcquireAfterRelease(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	u, err := url.Parse(testserver.RedlockURL(nodes, "node_timeout=250ms"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pending := func(release bool) *flight {
		f := &flight{done: make([]chan struct{}, len(b.nodes)), release: release}
		for i := range f.done {
			f.done[i] = make(chan struct{})
		}
		return f
	}
	req := driver.Request{Key: "k", Owner: "b", TTL: time.Minute}

	b.mu.Lock()
	b.flights[driver.Holder{Key: "k", Owner: "c"}] = pending(false)
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatalf("acquire beside another holder's acquire under way: %v", err)
	}
	if err := b.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}

	rel := pending(true)
	b.mu.Lock()
	b.flights[driver.Holder{Key: "k", Owner: "a"}] = rel
	b.mu.Unlock()
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if _, err := b.Acquire(short, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire while another holder's release is under way = %v, want DeadlineExceeded (nothing sent)", err)
	}
	for _, d := range rel.done {
		close(d)
	}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatalf("acquire once the release is over: %v", err)
	}
	if err := b.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
}

// A fan-out's node calls run on goroutines kept between calls (internal/callers):
// a later fan-out's call runs on the goroutine of an earlier one, whose stack has
// grown already; Close ends the idle ones and waits for them (TestMain's goleak
// check fails otherwise), and a fan-out after Close still runs its calls.
func TestCallersKept(t *testing.T) {
	b := &Backend{callers: callers.New(), closing: make(chan struct{}),
		nodes: []*node{{idx: 0}, {idx: 1}}, cfg: config{nodeTimeout: time.Second}}
	goid := func() string {
		buf := make([]byte, 64)
		return strings.Fields(string(buf[:runtime.Stack(buf, false)]))[1] // "goroutine N [running]:"
	}
	// Node 0's call runs on a kept goroutine; the last node's on the caller's.
	onNode0 := func() string {
		r := fanout(context.Background(), b, []int{0, 1}, func(_ context.Context, n *node) (string, error) {
			return goid(), nil
		})
		if r.vals[0] == r.vals[1] {
			t.Fatalf("both of a fan-out's calls ran on goroutine %s", r.vals[0])
		}
		return r.vals[0]
	}
	first := onNode0()
	reused := false
	for range 100 {
		if onNode0() == first {
			reused = true
			break
		}
		time.Sleep(time.Millisecond) // the first call's goroutine may not be waiting yet
	}
	if !reused {
		t.Errorf("100 later fan-outs ran node 0's call on other goroutines than the first's (%s)", first)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if id := onNode0(); id == first {
		t.Errorf("a call after Close ran on a kept goroutine (%s)", id)
	}
}
