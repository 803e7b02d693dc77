package driver

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSParams are the URL parameters that TLSConfig reads.
var TLSParams = []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name"}

// TLSConfig builds a client TLS configuration (TLS 1.2 or later) from the values of
// the TLSParams URL parameters: tls_ca, a PEM file of the certificate authorities to
// trust (default: the system roots); tls_cert and tls_key, a client certificate and
// its key (together or not at all); tls_server_name, the name to verify instead of the
// host's. Missing values are empty strings. Errors match ErrInvalid.
func TLSConfig(f map[string]string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f["tls_server_name"]}
	if (f["tls_cert"] == "") != (f["tls_key"] == "") {
		return nil, fmt.Errorf("%w: tls_cert and tls_key go together", ErrInvalid)
	}
	if f["tls_ca"] != "" {
		pem, err := os.ReadFile(f["tls_ca"])
		if err != nil {
			return nil, fmt.Errorf("%w: tls_ca: %v", ErrInvalid, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls_ca %s holds no PEM certificate", ErrInvalid, f["tls_ca"])
		}
		cfg.RootCAs = pool
	}
	if f["tls_cert"] != "" {
		cert, err := tls.LoadX509KeyPair(f["tls_cert"], f["tls_key"])
		if err != nil {
			return nil, fmt.Errorf("%w: tls_cert/tls_key: %v", ErrInvalid, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// ReadTLS reads the TLS parameters from p, with one rule for every scheme that does
// not name TLS itself: tls=true turns TLS on (trusting the system roots unless
// tls_ca says otherwise), any of tls_ca, tls_cert, tls_key, tls_server_name turns it
// on too, and tls=false beside one of them is an error. It returns nil when TLS is
// off. Errors match ErrInvalid.
func ReadTLS(p *Params) (*tls.Config, error) {
	on, err := p.Bool("tls", false)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, name := range TLSParams {
		if files[name], err = p.String(name, ""); err != nil {
			return nil, err
		}
		if files[name] != "" {
			if p.Has("tls") && !on {
				return nil, fmt.Errorf("%w: %s given with tls=false", ErrInvalid, name)
			}
			on = true
		}
	}
	if !on {
		return nil, nil
	}
	return TLSConfig(files)
}
