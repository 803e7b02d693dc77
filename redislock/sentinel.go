package redislock

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// DefaultSentinelPort is the port of a sentinel listed without one.
const DefaultSentinelPort = 26379

func sentinelScheme(s string) bool { return s == SchemeSentinel || s == SchemeSentinelTLS }

// failoverOptions returns the go-redis FailoverOptions of a redis+sentinel:// or
// rediss+sentinel:// URL: the sentinels are the host list, the master name is the
// path, the userinfo is for the data nodes and sentinel_username and
// sentinel_password for the sentinels. The go-redis parameters are checked as for
// redis:// (redisOptions), TLS read as for rediss:// (readTLS). Errors match
// ErrInvalid and never show a password.
func failoverOptions(u *url.URL, p *driver.Params) (*redis.FailoverOptions, error) {
	addrs, err := parseSentinels(u.Host)
	if err != nil {
		return nil, err
	}
	name := strings.TrimPrefix(u.Path, "/")
	switch {
	case name == "":
		return nil, invalid("a sentinel URL names the master as its path: %s://host1:26379,host2:26379/MASTERNAME", u.Scheme)
	case strings.Contains(name, "/"):
		return nil, invalid("the path of a sentinel URL is the master name alone (give the database as db=N), got %q", name)
	case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return nil, invalid("the master name %q holds a space or a control character", name)
	}
	// The go-redis options of the data nodes, checked as for redis://: on a URL
	// with one placeholder host, no path (db= only) and the userinfo.
	c := url.URL{Scheme: Scheme, Host: "127.0.0.1:6379", User: u.User, RawQuery: u.RawQuery}
	opt, err := redisOptions(&c, p)
	if err != nil {
		return nil, err
	}
	sentinelUser, err := p.String("sentinel_username", "")
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	sentinelPass, err := p.String("sentinel_password", "")
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	if sentinelUser != "" && sentinelPass == "" {
		return nil, invalid("sentinel_username without sentinel_password")
	}
	tlsConfig, err := readTLS(u, p)
	if err != nil {
		return nil, err
	}
	return &redis.FailoverOptions{
		MasterName:       name,
		SentinelAddrs:    addrs,
		SentinelUsername: sentinelUser,
		SentinelPassword: sentinelPass,
		TLSConfig:        tlsConfig,

		ClientName:              opt.ClientName,
		Protocol:                opt.Protocol,
		Username:                opt.Username,
		Password:                opt.Password,
		DB:                      opt.DB,
		MaxRetries:              opt.MaxRetries,
		MinRetryBackoff:         opt.MinRetryBackoff,
		MaxRetryBackoff:         opt.MaxRetryBackoff,
		DialTimeout:             opt.DialTimeout,
		ReadTimeout:             opt.ReadTimeout,
		WriteTimeout:            opt.WriteTimeout,
		PoolFIFO:                opt.PoolFIFO,
		PoolSize:                opt.PoolSize,
		PoolTimeout:             opt.PoolTimeout,
		MinIdleConns:            opt.MinIdleConns,
		MaxIdleConns:            opt.MaxIdleConns,
		MaxActiveConns:          opt.MaxActiveConns,
		MaxConcurrentDials:      opt.MaxConcurrentDials,
		PipelinePoolSize:        opt.PipelinePoolSize,
		PipelineReadBufferSize:  opt.PipelineReadBufferSize,
		PipelineWriteBufferSize: opt.PipelineWriteBufferSize,
		ConnMaxIdleTime:         opt.ConnMaxIdleTime,
		ConnMaxLifetime:         opt.ConnMaxLifetime,
		ConnMaxLifetimeJitter:   opt.ConnMaxLifetimeJitter,
	}, nil
}

// parseSentinels splits "h1:26379,h2,[::1]:26380" into host:port addresses, the port
// DefaultSentinelPort where none is given, refusing empty entries, bad ports and
// duplicates.
func parseSentinels(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, invalid("a sentinel URL lists no sentinel: write %s://host1:26379,host2:26379/MASTERNAME", SchemeSentinel)
	}
	var addrs []string
	seen := make(map[string]bool)
	for h := range strings.SplitSeq(hosts, ",") {
		host, port := h, strconv.Itoa(DefaultSentinelPort)
		if strings.HasPrefix(h, "[") {
			end := strings.IndexByte(h, ']')
			if end < 0 || (end+1 < len(h) && h[end+1] != ':') {
				return nil, invalid("sentinel %q is not host:port", h)
			}
			host = h[1:end]
			if end+1 < len(h) {
				port = h[end+2:]
			}
		} else if i := strings.LastIndexByte(h, ':'); i >= 0 {
			host, port = h[:i], h[i+1:]
			if strings.Contains(host, ":") {
				return nil, invalid("sentinel %q: write an IPv6 address in brackets, [::1]:26379", h)
			}
		}
		if host == "" {
			return nil, invalid("empty sentinel host in the list %q", hosts)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
			return nil, invalid("sentinel %q has a bad port", h)
		}
		addr := net.JoinHostPort(strings.ToLower(host), port)
		if seen[addr] {
			return nil, invalid("sentinel %s listed twice", addr)
		}
		seen[addr] = true
		addrs = append(addrs, addr)
	}
	return addrs, nil
}
