package driver

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// ParseURL parses a backend URL. Beyond url.Parse it accepts a comma-separated host
// list, "scheme://[user[:password]@]h1:2379,h2,h3:2380/path?query", which url.Parse
// refuses when an entry other than the last has a port; the list is then kept as
// written in the URL's Host, for the backend to split. It refuses opaque URLs
// ("scheme:rest", where a password would not be recognised as one) and fragments.
// Its errors match ErrInvalid and never repeat the password.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		u, err = parseHostList(raw, err)
		if err != nil {
			return nil, err
		}
	}
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: backend URL must have the form scheme://host/..., got an opaque %s: URL", ErrInvalid, safeScheme(u.Scheme))
	}
	if u.Fragment != "" || strings.HasSuffix(raw, "#") {
		return nil, fmt.Errorf("%w: backend URL has a fragment ('#'), which no backend uses (a '#' in a password must be written %%23)", ErrInvalid)
	}
	return u, nil
}

// parseHostList retries a URL that url.Parse refused (with perr) with its host list
// replaced by a placeholder, and puts the list back if it is one.
func parseHostList(raw string, perr error) (*url.URL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if ok {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		auth := rest[:end]
		at := strings.LastIndexByte(auth, '@')
		hosts := auth[at+1:]
		if strings.Contains(hosts, ",") {
			if !validHostList(hosts) {
				if strings.Contains(rest, "@") {
					// What looks like hosts may be the tail of a password with a '/'.
					return nil, fmt.Errorf("%w: backend URL does not parse: a bad entry in the host list (each must be host or host:port, an IPv6 address in brackets), or special characters in a user name or password that must be %%-escaped", ErrInvalid)
				}
				return nil, fmt.Errorf("%w: backend URL host list %q has a bad entry (each must be host or host:port, an IPv6 address in brackets)", ErrInvalid, hosts)
			}
			u, err := url.Parse(scheme + "://" + auth[:at+1] + "placeholder" + rest[end:])
			if err == nil {
				u.Host = hosts
				return u, nil
			}
			perr = err
		}
	}
	return nil, parseError(raw, perr)
}

// validHostList reports whether s is a list of host[:port] entries: names, IPv4
// addresses or bracketed IPv6 ones, each with an optional numeric port.
func validHostList(s string) bool {
	for h := range strings.SplitSeq(s, ",") {
		if !hostEntryRE.MatchString(h) {
			return false
		}
	}
	return true
}

var hostEntryRE = regexp.MustCompile(`^(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$`)

var quoted = regexp.MustCompile(`"[^"]*"`)

// parseError describes why raw does not parse without repeating any of it when it
// may hold a password: url.Error repeats the whole input, and its inner message
// quotes the part that failed, which may be password text.
func parseError(raw string, err error) error {
	msg := "malformed"
	if ue, ok := err.(*url.Error); ok {
		msg = ue.Err.Error()
	}
	if strings.Contains(raw, "@") {
		msg = strings.TrimSpace(strings.Join(strings.Fields(quoted.ReplaceAllString(msg, "")), " "))
		return fmt.Errorf("%w: backend URL does not parse (%s); special characters in a user name or password (such as @ : / ? # %%) must be %%-escaped", ErrInvalid, msg)
	}
	return fmt.Errorf("%w: backend URL does not parse: %s", ErrInvalid, msg)
}

func safeScheme(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

// ParseQuery parses a raw URL query strictly. url.ParseQuery and url.URL.Query drop
// a pair they cannot decode; dropping "strict=true%" would turn a safety setting off
// without a word, so a malformed pair is an error here, naming the parameter when its
// name decodes and never repeating a value. A ';' is refused as net/url refuses it.
// The error matches ErrInvalid.
func ParseQuery(raw string) (url.Values, error) {
	v := make(url.Values)
	n := 0
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		n++
		rawName, rawValue, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil || strings.Contains(rawName, ";") {
			return nil, fmt.Errorf("%w: URL query parameter #%d has a malformed name (a bad %%-escape or a ';'; write %%25 for a literal %%, %%3B for ';')", ErrInvalid, n)
		}
		if name == "" {
			return nil, fmt.Errorf("%w: URL query parameter #%d has no name", ErrInvalid, n)
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil || strings.Contains(rawValue, ";") {
			return nil, fmt.Errorf("%w: URL parameter %q has a malformed value (a bad %%-escape or a ';'; write %%25 for a literal %%, %%3B for ';', and separate parameters with '&')", ErrInvalid, name)
		}
		v[name] = append(v[name], value)
	}
	return v, nil
}

// ParseParams returns the Params of u's query, parsed with ParseQuery.
func ParseParams(u *url.URL) (*Params, error) {
	v, err := ParseQuery(u.RawQuery)
	if err != nil {
		return nil, err
	}
	return NewParams(v), nil
}

// secretParam reports whether a query parameter's value should not be shown.
func secretParam(name string) bool {
	l := strings.ToLower(name)
	return strings.Contains(l, "pass") || strings.Contains(l, "token") || strings.Contains(l, "secret") ||
		strings.Contains(l, "auth") || strings.Contains(l, "cred") || strings.HasSuffix(l, "key")
}

// Redact returns u as a string with any password replaced by "xxxxx", and the values
// of query parameters that look secret (password, token, secret, auth, credentials,
// key) hidden too, as are pairs that do not decode. An opaque URL's text and the
// fragment are hidden whole.
func Redact(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, has := c.User.Password(); has {
			c.User = url.UserPassword(c.User.Username(), "xxxxx")
		}
	}
	if c.Opaque != "" {
		c.Opaque = "xxxxx"
	}
	if c.Fragment != "" || c.RawFragment != "" {
		c.Fragment, c.RawFragment = "xxxxx", ""
	}
	var parts []string
	for part := range strings.SplitSeq(c.RawQuery, "&") {
		if part == "" {
			continue
		}
		rawName, rawValue, hasValue := strings.Cut(part, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil || strings.Contains(rawName, ";") {
			parts = append(parts, "xxxxx")
			continue
		}
		value, verr := url.QueryUnescape(rawValue)
		switch {
		case !hasValue:
			parts = append(parts, url.QueryEscape(name))
		case secretParam(name) || verr != nil || strings.Contains(rawValue, ";"):
			parts = append(parts, url.QueryEscape(name)+"=xxxxx")
		default:
			parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(value))
		}
	}
	c.RawQuery = strings.Join(parts, "&")
	c.ForceQuery = false
	return c.String()
}

// DefaultOpenTimeout bounds a backend's Open (connecting, handshakes, the first
// checks) when its context has no deadline, so that a server that accepts
// connections but never answers fails Open instead of hanging it.
const DefaultOpenTimeout = 15 * time.Second

// OpenContext returns ctx bounded by DefaultOpenTimeout when it has no deadline.
func OpenContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultOpenTimeout)
}

// Outlive returns a context with ctx's values that is not cancelled when ctx is,
// but grace after ctx is done (or when its cancel is called). A backend runs with
// it a write that must run to its end once sent, such as a waiter's place: a Go
// driver ends a call whose context is done by closing its connection, and the
// server runs the statement on, so the write could land after whatever the
// caller does next (the withdrawal of that place, which would then find nothing).
func Outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-out.Done():
		}
	})
	return out, func() {
		stop()
		cancel()
	}
}
