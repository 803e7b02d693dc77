package driver

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestOutlive: the context outlives ctx's cancellation by the grace, keeps ctx's
// values, ends at once when its own cancel is called, and leaves no goroutine.
func TestOutlive(t *testing.T) {
	defer goleak.VerifyNone(t)
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	out, stop := Outlive(ctx, time.Hour)
	cancel()
	<-ctx.Done()
	if err := out.Err(); err != nil {
		t.Fatalf("ended with its parent: %v", err)
	}
	if v := out.Value(key{}); v != "v" {
		t.Fatalf("value %v, want the parent's", v)
	}
	stop()
	if out.Err() == nil {
		t.Fatal("not ended by its cancel")
	}

	ctx, cancel = context.WithCancel(context.Background())
	out, stop = Outlive(ctx, time.Millisecond)
	defer stop()
	cancel()
	select {
	case <-out.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("still not ended 10 s after the parent, with a grace of 1 ms")
	}

	// Its parent alive, it lasts (a parent that never ends adds nothing to wait for).
	out, stop = Outlive(context.Background(), time.Millisecond)
	if out.Err() != nil {
		t.Fatal("ended with a live parent")
	}
	stop()
}
