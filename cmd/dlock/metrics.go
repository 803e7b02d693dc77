package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveMetrics serves c's metrics, and the process's, at http://addr/metrics until
// the returned function is called. A bad or busy address is a usage error.
func serveMetrics(addr string, c prometheus.Collector, stderr io.Writer) (stop func(), err error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, usagef("--metrics-addr %q: want HOST:PORT, such as 127.0.0.1:9464", addr)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usagef("--metrics-addr: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "dlock: metrics server: %v\n", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
