package bench

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/mysqllock"
	_ "github.com/dlockio/dlock/pglock"
	_ "github.com/dlockio/dlock/redlock"
	_ "github.com/dlockio/dlock/zklock"
)

// TestRunPeers runs a short --peers run on every store, on real servers: every peer
// acquires, none lets two workers in at once, every dlock backend has its ratios to
// the best peer of its store, and peers stay out of a run without Peers.
func TestRunPeers(t *testing.T) {
	redis := testserver.StartRedis(t)
	nodes := testserver.StartRedisNodes(t, RedlockNodes)
	etcd := testserver.StartEtcd(t)
	zk := testserver.StartZooKeeper(t)
	pg := testserver.StartPostgres(t)
	my := testserver.StartMariaDB(t)
	cfg := short(Target{URL: redis.URL()}, Target{URL: testserver.RedlockURL(nodes, "node_timeout=1s")},
		Target{URL: etcd.URL("dlock")}, Target{URL: zk.URL("/dlock")}, Target{URL: pg.URL()}, Target{URL: my.URL()})
	cfg.Duration, cfg.Waiters, cfg.Peers = 400*time.Millisecond, []int{1}, true
	res, err := Run(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, br := range res.Backends {
		if br.Error != "" {
			t.Errorf("%s failed: %s", br.Name, br.Error)
			continue
		}
		if br.Overlaps != 0 {
			t.Errorf("%s: %d overlapping acquisitions", br.Name, br.Overlaps)
		}
		if !br.Peer {
			v := br.VsPeers
			if v == nil || !v.CycleP50.Valid() || !v.HotKey.Valid() || !v.ManyKeys.Valid() || v.CycleBest == "" || v.HotKeyBest == "" {
				t.Errorf("%s: ratios to the peers %+v", br.Name, v)
				continue
			}
			// Round by round, against the same best peer.
			if len(v.CycleP50Rounds) != cfg.Rounds || len(v.HotKeyRounds) != cfg.Rounds {
				t.Errorf("%s: ratios per round %v, %v; want %d each", br.Name, v.CycleP50Rounds, v.HotKeyRounds, cfg.Rounds)
			}
			for i, rf := range br.HotKey.Rounds {
				if rf.PerSecond <= 0 || i < len(v.HotKeyRounds) && !v.HotKeyRounds[i].Valid() {
					t.Errorf("%s: hot key round %d: %v acq/s, ratio %v", br.Name, i, rf.PerSecond, v.HotKeyRounds)
				}
			}
			continue
		}
		names = append(names, br.Name)
		if br.Cycle.Dlock.N == 0 || br.Cycle.Dlock.P50 <= 0 || br.ManyKeys.Acquisitions == 0 || br.HotKey.Acquisitions == 0 ||
			!br.HotKey.MinMax.Valid() || len(br.HotKey.Rounds) != cfg.Rounds {
			t.Errorf("peer %s: cycle %+v, many keys %+v, hot key %+v", br.Name, br.Cycle.Dlock, br.ManyKeys, br.HotKey)
		}
		if br.Floor || br.OpsSource != "" || len(br.Growth) != 0 || br.VsPeers != nil || br.can(WorkGrowth) {
			t.Errorf("peer %s has dlock-only results: %+v", br.Name, br)
		}
	}
	if len(names) != len(peerDefs) {
		t.Errorf("peers %v, want all %d", names, len(peerDefs))
	}
	md := mdString(t, res)
	for _, want := range []string{"### Beside the peers", "| redsync-5 (peer) |", "| pg-row-poll (peer) |", "| mysql-row-poll (peer) |", "| mysql-get-lock (peer) |", "hot key / best peer"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "NaN") {
		t.Errorf("markdown shows NaN:\n%s", md)
	}
	files, err := res.WriteCharts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 5 || filepath.Base(files[4]) != ChartPeers {
		t.Errorf("charts with peers: %v, want the four and %s", files, ChartPeers)
	}
	for _, f := range files {
		checkPNG(t, f)
	}
}

// TestPeersOff: without Peers, no peer runs and nothing mentions them.
func TestPeersOff(t *testing.T) {
	srv := testserver.StartRedis(t)
	cfg := short(Target{URL: srv.URL()})
	cfg.Waiters = []int{1}
	res, err := Run(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Backends) != 1 || res.Backends[0].VsPeers != nil {
		t.Fatalf("backends %+v", res.Backends)
	}
	if md := mdString(t, res); strings.Contains(md, "peer") {
		t.Errorf("markdown mentions peers:\n%s", md)
	}
}

// TestPeerCannot: a workload a peer cannot run is shown as such, not as zero.
func TestPeerCannot(t *testing.T) {
	r := &Result{Settings: Settings{Rounds: 1, Workers: 2, Keys: 1, Waiters: []int{1}},
		Backends: []*BackendResult{{Name: "p", URL: "redis://x", Store: StoreRedis, Peer: true, Cannot: []string{WorkGrowth, WorkHotKey}}}}
	md := mdString(t, r)
	if !strings.Contains(md, "| p (peer) | cannot") {
		t.Errorf("markdown:\n%s", md)
	}
}
