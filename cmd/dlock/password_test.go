package main

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
)

func TestWithPassword(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("s3cr:t/@x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{
		"redis://127.0.0.1:6379/0",
		"redis://app@127.0.0.1:6379/0",
		"etcd://h1:2379,h2:2379/prefix", // a host list: url.Parse alone refuses it
	} {
		got, err := withPassword(raw, file, "from-env")
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		u, err := driver.ParseURL(got)
		if err != nil {
			t.Fatalf("%s: the result does not parse: %v", raw, err)
		}
		if pw, _ := u.User.Password(); pw != "s3cr:t/@x" {
			t.Errorf("%s: password %q, want the file's (the file wins over the environment)", raw, pw)
		}
	}
	got, err := withPassword("etcd://h1:2379,h2:2379/p", "", "from-env")
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := url.Parse(strings.Replace(got, "h1:2379,h2:2379", "h", 1)); u == nil || u.User.String() != ":from-env" {
		t.Errorf("DLOCK_PASSWORD not used: %q", got)
	}
	_, err = withPassword("redis://u:hunter2@127.0.0.1:6379", "", "from-env")
	var ue usageError
	if !errors.As(err, &ue) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a URL with a password plus DLOCK_PASSWORD: %v, want a usage error that hides the password", err)
	}
	if got, err := withPassword("redis://127.0.0.1:6379", "", ""); err != nil || got != "redis://127.0.0.1:6379" {
		t.Errorf("no password given: %q, %v; want the URL unchanged", got, err)
	}
}
