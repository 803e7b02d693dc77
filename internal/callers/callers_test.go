package callers

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// goid is the id of the calling goroutine, from its stack's first line
// ("goroutine N [running]:").
func goid() string {
	buf := make([]byte, 64)
	return strings.Fields(string(buf[:runtime.Stack(buf, false)]))[1]
}

func TestKept(t *testing.T) {
	p := New()
	ran := make(chan string)
	p.Go(func() { ran <- goid() })
	first := <-ran
	reused := false
	for range 100 {
		p.Go(func() { ran <- goid() })
		if <-ran == first {
			reused = true
			break
		}
		time.Sleep(time.Millisecond) // the first goroutine may not be waiting yet
	}
	if !reused {
		t.Errorf("100 later calls ran on other goroutines than the first call's (%s)", first)
	}
	p.Close()
	p.Close()
	p.Go(func() { ran <- goid() })
	if id := <-ran; id == first {
		t.Errorf("a call after Close ran on a kept goroutine (%s)", id)
	}
}

// TestCloseWaits: Close returns only after the calls under way have returned, and
// every call handed over runs, also when many are handed over at once.
func TestCloseWaits(t *testing.T) {
	p := New()
	release := make(chan struct{})
	var done sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for range 50 {
		done.Add(1)
		p.Go(func() {
			defer done.Done()
			<-release
			mu.Lock()
			n++
			mu.Unlock()
		})
	}
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while calls were still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	done.Wait()
	if n != 50 {
		t.Fatalf("%d of 50 calls ran", n)
	}
}
