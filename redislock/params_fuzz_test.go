package redislock

import (
	"errors"
	"net/url"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// FuzzRedisOptions checks the go-redis parameters Open passes through: whatever the
// query, redisOptions returns ErrInvalid or options that go-redis takes without a
// panic (it panicked on pool_size=-1 and on sizes beyond int32: issue 17 item 6).
// The client made is closed at once; it does not dial.
func FuzzRedisOptions(f *testing.F) {
	for _, s := range []string{"pool_size=-1", "pool_size=2147483648", "pipeline_pool_size=-1", "pipeline_pool_size=2147483648",
		"dial_timeout=1&read_timeout=-1", "db=3", "pool_size=1&pool_size=2", "skip_verify=true", "min_idle_conns=5&max_idle_conns=1",
		"conn_max_lifetime=1h&conn_max_lifetime_jitter=2h", "protocol=3&client_name=x"} {
		f.Add("redis", "/0", s)
		f.Add("rediss", "", s)
	}
	f.Fuzz(func(t *testing.T, scheme, path, query string) {
		if scheme != "redis" && scheme != "rediss" && scheme != "unix" {
			return
		}
		u := &url.URL{Scheme: scheme, Host: "127.0.0.1:1", Path: path, RawQuery: query}
		if scheme == "unix" {
			u.Host, u.Path = "", "/tmp/none.sock"
		}
		p, err := driver.ParseParams(u)
		if err != nil {
			return
		}
		opt, err := redisOptions(u, p)
		if err != nil {
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("redisOptions(%q) = %v, not ErrInvalid", u, err)
			}
			return
		}
		redis.NewClient(opt).Close()
	})
}
