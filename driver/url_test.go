package driver

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// Issue 17 item 5: url.Query drops a pair it cannot decode, which turned safety
// settings off without a word.
func TestParseQueryRejectsMalformedPairs(t *testing.T) {
	for _, tc := range []struct{ raw, name string }{
		{"strict=true%", "strict"},
		{"strict=true;x=1", "strict"},
		{"replicas=2%", "replicas"},
		{"ttl=1s%", "ttl"},
		{"prefix=app%zz", "prefix"},
		{"a=1&table=x;drop", "table"},
		{"password=s3cr%et", "password"},
	} {
		_, err := ParseQuery(tc.raw)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseQuery(%q) = %v, want ErrInvalid", tc.raw, err)
			continue
		}
		if !strings.Contains(err.Error(), `"`+tc.name+`"`) {
			t.Errorf("ParseQuery(%q) = %v, want it to name %q", tc.raw, err, tc.name)
		}
		if strings.Contains(err.Error(), "s3cr") {
			t.Errorf("ParseQuery(%q) = %v shows the value", tc.raw, err)
		}
	}
	for _, raw := range []string{"%zz=1", "a;b=1", "=1"} {
		if _, err := ParseQuery(raw); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseQuery(%q) = %v, want ErrInvalid", raw, err)
		}
	}
	v, err := ParseQuery("a=1&&b=x%2By+z&c&a=2&")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Encode(); got != "a=1&a=2&b=x%2By+z&c=" {
		t.Fatalf("ParseQuery = %q", got)
	}
}

func TestParseParams(t *testing.T) {
	u, _ := url.Parse("redis://h/0?strict=true%25")
	p, err := ParseParams(u)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := p.String("strict", ""); s != "true%" {
		t.Fatalf("strict = %q", s)
	}
	u.RawQuery = "strict=true%"
	if _, err := ParseParams(u); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ParseParams = %v, want ErrInvalid", err)
	}
}

// Issue 17 item 11: the README's multi-host URLs did not parse, with a hint about
// passwords.
func TestParseURLHostLists(t *testing.T) {
	for _, tc := range []struct{ raw, host, path, user string }{
		{"etcd://h1:2379,h2/prefix", "h1:2379,h2", "/prefix", ""},
		{"zk://h1:2181,h2/root", "h1:2181,h2", "/root", ""},
		{"zk://u:p%40ss@h1:2181,h2,[::1]:2181/root?session_timeout=5s", "h1:2181,h2,[::1]:2181", "/root", "u"},
		{"redlock://h1:6379,h2:6379,h3:6379", "h1:6379,h2:6379,h3:6379", "", ""},
		{"etcd://h1:2379,h2", "h1:2379,h2", "", ""},
	} {
		u, err := ParseURL(tc.raw)
		if err != nil {
			t.Errorf("ParseURL(%q) = %v", tc.raw, err)
			continue
		}
		if u.Host != tc.host || u.Path != tc.path || u.User.Username() != tc.user {
			t.Errorf("ParseURL(%q) = host %q path %q user %q", tc.raw, u.Host, u.Path, u.User.Username())
		}
		if tc.user == "" && u.String() != tc.raw {
			t.Errorf("ParseURL(%q).String() = %q", tc.raw, u.String())
		}
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, tc := range []struct {
		raw      string
		password bool // whether the hint about passwords belongs
	}{
		{"etcd://h1:2379,h2:x/prefix", false},
		{"etcd://h1:2379,,h2/prefix", false},
		{"redis://h:port", false},
		{"redis://user:pa/ss@h:1/0", true},
		{"redis://user:s3cret%zz@h/0", true},
		{"redis:user:s3cret@h", false},
		{"redis://h/0#frag", false},
	} {
		_, err := ParseURL(tc.raw)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseURL(%q) = %v, want ErrInvalid", tc.raw, err)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "s3cret") || strings.Contains(msg, "pa/ss") || strings.Contains(msg, "/ss") {
			t.Errorf("ParseURL(%q) = %v shows the password", tc.raw, err)
		}
		if hint := strings.Contains(msg, "password"); hint != tc.password && !strings.Contains(msg, "'#'") {
			t.Errorf("ParseURL(%q) = %v: password hint %v, want %v", tc.raw, err, hint, tc.password)
		}
	}
}

func TestRedactMalformed(t *testing.T) {
	for _, raw := range []string{
		"redis://h/0?password=s3cret%",
		"redis://h/0?auth_token=s3cret",
		"redis://h/0?x%zz=s3cret",
		"redis://h/0?a=1;password=s3cret",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := Redact(u); strings.Contains(got, "s3cret") {
			t.Errorf("Redact(%q) = %q", raw, got)
		}
	}
	u := &url.URL{Scheme: "redis", Opaque: "user:s3cret@h"}
	if got := Redact(u); strings.Contains(got, "s3cret") {
		t.Errorf("Redact(opaque) = %q", got)
	}
}
