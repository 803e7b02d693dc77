package httpfence_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dlockio/dlock/fence/httpfence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
)

// BenchmarkWrite compares a POST to a plain handler and to the same handler behind
// the middleware (in-memory store), over loopback, in one run.
func BenchmarkWrite(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	plain := httptest.NewServer(ok)
	defer plain.Close()
	fenced := httptest.NewServer(httpfence.Handler(&httpfence.Memory{}, ok))
	defer fenced.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	const tk = 1 << 40
	fc := &http.Client{Transport: &httpfence.Transport{Base: base, Token: static(tk)}}
	pc := &http.Client{Transport: base}
	do := func(c *http.Client, url string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
	}
	b.Run("unguarded", func(b *testing.B) { fencetest.Measure(b, do(pc, plain.URL+"/r")) })
	b.Run("guarded", func(b *testing.B) { fencetest.Measure(b, do(fc, fenced.URL+"/r")) })
	b.Run("pair", func(b *testing.B) { fencetest.Pair(b, do(pc, plain.URL+"/r"), do(fc, fenced.URL+"/r")) })
}
