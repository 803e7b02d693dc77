package drivertest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
)

// A place is one lock: a key in a namespace.
type place struct{ ns, key string }

// namespacePairs returns pairs of places that are different locks, though each pair
// spells the same server name, or one spells the start of the other's, under some
// naive layout: namespace and key joined by a separator that the namespace or the
// key may contain as well. Each names the layout it would defeat. base is a plain
// namespace (lower-case letters and digits) unique to the run.
func namespacePairs(base string) [][2]place {
	return [][2]place{
		// prefix/key/member (etcd before 0x1f ended a lock's range): lock "jobs"
		// under base read the members of every lock under base/jobs.
		{{base, "jobs"}, {base + "/jobs", "nightly"}},
		{{base, "x/y"}, {base + "/x", "y"}},
		// prefix:lock:key (Redis, Redlock before 0x1f): one key for both.
		{{base, "x:lock:y"}, {base + ":lock:x", "y"}},
		// prefix:lock:key and prefix:queue:key: the lock of one was the queue of
		// the other (a wrong-type error once the second one queues).
		{{base + ":queue", "z"}, {base, "lock:z"}},
		// root/k-key (ZooKeeper): the lock node of one is the root of the other.
		{{base, "x"}, {base + "/k-x", "y"}},
		// table and table_token_seq, table_pkey (PostgreSQL): one relation name.
		{{base, "x"}, {base + "_token_seq", "x"}},
		{{base, "x"}, {base + "_pkey", "x"}},
		// A separator every backend accepts in a namespace.
		{{base, "x_y"}, {base + "_x", "y"}},
	}
}

// testNamespaces checks that two namespaces on one server are apart: for each pair of
// places above, in both directions, a holder and a queued waiter of one place are
// invisible to the other (Inspect says not held, ForceRelease finds nothing and
// leaves the holder's lease alive, TryLock is granted), and releasing one leaves
// the other held. A backend may refuse a namespace (an error matching ErrInvalid
// from Harness.Namespace): then that pair cannot meet.
func (h Harness) testNamespaces(t *testing.T) {
	if h.Namespace == nil {
		t.Skip("the backend has no namespaces on one server")
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	base := "ns" + hex.EncodeToString(r[:])
	backends := map[string]driver.Backend{}
	refused := map[string]error{}
	open := func(t *testing.T, ns string) driver.Backend {
		t.Helper()
		if b := backends[ns]; b != nil {
			return b
		}
		if err := refused[ns]; err != nil {
			t.Skipf("namespace %q refused: %v", ns, err)
		}
		b, err := h.Namespace(t, ns)
		if errors.Is(err, driver.ErrInvalid) {
			refused[ns] = err
			t.Skipf("namespace %q refused: %v", ns, err)
		}
		if err != nil {
			t.Fatalf("open namespace %q: %v", ns, err)
		}
		backends[ns] = b
		return b
	}
	t.Cleanup(func() {
		for ns, b := range backends {
			if err := b.Close(); err != nil {
				t.Errorf("Close (namespace %q): %v", ns, err)
			}
		}
	})
	ran := 0
	for _, pair := range namespacePairs(base) {
		for _, d := range [][2]place{{pair[0], pair[1]}, {pair[1], pair[0]}} {
			name := strings.ReplaceAll(d[0].ns+"."+d[0].key+"|"+d[1].ns+"."+d[1].key, base, "N")
			t.Run(name, func(t *testing.T) {
				// Open both first, in this order, as two programs would start.
				other, probe := open(t, d[1].ns), open(t, d[0].ns)
				h.checkApart(t, probe, d[0], other, d[1])
				ran++
			})
		}
	}
	if ran == 0 {
		t.Fatalf("no pair of namespaces could be opened")
	}
}

// checkApart checks, with a holder and a queued waiter at place o on backend other,
// that place p on backend probe is free and stays apart.
func (h Harness) checkApart(t *testing.T, probe driver.Backend, p place, other driver.Backend, o place) {
	ctx := ctxT(t)
	const ttl = 30 * time.Second
	if _, err := other.Acquire(ctx, driver.Request{Key: o.key, Owner: "bob", TTL: ttl}); err != nil {
		t.Fatalf("Acquire %v: %v", o, err)
	}
	defer func() { _ = other.Release(ctx, o.key, "bob") }()
	if n, ok := other.(driver.Notifier); ok {
		w, err := n.Watch(ctx, o.key, "carol")
		if err != nil {
			t.Fatalf("Watch %v: %v", o, err)
		}
		defer func() { _ = w.Stop(ctx, false) }()
		_, err = other.Acquire(ctx, driver.Request{Key: o.key, Owner: "carol", TTL: ttl, Wait: true, Patience: ttl})
		if !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("queued Acquire %v: %v, want ErrLocked", o, err)
		}
	}
	alive := func(when string) {
		t.Helper()
		if err := other.Refresh(ctx, o.key, "bob", ttl); err != nil {
			t.Fatalf("%s: Refresh %v = %v: the holder's lease is gone", when, o, err)
		}
	}

	if in, ok := probe.(driver.Inspector); ok {
		if info, err := in.Inspect(ctx, p.key); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Inspect %v = %+v, %v; want ErrNotHeld (the holder of %v shows through)", p, info, err, o)
		}
	}
	if fr, ok := probe.(driver.ForceReleaser); ok {
		if err := fr.ForceRelease(ctx, p.key); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("ForceRelease %v = %v, want ErrNotHeld", p, err)
		}
		alive("after ForceRelease " + p.String())
	}
	if _, err := probe.Acquire(ctx, driver.Request{Key: p.key, Owner: "alice", TTL: ttl}); err != nil {
		t.Fatalf("Acquire %v with %v held: %v", p, o, err)
	}
	if in, ok := probe.(driver.Inspector); ok {
		info, err := in.Inspect(ctx, p.key)
		if err != nil || info.Owner != "alice" || info.Waiters > 0 {
			t.Fatalf("Inspect %v = %+v, %v; want alice and no waiters", p, info, err)
		}
	}
	if in, ok := other.(driver.Inspector); ok {
		if info, err := in.Inspect(ctx, o.key); err != nil || info.Owner != "bob" {
			t.Fatalf("Inspect %v = %+v, %v; want bob", o, info, err)
		}
	}
	alive("with " + p.String() + " held")
	if err := probe.Release(ctx, p.key, "alice"); err != nil {
		t.Fatalf("Release %v: %v", p, err)
	}
	alive("after Release " + p.String())
	if fr, ok := probe.(driver.ForceReleaser); ok {
		if err := fr.ForceRelease(ctx, p.key); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("ForceRelease %v after its release = %v, want ErrNotHeld", p, err)
		}
		alive("after a second ForceRelease " + p.String())
	}
}

func (p place) String() string { return "(" + p.ns + ", " + p.key + ")" }
