package httpfence_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/httpfence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	_ "github.com/dlockio/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// resource is what the handlers write: a log of tokens, deliberately without a
// lock of its own (the middleware's per-resource lock must order the handlers; the
// race detector would see it if it did not).
type resource struct{ log []uint64 }

func server(t *testing.T, store httpfence.Store, res *resource) *httptest.Server {
	h := httpfence.Handler(store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk, ok := httpfence.TokenFrom(r.Context())
		if !ok {
			t.Error("no token in the handler's context")
		}
		res.log = append(res.log, tk)
		io.WriteString(w, "ok")
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func client(t *testing.T, token func() (uint64, error)) *http.Client {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return &http.Client{Transport: &httpfence.Transport{Base: base, Token: token}}
}

func static(tk uint64) func() (uint64, error) { return func() (uint64, error) { return tk, nil } }

func post(ctx context.Context, c *http.Client, url string, tk uint64) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("x"))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if err := httpfence.ResponseError(resp, tk); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func TestInterleaved(t *testing.T) {
	res := &resource{}
	srv := server(t, &httpfence.Memory{}, res)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	fencetest.Interleaved(t, 8, 40, func(ctx context.Context, tk uint64) error {
		c := &http.Client{Transport: &httpfence.Transport{Base: base, Token: static(tk)}}
		return post(ctx, c, srv.URL+"/orders/1", tk)
	}, func(context.Context) []uint64 { return res.log })
}

func TestPausedHolder(t *testing.T) {
	ctx := context.Background()
	res := &resource{}
	store := &httpfence.Memory{}
	srv := server(t, store, res)
	lc, err := dlock.Open(ctx, "mem://httpfence-paused")
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	old, err := lc.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	oldToken := uint64(old.Token()) // read before the pause, sent after it
	if err := post(ctx, client(t, httpfence.LeaseToken(old)), srv.URL+"/report", oldToken); err != nil {
		t.Fatal(err)
	}
	if err := lc.Backend().(driver.ForceReleaser).ForceRelease(ctx, "report"); err != nil {
		t.Fatal(err)
	}
	nw, err := lc.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	nc := client(t, httpfence.LeaseToken(nw))
	if err := post(ctx, nc, srv.URL+"/report", uint64(nw.Token())); err != nil {
		t.Fatal(err)
	}
	err = post(ctx, client(t, static(oldToken)), srv.URL+"/report", oldToken)
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Current != uint64(nw.Token()) || se.Resource != "/report" {
		t.Fatalf("late write: %v", err)
	}
	if err := post(ctx, nc, srv.URL+"/report", uint64(nw.Token())); err != nil { // equal tokens pass
		t.Fatal(err)
	}
	want := []uint64{oldToken, uint64(nw.Token()), uint64(nw.Token())}
	if len(res.log) != 3 || res.log[0] != want[0] || res.log[1] != want[1] || res.log[2] != want[2] {
		t.Fatalf("log %v, want %v", res.log, want)
	}
	// Once released, the lease's transport sends nothing.
	if err := nw.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := post(ctx, nc, srv.URL+"/report", 0); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("after release: %v", err)
	}
	if len(res.log) != 3 || store.Mark("/report") != uint64(nw.Token()) {
		t.Fatalf("log %v, mark %d", res.log, store.Mark("/report"))
	}
}

func TestFullRange(t *testing.T) {
	res := &resource{}
	srv := server(t, &httpfence.Memory{}, res)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	fencetest.FullRange(t, func(ctx context.Context, tk uint64) error {
		return post(ctx, &http.Client{Transport: &httpfence.Transport{Base: base, Token: static(tk)}}, srv.URL+"/r", tk)
	})
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	res := &resource{}
	srv := server(t, &httpfence.Memory{}, res)
	if err := post(ctx, client(t, static(0)), srv.URL+"/r", 0); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("client, token 0: %v", err)
	}
	if err := post(ctx, &http.Client{Transport: &httpfence.Transport{}}, srv.URL+"/r", 0); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("no token source: %v", err)
	}
	raw := &http.Transport{}
	t.Cleanup(raw.CloseIdleConnections)
	for _, c := range []struct {
		header string
		path   string
		status int
		body   string
	}{
		{"", "/r", http.StatusPreconditionRequired, "missing Dlock-Fence-Token"},
		{"0", "/r", http.StatusBadRequest, "token 0"},
		{"-1", "/r", http.StatusBadRequest, "not a token"},
		{"18446744073709551616", "/r", http.StatusBadRequest, "not a token"},
		{"12abc", "/r", http.StatusBadRequest, "not a token"},
		{"5", "/%00", http.StatusBadRequest, "control character"},
	} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+c.path, nil)
		if c.header != "" {
			req.Header.Set(httpfence.Header, c.header)
		}
		resp, err := raw.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(body), c.body) {
			t.Errorf("header %q path %q: %d %q", c.header, c.path, resp.StatusCode, body)
		}
	}
	if len(res.log) != 0 {
		t.Fatalf("bad requests reached the handler: %v", res.log)
	}
}

// A refused request never reaches the handler, and the 409 carries the mark.
func TestRefused(t *testing.T) {
	res := &resource{}
	srv := server(t, &httpfence.Memory{}, res)
	raw := &http.Transport{}
	t.Cleanup(raw.CloseIdleConnections)
	send := func(tk uint64) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/r", nil)
		req.Header.Set(httpfence.Header, strconv.FormatUint(tk, 10))
		resp, err := raw.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if r := send(10); r.StatusCode != http.StatusOK {
		t.Fatal(r.Status)
	}
	r := send(9)
	if r.StatusCode != http.StatusConflict || r.Header.Get(httpfence.CurrentHeader) != "10" {
		t.Fatalf("stale: %s %v", r.Status, r.Header)
	}
	if len(res.log) != 1 {
		t.Fatalf("log %v", res.log)
	}
	// A store error is a 503, and the handler does not run.
	failing := httpfence.StoreFunc(func(context.Context, string, uint64) error { return errors.New("down") })
	srv2 := server(t, failing, res)
	req, _ := http.NewRequest(http.MethodPost, srv2.URL+"/r", nil)
	req.Header.Set(httpfence.Header, "11")
	resp, err := raw.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || len(res.log) != 1 {
		t.Fatalf("store error: %s, log %v", resp.Status, res.log)
	}
}
