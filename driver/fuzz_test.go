package driver

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// The fuzz targets below found issue 17's items 5 to 7; their corpora live in
// testdata/fuzz and run as ordinary tests with go test. Run one longer with, e.g.,
// go test -run '^$' -fuzz FuzzParseURL -fuzztime 30s ./driver/

var urlSeeds = []string{
	"redis://user:s3cret@127.0.0.1:6379/0?prefix=app&ttl=10s",
	"etcd://h1:2379,h2/prefix",
	"zk://u:p%40ss@h1:2181,h2,[::1]:2181/root?session_timeout=5s",
	"redlock://:pw@h1,h2,h3/0?node_timeout=20ms",
	"postgres://u:p@h:5432/db?table=x;drop",
	"redis://h/0?strict=true%",
	"redis://user:pa/ss@h:1/0",
	"redis:user:s3cret@h",
	"mem://x?ttl=1s%",
	"unix:///run/redis.sock?db=0",
}

// genericText holds the fixed words of ParseURL's messages; a password made of them
// would show up in any message.
const genericText = "backend URL does not parse; special characters in a user name or password (such as @ : / ? # %) must be %-escaped invalid port after host malformed must have the form scheme://host/..., got an opaque fragment ('#'), which no backend uses (a '#' in a password must be written %23) net/url: invalid userinfo control character in URL escape first path segment in URL cannot contain colon missing protocol scheme"

func FuzzParseURL(f *testing.F) {
	for _, s := range urlSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := ParseURL(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseURL(%q) = %v, not ErrInvalid", raw, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseURL(%q): a multi-line error: %q", raw, err)
			}
			// Whatever stands between "://" and the last '@' may be a password.
			if _, rest, ok := strings.Cut(raw, "://"); ok {
				if at := strings.LastIndexByte(rest, '@'); at >= 8 {
					user := rest[:at]
					if !strings.Contains(genericText, user) && strings.Contains(err.Error(), user) {
						t.Fatalf("ParseURL(%q) = %v shows the user info", raw, err)
					}
				}
			}
			return
		}
		// What parses prints as something that parses to the same.
		u2, err := ParseURL(u.String())
		if err != nil {
			t.Fatalf("ParseURL(%q).String() = %q does not parse again: %v", raw, u.String(), err)
		}
		if u2.String() != u.String() {
			t.Fatalf("ParseURL(%q) round trip: %q then %q", raw, u.String(), u2.String())
		}
		red := Redact(u)
		if pw, ok := u.User.Password(); ok && len(pw) >= 6 && !strings.Contains(strings.Replace(red, "xxxxx", "", 1), pw) {
			// The password appears nowhere else in the redacted form...
			withoutUser := *u
			withoutUser.User = nil
			if !strings.Contains(Redact(&withoutUser), pw) && strings.Contains(red, pw) {
				t.Fatalf("Redact(%q) = %q shows the password", raw, red)
			}
		}
	})
}

func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"strict=true%", "strict=true;x=1", "replicas=2%", "ttl=1s%", "prefix=app%zz",
		"table=x;drop", "a=1&&b=x%2By+z&c&a=2&", "=1", "%zz=1", "a=%41%42"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseQuery(raw)
		want, werr := url.ParseQuery(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseQuery(%q) = %v", raw, err)
			}
			return
		}
		if werr != nil {
			t.Fatalf("ParseQuery(%q) accepted what url.ParseQuery refuses: %v", raw, werr)
		}
		if got.Encode() != want.Encode() {
			t.Fatalf("ParseQuery(%q) = %q, url.ParseQuery gives %q", raw, got.Encode(), want.Encode())
		}
		// Nothing is dropped: every pair with a name is kept.
		n := 0
		for _, vs := range got {
			n += len(vs)
		}
		pairs := 0
		for part := range strings.SplitSeq(raw, "&") {
			if part != "" {
				pairs++
			}
		}
		if n != pairs {
			t.Fatalf("ParseQuery(%q) kept %d of %d pairs", raw, n, pairs)
		}
		p := NewParams(got)
		for name := range got {
			_, _ = p.Duration(name, 0)
			_, _ = p.Int(name, 0)
			_, _ = p.Float(name, 0)
			_, _ = p.Bool(name, false)
		}
		if err := p.Unknown(); err != nil {
			t.Fatalf("Unknown after reading every parameter: %v", err)
		}
	})
}

func FuzzRedact(f *testing.F) {
	f.Add("redis://user:s3cret@h:1/0?password=p4ssword&prefix=app", "p4ssword")
	f.Add("redis://h/0?password=s3cret%", "s3cret")
	f.Add("redis://h/0?a=1;password=s3cret", "s3cret")
	f.Add("redis://h/0?auth_token=s3cret", "s3cret")
	f.Fuzz(func(t *testing.T, raw, secret string) {
		u, err := url.Parse(raw)
		if err != nil || len(secret) < 6 {
			return
		}
		red := Redact(u)
		if !utf8.ValidString(secret) || strings.Contains(genericText, secret) {
			return
		}
		// A secret given as a password or as the value of a secret-named parameter
		// (and nowhere else) must not show.
		hidden := 0
		if pw, ok := u.User.Password(); ok && pw == secret {
			hidden++
		}
		if q, err := url.ParseQuery(u.RawQuery); err == nil {
			for name, vs := range q {
				for _, v := range vs {
					if v == secret && secretParam(name) {
						hidden++
					}
				}
			}
		}
		if hidden == 0 {
			return
		}
		others := strings.Count(raw, secret) - hidden
		if others == 0 && strings.Contains(red, secret) {
			t.Fatalf("Redact(%q) = %q shows %q", raw, red, secret)
		}
	})
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"a", "orders/42", "", "a\x00b", "\x7f", "é", "\xff", "\u0085", strings.Repeat("k", MaxKeyLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := ValidateKey(key)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidateKey(%q) = %v", key, err)
			}
			return
		}
		if key == "" || len(key) > MaxKeyLen || !utf8.ValidString(key) {
			t.Fatalf("ValidateKey(%q) accepted it", key)
		}
		for _, r := range key {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("ValidateKey(%q) accepted control character %U", key, r)
			}
		}
	})
}
