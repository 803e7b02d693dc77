//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// electionBackends start one real server of each kind and return its URL.
var electionBackends = []struct {
	name  string
	start func(t testing.TB) string
}{
	{"redis", func(t testing.TB) string { return testserver.StartRedis(t).URL() }},
	// Redlock's default node timeout (10 ms) is short for a loaded test machine.
	{"redlock", func(t testing.TB) string {
		return testserver.RedlockURL(testserver.StartRedisNodes(t, 3), "node_timeout=500ms")
	}},
	{"etcd", func(t testing.TB) string { return testserver.StartEtcd(t).URL("dlock") }},
	// A ZooKeeper grant lives as long as its session: the session timeout, not the
	// TTL, is how long a dead leader keeps the name.
	{"zk", func(t testing.TB) string { return testserver.StartZooKeeper(t).URL("/dlock") + "?session_timeout=2s" }},
	{"postgres", func(t testing.TB) string { return testserver.StartPostgres(t).URL() }},
}

// candidate is one `dlock run --wait forever` process campaigning for an election.
type candidate struct {
	cmd   *exec.Cmd
	token string // the file where its command writes DLOCK_TOKEN once it leads
}

func startCandidate(t *testing.T, url, name, value string) *candidate {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	cmd := command(context.Background(), "run", "--backend", url, "--ttl", "2s", "--wait", "forever", "--quiet",
		"--value", value, name, "--", "sh", "-c", `echo "$DLOCK_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 1000`, tok)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &candidate{cmd: cmd, token: tok}
}

