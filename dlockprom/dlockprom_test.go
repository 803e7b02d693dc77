package dlockprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dlockio/dlock/dlockprom"
	"github.com/dlockio/dlock/internal/obstest"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/redislock"
)

// The scripted run on a real Redis server gives exactly these series (histograms
// by their sample counts).
func TestScriptedRun(t *testing.T) {
	srv := testserver.StartRedis(t)
	m := dlockprom.New(dlockprom.WithKeys(func(k string) string { p, _, _ := strings.Cut(k, ":"); return p }))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	obstest.Run(t, srv.URL(), m)

	const labels = `backend="redislock",key="order",mode="exclusive"`
	want := `
# HELP dlock_lease_losses_total Leases that may have been lost.
# TYPE dlock_lease_losses_total counter
dlock_lease_losses_total{` + labels + `} 1
# HELP dlock_lease_renewals_total Lease renewals, by result.
# TYPE dlock_lease_renewals_total counter
dlock_lease_renewals_total{` + labels + `,result="ok"} 1
# HELP dlock_leases_active Grants held now.
# TYPE dlock_leases_active gauge
dlock_leases_active{` + labels + `} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dlock_lease_losses_total", "dlock_lease_renewals_total", "dlock_leases_active"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			if h := mt.GetHistogram(); h != nil {
				var kv []string
				for _, lp := range mt.GetLabel() {
					kv = append(kv, lp.GetName()+"="+lp.GetValue())
				}
				counts[mf.GetName()+"{"+strings.Join(kv, ",")+"}"] = h.GetSampleCount()
			}
		}
	}
	const l = "backend=redislock,key=order,mode=exclusive" // labels sorted by name
	wantCounts := map[string]uint64{
		"dlock_lock_acquire_duration_seconds{" + l + ",result=granted}":                         2,
		"dlock_lock_wait_duration_seconds{" + l + ",result=granted}":                            1,
		"dlock_lease_duration_seconds{backend=redislock,end=released,key=order,mode=exclusive}": 1,
		"dlock_lease_duration_seconds{backend=redislock,end=lost,key=order,mode=exclusive}":     1,
	}
	if len(counts) != len(wantCounts) {
		t.Errorf("histogram series %v, want %v", counts, wantCounts)
	}
	for k, n := range wantCounts {
		if counts[k] != n {
			t.Errorf("%s: %d samples, want %d", k, counts[k], n)
		}
	}
	if n := testutil.CollectAndCount(m); n != 7 {
		t.Errorf("%d series in all, want 7", n)
	}
}

// Without WithKeys there is no key label; a namespace prefixes every name.
func TestNoKeyNamespace(t *testing.T) {
	srv := testserver.StartRedis(t)
	m := dlockprom.New(dlockprom.WithNamespace("app"))
	obstest.Run(t, srv.URL(), m)
	want := `
# HELP app_dlock_lease_losses_total Leases that may have been lost.
# TYPE app_dlock_lease_losses_total counter
app_dlock_lease_losses_total{backend="redislock",mode="exclusive"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "app_dlock_lease_losses_total"); err != nil {
		t.Error(err)
	}
}
