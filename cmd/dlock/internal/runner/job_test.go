package runner

import (
	"os"
	"slices"
	"syscall"
	"testing"
)

func TestJobActionFor(t *testing.T) {
	for sig, want := range map[os.Signal]jobAction{
		os.Interrupt:      jobBreak,
		syscall.SIGTERM:   jobBreak,
		syscall.SIGHUP:    jobBreak,
		os.Kill:           jobTerminate,
		syscall.SIGQUIT:   jobIgnore,
		syscall.Signal(0): jobIgnore,
	} {
		if got := jobActionFor(sig); got != want {
			t.Errorf("jobActionFor(%v) = %v, want %v", sig, got, want)
		}
	}
}

func TestThreadsOf(t *testing.T) {
	snap := []thread{{1, 4}, {8, 100}, {9, 7}, {12, 100}}
	if got := threadsOf(snap, 100); !slices.Equal(got, []uint32{8, 12}) {
		t.Errorf("threadsOf = %v", got)
	}
	if got := threadsOf(snap, 5); got != nil {
		t.Errorf("threadsOf(absent) = %v", got)
	}
}
