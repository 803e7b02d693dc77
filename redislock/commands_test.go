package redislock_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docs/redis.md lists every command the scripts send, so that users of Valkey,
// ACLs or managed servers know what the backend needs.
func TestDocumentedCommands(t *testing.T) {
	doc, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := filepath.Glob("scripts/*.lua")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	call := regexp.MustCompile(`redis\.p?call\('([A-Za-z]+)'`)
	seen := map[string]bool{}
	for _, f := range scripts {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			cmd := strings.ToUpper(m[1])
			if !seen[cmd] && !strings.Contains(string(doc), "`"+cmd+"`") {
				t.Errorf("%s sends %s, which docs/redis.md does not list", f, cmd)
			}
			seen[cmd] = true
		}
	}
	if len(seen) < 10 {
		t.Errorf("found only %d commands in the scripts: %v", len(seen), seen)
	}
}
