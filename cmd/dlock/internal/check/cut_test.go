package check

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// TestCutHealLeavesNoGoroutine cuts a proxied connection, writes through it during
// the cut and right after the heal, and checks that once the connection is gone no
// proxy goroutine is left. With toxiproxy's timeout toxic the write after the heal
// blocked one goroutine for good (a CI run's goleak found it).
func TestCutHealLeavesNoGoroutine(t *testing.T) {
	before := goleak.IgnoreCurrent()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(c, c) // echo until the proxy closes its side
		c.Close()
	}()

	px := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()), "cut", "127.0.0.1:0", ln.Addr().String())
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", px.Listen)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := c.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("echo before the cut: %v", err)
	}

	for _, stream := range []string{"upstream", "downstream"} {
		if err := setToxic(px, "cut-"+stream, stream, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _ := c.Read(buf); n != 0 {
		t.Fatalf("read %q through a cut connection", buf[:n])
	}
	for _, stream := range []string{"upstream", "downstream"} {
		if err := setToxic(px, "cut-"+stream, stream, false); err != nil {
			t.Fatal(err)
		}
		for range 20 { // arrives after the heal, before the close
			_, _ = c.Write([]byte("c"))
			time.Sleep(time.Millisecond)
		}
	}

	// The heal closes the connection: the client reads its end (EOF or a reset).
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the healed connection was not closed")
	}
	c.Close()
	px.Stop()
	ln.Close()
	<-served
	goleak.VerifyNone(t, before)
}
