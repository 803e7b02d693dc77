package zkops

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

// The floor cycle leaves nothing behind and can run again on the same key, and the
// server's packet count rises by the floor's two requests plus the count's own mntr.
func TestZKFloorAndOps(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openT(t, srv.URL("/bench")+"?ttl=5s")
	if s.OpsSource() == "" {
		t.Fatal("no OpsSource")
	}
	for range 3 {
		if err := s.FloorCycle(ctx, "a/b c"); err != nil {
			t.Fatal(err)
		}
	}
	kids, _, err := s.(*zkStore).conn.Children("/bench/floor")
	if err != nil || len(kids) != 0 {
		t.Fatalf("floor nodes left: %v, %v", kids, err)
	}
	// A ping may slip in between; the smallest of a few differences is exact.
	best := int64(-1)
	for range 5 {
		before, err := s.Ops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.FloorCycle(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		after, err := s.Ops(ctx)
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
}

// Without mntr in the four-letter-word whitelist, Ops fails and says why.
func TestZKOpsDisabled(t *testing.T) {
	srv := testserver.StartZooKeeper(t, "4lw.commands.whitelist=srvr")
	s := openT(t, srv.URL("/bench"))
	_, err := s.Ops(context.Background())
	if err == nil {
		t.Fatal("Ops without mntr succeeded")
	}
	if !strings.Contains(err.Error(), "whitelist") {
		t.Errorf("error does not say why: %v", err)
	}
}

func openT(t *testing.T, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("Open(%s): %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
