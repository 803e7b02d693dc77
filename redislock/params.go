package redislock

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// The go-redis URL options that Open passes through, each checked first: go-redis
// panics on some values (a negative pool size: "makechan: size out of range"; one
// beyond int32) and silently takes the last of duplicates.
type redisParam struct {
	kind     byte // 'i' int, 'd' duration, 'b' bool, 's' client name
	min, max int  // for 'i'
}

const maxPool = 1 << 16

var redisParams = map[string]redisParam{
	"db":                         {'i', 0, 1 << 20},
	"protocol":                   {'i', 2, 3},
	"client_name":                {kind: 's'},
	"max_retries":                {'i', -1, 1000},
	"min_retry_backoff":          {kind: 'd'},
	"max_retry_backoff":          {kind: 'd'},
	"dial_timeout":               {kind: 'd'},
	"read_timeout":               {kind: 'd'},
	"write_timeout":              {kind: 'd'},
	"pool_fifo":                  {kind: 'b'},
	"pool_size":                  {'i', 0, maxPool},
	"pool_timeout":               {kind: 'd'},
	"min_idle_conns":             {'i', 0, maxPool},
	"max_idle_conns":             {'i', 0, maxPool},
	"max_active_conns":           {'i', 0, maxPool},
	"max_concurrent_dials":       {'i', 0, maxPool},
	"pipeline_pool_size":         {'i', -1, maxPool},
	"pipeline_read_buffer_size":  {'i', 0, 64 << 20},
	"pipeline_write_buffer_size": {'i', 0, 64 << 20},
	"conn_max_idle_time":         {kind: 'd'},
	"idle_timeout":               {kind: 'd'},
	"conn_max_lifetime":          {kind: 'd'},
	"max_conn_age":               {kind: 'd'},
	"conn_max_lifetime_jitter":   {kind: 'd'},
}

// maxRedisDuration bounds the duration options: go-redis multiplies a plain number by
// a second, which overflows for large ones.
const maxRedisDuration = 24 * time.Hour

// redisOptions checks the go-redis options in the query v (which p also wraps, so
// that reading them marks them used) and returns the go-redis Options for u with
// exactly the checked values. Errors match ErrInvalid and never show the password.
func redisOptions(u *url.URL, p *driver.Params) (*redis.Options, error) {
	if strings.Contains(u.Host, ",") {
		return nil, fmt.Errorf("%w: redislock: a redis URL names one server, got a host list (for several independent masters use redlock://)", driver.ErrInvalid)
	}
	pass := url.Values{}
	for name, spec := range redisParams {
		if !p.Has(name) {
			continue
		}
		s, err := p.String(name, "")
		if err != nil {
			return nil, fmt.Errorf("redislock: %w", err)
		}
		if err := checkRedisParam(name, spec, s); err != nil {
			return nil, err
		}
		pass.Set(name, s)
	}
	if pass.Has("db") && u.Scheme != "unix" && strings.Trim(u.Path, "/") != "" {
		return nil, fmt.Errorf("%w: redislock: the database is given twice, in the URL path and as db=", driver.ErrInvalid)
	}
	c := *u
	c.RawQuery = pass.Encode()
	c.ForceQuery = false
	opt, err := redis.ParseURL(c.String())
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, fmt.Errorf("%w: redislock: URL does not parse", driver.ErrInvalid)
		}
		// go-redis's own errors name the parameter or path, not the password.
		return nil, fmt.Errorf("%w: redislock: %v", driver.ErrInvalid, err)
	}
	if opt.DB < 0 || opt.DB > redisParams["db"].max {
		return nil, fmt.Errorf("%w: redislock: database number %d out of range", driver.ErrInvalid, opt.DB)
	}
	return opt, nil
}

func checkRedisParam(name string, spec redisParam, s string) error {
	bad := func(want string) error {
		return fmt.Errorf("%w: redislock: URL parameter %s=%q is not %s", driver.ErrInvalid, name, s, want)
	}
	switch spec.kind {
	case 'i':
		n, err := strconv.Atoi(s)
		if err != nil || n < spec.min || n > spec.max {
			return bad(fmt.Sprintf("an integer from %d to %d", spec.min, spec.max))
		}
	case 'd':
		// go-redis reads a plain number as seconds and 0 or less as "no timeout".
		want := "a duration such as 250ms or 3s (or 0 or -1 for none), at most 24h"
		if n, err := strconv.Atoi(s); err == nil {
			if n < -1 || time.Duration(n) > maxRedisDuration/time.Second {
				return bad(want)
			}
			return nil
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < -1 || d > maxRedisDuration {
			return bad(want)
		}
	case 'b':
		switch s {
		case "true", "false", "1", "0":
		default:
			return bad("true or false")
		}
	case 's':
		if s == "" || len(s) > 128 || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return bad("a non-empty name of printable ASCII without spaces, at most 128 bytes")
		}
	}
	return nil
}

// authError reports whether err is Redis refusing the credentials or the ACL
// permission for a command.
func authError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR Client sent AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
