package measure

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRing passes a token around channels: every turn runs once, in order, on the
// worker it belongs to, and only after its predecessor's pass.
func TestRing(t *testing.T) {
	const workers, turns = 4, 103
	bells := make([]chan int64, workers)
	for i := range bells {
		bells[i] = make(chan int64, 1)
	}
	var last atomic.Int64
	last.Store(-1)
	var mu sync.Mutex
	var bad []string
	fail := func(s string) {
		mu.Lock()
		bad = append(bad, s)
		mu.Unlock()
	}
	wait := func(ctx context.Context, w int, turn int64) error {
		select {
		case got := <-bells[w]:
			if got != turn {
				fail("woken for the wrong turn")
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pass := func(ctx context.Context, w int, turn int64) error {
		if int(turn)%workers != w {
			fail("a turn ran on another worker")
		}
		if !last.CompareAndSwap(turn-1, turn) {
			fail("a turn ran out of order")
		}
		bells[(w+1)%workers] <- turn + 1
		return nil
	}
	d, err := Ring(context.Background(), workers, turns, wait, pass)
	if err != nil || d <= 0 {
		t.Fatalf("Ring = %v, %v", d, err)
	}
	if len(bad) > 0 || last.Load() != turns-1 {
		t.Fatalf("last turn %d of %d; %v", last.Load(), turns, bad)
	}

	// An error ends the ring, and the waits blocked meanwhile return.
	boom := errors.New("boom")
	_, err = Ring(context.Background(), workers, turns,
		func(ctx context.Context, w int, turn int64) error { <-ctx.Done(); return ctx.Err() },
		func(ctx context.Context, w int, turn int64) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Ring with a failing pass: %v", err)
	}
	if _, err := Ring(context.Background(), 1, 1, wait, pass); err == nil {
		t.Fatal("a ring of one worker was accepted")
	}
}

// TestPolled: n acquisitions of a key that a mutex stands for, never two holders,
// and the key free at the end even though the workers stop while others hold it.
func TestPolled(t *testing.T) {
	var held atomic.Int32
	var count atomic.Int64
	var overlaps atomic.Int64
	try := func(ctx context.Context, w int) (bool, error) {
		if !held.CompareAndSwap(0, int32(w)+1) {
			return false, nil
		}
		count.Add(1)
		runtime.Gosched()
		return true, nil
	}
	release := func(ctx context.Context, w int) error {
		if err := ctx.Err(); err != nil {
			return err // as a store's client does
		}
		if !held.CompareAndSwap(int32(w)+1, 0) {
			overlaps.Add(1)
		}
		return nil
	}
	for _, n := range []int64{1, 500} {
		count.Store(0)
		d, err := Polled(context.Background(), 8, n, time.Millisecond, try, release)
		if err != nil || d <= 0 {
			t.Fatalf("Polled(%d) = %v, %v", n, d, err)
		}
		if c := count.Load(); c < n || c > n+8 {
			t.Errorf("Polled(%d) made %d acquisitions", n, c)
		}
		if held.Load() != 0 || overlaps.Load() != 0 {
			t.Fatalf("Polled(%d) left the key held (%d) or saw %d overlaps", n, held.Load(), overlaps.Load())
		}
	}
	boom := errors.New("boom")
	_, err := Polled(context.Background(), 4, 100, time.Millisecond, try,
		func(ctx context.Context, w int) error { held.Store(0); return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Polled with a failing release: %v", err)
	}
}

func TestMachineCPU(t *testing.T) {
	a, ok := MachineCPU()
	if !ok {
		if runtime.GOOS == "linux" {
			t.Fatal("MachineCPU cannot read /proc/stat on Linux")
		}
		t.Skip("no /proc/stat here")
	}
	// Spin until the machine's busy time has moved on (it counts in 10 ms ticks).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for i := 0; i < 1_000_000; i++ {
			_ = i * i
		}
		if b, _ := MachineCPU(); b > a {
			return
		}
	}
	t.Fatal("the machine's busy CPU time did not grow while this test spun for 5 s")
}
