package driver

import (
	"errors"
	"testing"
)

// One TLS rule for etcd://, zk:// and redlock:// (they used to differ: tls_ca alone
// turned TLS on for two of them and was an error for the third).
func TestReadTLS(t *testing.T) {
	read := func(q string) error {
		v, err := ParseQuery(q)
		if err != nil {
			t.Fatal(err)
		}
		p := NewParams(v)
		cfg, err := ReadTLS(p)
		if err != nil {
			return err
		}
		if on := cfg != nil; on != (q != "" && q != "tls=false") {
			t.Errorf("ReadTLS(%q): TLS on = %v", q, on)
		}
		return p.Unknown()
	}
	for _, q := range []string{"", "tls=false", "tls=true", "tls_server_name=h", "tls=true&tls_server_name=h"} {
		if err := read(q); err != nil {
			t.Errorf("ReadTLS(%q) = %v", q, err)
		}
	}
	for _, q := range []string{"tls=false&tls_server_name=h", "tls=maybe", "tls_ca=/nonexistent", "tls_cert=/c.pem",
		"tls=true&tls=true", "tls_server_name=a&tls_server_name=b"} {
		if err := read(q); !errors.Is(err, ErrInvalid) {
			t.Errorf("ReadTLS(%q) = %v, want ErrInvalid", q, err)
		}
	}
}
