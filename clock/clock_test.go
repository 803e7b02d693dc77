package clock

import (
	"testing"
	"time"
)

func TestFakeTimersFireInOrder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	a := f.NewTimer(2 * time.Second)
	b := f.NewTimer(time.Second)
	fired := make(chan string, 2)
	f.AfterFunc(3*time.Second, func() { fired <- "func" })
	if f.Pending() != 3 {
		t.Fatalf("Pending = %d, want 3", f.Pending())
	}
	f.Advance(time.Second)
	select {
	case at := <-b.C():
		if !at.Equal(t0.Add(time.Second)) {
			t.Fatalf("b fired at %v", at)
		}
	default:
		t.Fatal("b did not fire at its deadline")
	}
	select {
	case <-a.C():
		t.Fatal("a fired early")
	default:
	}
	f.Advance(2 * time.Second)
	<-a.C()
	if got := <-fired; got != "func" {
		t.Fatal(got)
	}
	if f.Pending() != 0 {
		t.Fatalf("Pending = %d after all fired", f.Pending())
	}
}

func TestFakeStopResetAndJump(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	f.Advance(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	tm.Reset(time.Minute)
	f.Set(t0) // a backward jump fires nothing
	if f.Pending() != 1 {
		t.Fatal("backward jump lost the timer")
	}
	f.Set(t0.Add(2 * time.Hour))
	<-tm.C()
	done := make(chan struct{})
	go func() { f.BlockUntil(1); close(done) }()
	f.NewTimer(time.Second)
	<-done
}

func TestReal(t *testing.T) {
	tm := Real.NewTimer(time.Millisecond)
	<-tm.C()
	ch := make(chan struct{})
	Real.AfterFunc(time.Millisecond, func() { close(ch) })
	<-ch
	if Real.Now().IsZero() {
		t.Fatal("zero time")
	}
}
