package driver

import (
	"net/url"
	"strings"
	"testing"
)

func TestWithoutKeepsEncoding(t *testing.T) {
	u, _ := url.Parse("postgres://h/db?ttl=5s&application_name=a+b%20c&table=t&x=%2B")
	got := Without(u, "ttl", "table").RawQuery
	if want := "application_name=a+b%20c&x=%2B"; got != want {
		t.Fatalf("Without = %q, want %q", got, want)
	}
}

func TestRedact(t *testing.T) {
	u, _ := url.Parse("redis://user:s3cret@h:1/0?password=p4ss&prefix=app&tls_key=/k.pem")
	got := Redact(u)
	for _, secret := range []string{"s3cret", "p4ss", "/k.pem"} {
		if strings.Contains(got, secret) {
			t.Fatalf("Redact(%q) = %q shows %q", u, got, secret)
		}
	}
	if !strings.Contains(got, "prefix=app") {
		t.Fatalf("Redact dropped a harmless parameter: %q", got)
	}
}

func TestParams(t *testing.T) {
	q, _ := url.ParseQuery("d=250ms&n=3&b=true&f=0.5&s=x&dup=1&dup=2&bad=-1s&typo=1")
	p := NewParams(q)
	if d, err := p.Duration("d", 0); err != nil || d.Milliseconds() != 250 {
		t.Fatalf("Duration = %v, %v", d, err)
	}
	if n, err := p.Int("n", 0); err != nil || n != 3 {
		t.Fatalf("Int = %v, %v", n, err)
	}
	if b, err := p.Bool("b", false); err != nil || !b {
		t.Fatalf("Bool = %v, %v", b, err)
	}
	if f, err := p.Float("f", 0); err != nil || f != 0.5 {
		t.Fatalf("Float = %v, %v", f, err)
	}
	if s, err := p.String("absent", "def"); err != nil || s != "def" {
		t.Fatalf("String default = %v, %v", s, err)
	}
	if _, err := p.String("dup", ""); err == nil {
		t.Fatal("a parameter given twice was accepted")
	}
	if _, err := p.Duration("bad", 0); err == nil {
		t.Fatal("a negative duration was accepted")
	}
	_, _ = p.String("s", "")
	if err := p.Unknown(); err == nil || !strings.Contains(err.Error(), "typo") {
		t.Fatalf("Unknown = %v, want it to name typo", err)
	}
}
