package redislock

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// The options a sentinel URL gives go-redis: sentinels from the host list, the
// master name from the path, the userinfo for the data nodes, sentinel_username
// and sentinel_password for the sentinels, and the go-redis parameters as for
// redis://.
func TestFailoverOptions(t *testing.T) {
	u, err := url.Parse("rediss+sentinel://alice:apw@S1:26380,s2,127.0.0.1:1/mymaster?db=3&pool_size=7&dial_timeout=2s&protocol=3&client_name=x" +
		"&sentinel_username=sen&sentinel_password=spw&tls_server_name=redis.example")
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		t.Fatal(err)
	}
	o, err := failoverOptions(u, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Unknown(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.SentinelAddrs, ","); got != "s1:26380,s2:26379,127.0.0.1:1" {
		t.Errorf("sentinels %s", got)
	}
	if o.MasterName != "mymaster" || o.Username != "alice" || o.Password != "apw" || o.SentinelUsername != "sen" || o.SentinelPassword != "spw" {
		t.Errorf("master %q, user %q/%q, sentinel user %q/%q", o.MasterName, o.Username, o.Password, o.SentinelUsername, o.SentinelPassword)
	}
	if o.DB != 3 || o.PoolSize != 7 || o.DialTimeout != 2*time.Second || o.Protocol != 3 || o.ClientName != "x" {
		t.Errorf("db %d, pool %d, dial timeout %v, protocol %d, client name %q", o.DB, o.PoolSize, o.DialTimeout, o.Protocol, o.ClientName)
	}
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "redis.example" {
		t.Errorf("TLS %+v", o.TLSConfig)
	}
	// Without tls_server_name, each connection is checked against the host it
	// dials (a sentinel, or the master the sentinels named).
	u, _ = url.Parse("rediss+sentinel://s1,s2/m")
	p, _ = driver.ParseParams(u)
	if o, err := failoverOptions(u, p); err != nil || o.TLSConfig == nil || o.TLSConfig.ServerName != "" {
		t.Errorf("rediss+sentinel without tls_server_name: %v, %+v", err, o)
	}
	u, _ = url.Parse("redis+sentinel://s1/m")
	p, _ = driver.ParseParams(u)
	if o, err := failoverOptions(u, p); err != nil || o.TLSConfig != nil || o.DB != 0 {
		t.Errorf("redis+sentinel: %v, %+v", err, o)
	}
}

func TestParseSentinels(t *testing.T) {
	for in, want := range map[string]string{
		"h1":                          "h1:26379",
		"h1:1,H2:65535":               "h1:1,h2:65535",
		"[::1]:26380,[::1]":           "[::1]:26380,[::1]:26379",
		"10.0.0.1:26379,10.0.0.2:123": "10.0.0.1:26379,10.0.0.2:123",
	} {
		got, err := parseSentinels(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("parseSentinels(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", ",", "h1,", ",h1", "h1,,h2", ":26379", "h1:", "h1:0", "h1:65536", "h1:x", "h1:+5", "h1:026379",
		"h1,H1:26379", "::1", "[::1", "[::1]x", "[]:1"} {
		if got, err := parseSentinels(in); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("parseSentinels(%q) = %v, %v; want ErrInvalid", in, got, err)
		}
	}
}

// FuzzFailoverOptions: whatever the host list, path and query, failoverOptions
// returns ErrInvalid, or options go-redis takes without a panic, with every
// sentinel a host:port and a master name. The client made is closed at once.
func FuzzFailoverOptions(f *testing.F) {
	for _, s := range []string{"", "db=3", "pool_size=-1", "sentinel_password=x", "sentinel_username=u&sentinel_password=p",
		"tls=true", "tls=false", "skip_verify=true", "db=1&db=2", "protocol=3&client_name=x"} {
		f.Add("redis+sentinel", "h1:26379,h2:26380", "/mymaster", s)
		f.Add("rediss+sentinel", "127.0.0.1", "/m", s)
	}
	f.Add("redis+sentinel", "h1,,h2", "/", "")
	f.Add("redis+sentinel", "[::1]:1", "/a/b", "")
	f.Fuzz(func(t *testing.T, scheme, host, path, query string) {
		if !sentinelScheme(scheme) {
			return
		}
		u := &url.URL{Scheme: scheme, Host: host, Path: path, RawQuery: query}
		p, err := driver.ParseParams(u)
		if err != nil {
			return
		}
		o, err := failoverOptions(u, p)
		if err != nil {
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("failoverOptions(%q) = %v, not ErrInvalid", u, err)
			}
			return
		}
		if o.MasterName == "" || len(o.SentinelAddrs) == 0 {
			t.Fatalf("failoverOptions(%q): master %q, sentinels %v", u, o.MasterName, o.SentinelAddrs)
		}
		o.MinIdleConns = 0 // no dial at construction
		redis.NewFailoverClient(o).Close()
	})
}
