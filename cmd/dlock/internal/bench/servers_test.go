package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

func TestStartServers(t *testing.T) {
	testserver.Require(t, "redis", "redis-server", "install it with: apt-get install -y redis-server")
	if _, err := StartServers([]string{"nosuch"}); err == nil {
		t.Fatal("unknown kind accepted")
	}
	s, err := StartServers([]string{ServerRedis})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	if len(s.Targets) != 1 || len(s.Skipped) != 0 {
		t.Fatalf("targets %+v, skipped %v", s.Targets, s.Skipped)
	}
	tg := s.Targets[0]
	if tg.Name != "redis" || !strings.HasPrefix(tg.URL, "redis://127.0.0.1:") {
		t.Fatalf("target %+v", tg)
	}
	ctx := ctxT(t)
	c, err := dlock.Open(ctx, tg.URL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	dir := s.host.Dir()
	s.Stop()
	stopped = true
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("server directory %s left behind: %v", dir, err)
	}
}