// leads returns the token the candidate's command saw, once it leads.
func (c *candidate) leads() (uint64, bool) {
	b, err := os.ReadFile(c.token)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// leaderJSON runs `dlock leader --json` and decodes its output.
func leaderJSON(t *testing.T, url, name string) map[string]any {
	t.Helper()
	code, out, errs := run("leader", "--backend", url, "--json", name)
	if code != 0 {
		t.Fatalf("dlock leader: exit %d: %s", code, errs)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("dlock leader --json printed %q: %v", out, err)
	}
	return m
}

// Leader election with real processes on every backend: of two `dlock run`
// candidates, one leads and publishes its value; kill -9 it, and the other leads
// within the TTL plus the backend's failover time, with a larger token, and
// `dlock leader` shows it and its value.
func TestElectionKill9(t *testing.T) {
	for _, be := range electionBackends {
		t.Run(be.name, func(t *testing.T) {
			url := be.start(t)
			name := "scheduler"
			if m := leaderJSON(t, url, name); m["leader"] != false {
				t.Fatalf("before any candidate: %v", m)
			}
			a := startCandidate(t, url, name, "host-a:8080")
			var first uint64
			waitFor(t, "the first candidate to lead", func() bool { var ok bool; first, ok = a.leads(); return ok })
			b := startCandidate(t, url, name, "host-b:8080")
			m := leaderJSON(t, url, name)
			if m["value"] != "host-a:8080" || uint64(m["token"].(float64)) != first {
				t.Fatalf("dlock leader while a leads: %v (a's token %d)", m, first)
			}
			if _, ok := b.leads(); ok {
				t.Fatal("both candidates lead")
			}
			if code, out, errs := run("inspect", "--backend", url, name); code != 0 || !strings.Contains(out, `value:   "host-a:8080"`) {
				t.Fatalf("dlock inspect: exit %d, %q %q", code, out, errs)
			}
			killed := time.Now()
			if err := a.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = a.cmd.Wait()
			var second uint64
			waitFor(t, "the second candidate to lead", func() bool { var ok bool; second, ok = b.leads(); return ok })
			took := time.Since(killed)
			t.Logf("%s: the follower led %v after the leader's kill -9 (TTL 2s)", be.name, took.Round(time.Millisecond))
			if second <= first {
				t.Fatalf("new leader's token %d not above %d", second, first)
			}
			// Liveness, not speed: within the TTL plus a generous failover allowance.
			if took > 2*time.Second+10*time.Second {
				t.Fatalf("follower led only %v after the kill", took)
			}
			m = leaderJSON(t, url, name)
			if m["value"] != "host-b:8080" || uint64(m["token"].(float64)) != second {
				t.Fatalf("dlock leader after the failover: %v (b's token %d)", m, second)
			}
		})
	}
}

// `dlock leader --watch` prints the current state, then each change.
func TestLeaderWatch(t *testing.T) {
	srv, _ := redisFor(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := command(ctx, "leader", "--backend", srv.URL(), "--watch", "--interval", "50ms", "jobs")
	out, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = w.Wait() }()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(want string) {
		t.Helper()
		select {
		case l := <-lines:
			if !strings.Contains(l, want) {
				t.Fatalf("dlock leader --watch printed %q, want %q", l, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("dlock leader --watch printed nothing; want %q", want)
		}
	}
	next("jobs: no leader")
	a := startCandidate(t, srv.URL(), "jobs", "a\nb")
	next(`value "a\nb"`)
	if err := a.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	next("jobs: no leader")
}

// partitionBackends start a real server (or several) and return a URL to it and the
// addresses in the URL that a proxy may stand in for.
var partitionBackends = []struct {
	name  string
	start func(t testing.TB) (url string, addrs []string)
}{
	{"redis", func(t testing.TB) (string, []string) {
		s := testserver.StartRedis(t)
		return s.URL(), []string{s.Addr()}
	}},
	{"redlock", func(t testing.TB) (string, []string) {
		nodes := testserver.StartRedisNodes(t, 3)
		var addrs []string
		for _, n := range nodes {
			addrs = append(addrs, n.Addr())
		}
		return testserver.RedlockURL(nodes, "node_timeout=500ms"), addrs
	}},
	{"etcd", func(t testing.TB) (string, []string) {
		s := testserver.StartEtcd(t)
		return s.URL("dlock"), []string{s.Endpoint()}
	}},
	{"zk", func(t testing.TB) (string, []string) {
		s := testserver.StartZooKeeper(t)
		return s.URL("/dlock"), []string{s.Addr()}
	}},
	{"postgres", func(t testing.TB) (string, []string) {
		s := testserver.StartPostgres(t)
		u, err := neturl.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		return s.URL(), []string{u.Host}
	}},
}

// Cut the leader's connection: its leadership context is cancelled before the
// follower leads, on every backend.
func TestElectionPartition(t *testing.T) {
	for _, be := range partitionBackends {
		t.Run(be.name, func(t *testing.T) {
			direct, addrs := be.start(t)
			toxi := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
			proxied := direct
			var proxies []*toxiproxy.Proxy
			for i, a := range addrs {
				px := toxiproxy.NewProxy(toxi, fmt.Sprint("p", i), "127.0.0.1:0", a)
				if err := px.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(px.Stop)
				proxies = append(proxies, px)
				proxied = strings.ReplaceAll(proxied, a, px.Listen)
			}
			ctx := context.Background()
			open := func(url string, ttl time.Duration) *dlock.Client {
				// A drift allowance of 10% (200ms) covers timers that fire late on
				// a busy test machine: the property is that the old leader knows
				// before the new one leads, by the margin the client is set for.
				c, err := dlock.Open(ctx, url, dlock.WithTTL(ttl), dlock.WithDrift(0.1, 0))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			// The follower's TTL does not bound when it leads (the leader's does),
			// only how long its own session or lease survives a stall of this
			// machine: with 2s, a keep-alive late by over a second under CI load
			// once ended its etcd session while it waited, and its Campaign with it.
			leader, follower := open(proxied, 2*time.Second), open(direct, 10*time.Second)
			lead, err := leader.Campaign(ctx, "p", nil)
			if err != nil {
				t.Fatal(err)
			}
			lost := make(chan time.Time, 1)
			go func() { <-lead.Done(); lost <- time.Now() }()
			led := make(chan time.Time, 1)
			var next *dlock.Leadership
			go func() {
				l, err := follower.Campaign(ctx, "p", nil)
				if err != nil {
					t.Error(err)
				}
				next = l
				led <- time.Now()
			}()
			time.Sleep(300 * time.Millisecond) // the follower queues
			cut := time.Now()
			defer func() { // heal, so that the clients close without waiting on a dead link
				for _, px := range proxies {
					for _, stream := range []string{"upstream", "downstream"} {
						_ = px.Toxics.RemoveToxic(ctx, "cut-"+stream)
					}
				}
			}()
			for _, px := range proxies {
				for _, stream := range []string{"upstream", "downstream"} {
					js := fmt.Sprintf(`{"name":"cut-%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, stream, stream)
					if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
						t.Fatal(err)
					}
				}
			}
			var lostAt, ledAt time.Time
			select {
			case lostAt = <-lost:
			case <-time.After(30 * time.Second):
				t.Fatal("the cut-off leader never learned it lost leadership")
			}
			select {
			case ledAt = <-led:
			case <-time.After(30 * time.Second):
				t.Fatal("the follower never led")
			}
			if next == nil {
				t.FailNow()
			}
			t.Logf("%s: leader knew %v after the cut, the follower led %v after it", be.name, lostAt.Sub(cut).Round(time.Millisecond), ledAt.Sub(cut).Round(time.Millisecond))
			if !lostAt.Before(ledAt) {
				t.Fatalf("the follower led %v before the old leader's context ended", lostAt.Sub(ledAt))
			}
			if !errors.Is(context.Cause(lead.Context()), dlock.ErrLeaseLost) {
				t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(lead.Context()))
			}
			_ = next.Resign(ctx)
		})
	}
}
