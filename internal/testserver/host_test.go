package testserver

import (
	"os"
	"testing"
)

// A helper's Fatal becomes an error, its Cleanup functions run at Close, and its
// temporary directories go with the host's.
func TestHost(t *testing.T) {
	h, err := NewHost("dlock-host-test")
	if err != nil {
		t.Fatal(err)
	}
	cleaned := false
	var dir string
	_, err = Try(h, func(t TB) int {
		t.Helper()
		t.Cleanup(func() { cleaned = true })
		if dir = t.TempDir(); dir == "" {
			t.Fatal("no temp dir")
		}
		t.Fatalf("redis-server not found: %s", "install it")
		return 1
	})
	if err == nil || err.Error() != "redis-server not found: install it" {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("temp dir gone before Close: %v", err)
	}
	h.Close()
	if !cleaned {
		t.Error("cleanup did not run")
	}
	if _, err := os.Stat(h.Dir()); !os.IsNotExist(err) {
		t.Errorf("host directory left behind: %v", err)
	}
}

// A panic that is not a Fatal is not swallowed.
func TestHostTryRepanics(t *testing.T) {
	h, err := NewHost("dlock-host-test")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v, want boom", r)
		}
	}()
	_, _ = Try(h, func(TB) int { panic("boom") })
}
