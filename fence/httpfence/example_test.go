package httpfence_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/dlockio/dlock/fence/httpfence"
)

func Example() {
	// The server: writes to /reports/... need a token not lower than the last one.
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := httpfence.TokenFrom(r.Context())
		fmt.Fprintf(w, "written with token %d", token)
	})
	srv := httptest.NewServer(httpfence.Handler(&httpfence.Memory{}, write))
	defer srv.Close()

	// The clients: in real code the token source is httpfence.LeaseToken(lease).
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	post := func(token uint64) {
		tr := &httpfence.Transport{Base: base, Token: func() (uint64, error) { return token, nil }}
		resp, err := (&http.Client{Transport: tr}).Post(srv.URL+"/reports/daily", "text/plain", nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get(httpfence.CurrentHeader), string(body))
	}
	post(7)
	post(7)
	post(5) // a paused holder waking up
	// Output:
	// 200  written with token 7
	// 200  written with token 7
	// 409 7 dlock: fence: stale token: resource "/reports/daily": token 5 is lower than 7, which it has accepted (a newer holder has written)
}
