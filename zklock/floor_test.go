package zklock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// TestFloorAndServerOps checks the benchmark hooks: the floor cycle leaves nothing
// behind and can run again on the same key, and the server's packet count rises by
// the floor's two requests (plus the count's own mntr request).
func TestFloorAndServerOps(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	b := open(t, srv.URL("/bench"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		if err := b.FloorCycle(ctx, "a/b c"); err != nil {
			t.Fatal(err)
		}
	}
	kids, _, err := rawConn(t, srv.Addr()).Children("/bench/floor")
	if err != nil || len(kids) != 0 {
		t.Fatalf("floor nodes left: %v, %v", kids, err)
	}
	// A ping may slip in between; the smallest of a few differences is exact.
	best := int64(-1)
	for range 5 {
		before, err := b.ServerOps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.FloorCycle(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		after, err := b.ServerOps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := after - before; best < 0 || d < best {
			best = d
		}
	}
	if best != 3 {
		t.Errorf("a floor cycle and one mntr: %d packets, want 3 (create, delete, mntr)", best)
	}
	var oc driver.OpsCounter = b
	if _, err := oc.ServerOps(ctx); err != nil {
		t.Fatal(err)
	}
}

// Without mntr in the four-letter-word whitelist, ServerOps fails (and a benchmark
// falls back to counting driver calls).
func TestServerOpsDisabled(t *testing.T) {
	srv := testserver.StartZooKeeper(t, "4lw.commands.whitelist=srvr")
	b := open(t, srv.URL("/bench"))
	defer b.Close()
	_, err := b.ServerOps(context.Background())
	if err == nil {
		t.Fatal("ServerOps without mntr succeeded")
	}
	if !strings.Contains(err.Error(), "whitelist") {
		t.Errorf("error does not say why: %v", err)
	}
}
