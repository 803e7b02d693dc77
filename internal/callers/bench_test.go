package callers

import "testing"

// deep uses about n KiB of stack, as a client library's call path does (go-redis's
// and go-zookeeper's grew a new goroutine's stack from its first 8 KiB).
//
//go:noinline
func deep(n int) byte {
	var buf [1024]byte
	buf[n%len(buf)] = byte(n)
	if n == 0 {
		return buf[0]
	}
	return deep(n-1) + buf[n%len(buf)]
}

// BenchmarkCall: one call that uses 16 KiB of stack, run on a goroutine while the
// caller waits for it (as a call that may return early on its context does), on a
// new goroutine each time against a kept one.
func BenchmarkCall(b *testing.B) {
	done := make(chan byte, 1)
	call := func() { done <- deep(16) }
	b.Run("goroutine", func(b *testing.B) {
		for b.Loop() {
			go call()
			<-done
		}
	})
	b.Run("kept", func(b *testing.B) {
		p := New()
		defer p.Close()
		for b.Loop() {
			p.Go(call)
			<-done
		}
	})
}
