package mysqlops

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

// The floor cycle leaves no row behind and is two statements; reading Ops counts
// none.
func TestMariaDBFloorAndOps(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openT(t, srv.URL()+"?table=ignored&ttl=5s&max_conns=4")
	openT(t, srv.URL()) // a second store on the same database: the table exists
	if s.OpsSource() == "" {
		t.Fatal("no OpsSource")
	}
	for range 3 {
		if err := s.FloorCycle(ctx, "a b"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := s.(*store).db.QueryRowContext(ctx, "SELECT count(*) FROM "+floorTable).Scan(&n); err != nil || n != 0 {
		t.Fatalf("floor rows left: %d, %v", n, err)
	}
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
	if d := after - before; d != 2 {
		t.Errorf("a floor cycle: %d statements, want 2 (insert, delete)", d)
	}
}

func openT(t *testing.T, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
