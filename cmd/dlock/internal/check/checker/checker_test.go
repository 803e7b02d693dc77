package checker

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	hold = 100 * time.Millisecond
	ttl  = 100 * time.Millisecond
)

func wantCount(t *testing.T, name string, r Result, n int) {
	t.Helper()
	if r.Count != n {
		t.Fatalf("%s: count %d, want %d; examples: %+v", name, r.Count, n, r.Examples)
	}
	if len(r.Examples) != min(n, 5) {
		t.Fatalf("%s: %d examples for count %d", name, len(r.Examples), n)
	}
}

func TestP1CleanHandoff(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).write(5, true, 0).release(50, 51, true)
	b.grant(2, 1, "k", 2, 10, 52, 53).release(60, 61, true)     // waited, granted after the release began
	b.grant(3, 1, "k", 3, 10, 200, 201).release(210, 211, true) // granted after everything
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 0)
	if !r.Safe() {
		t.Fatalf("clean history not safe: %+v", r)
	}
}

func TestP1GrantInsideHold(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1) // never released: held until 100
	b.grant(2, 1, "k", 2, 5, 10, 20)
	b.grant(3, 1, "other", 3, 5, 10, 20) // another key
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 1)
	v := r.P1.Examples[0]
	if v.Key != "k" || !slices.Equal(v.Processes, []int{2, 1}) || !slices.Equal(v.Tokens, []uint64{2, 1}) ||
		v.Time != at(20) || v.End != at(100) {
		t.Fatalf("violation %+v", v)
	}
	for _, s := range []string{"worker 2 lease 1 (token 2)", "worker 1 lease 1 (token 1)", "10.0 ms", "20.0 ms", "until 100.0 ms"} {
		if !strings.Contains(v.Detail, s) {
			t.Errorf("detail %q lacks %q", v.Detail, s)
		}
	}
	if r.Safe() {
		t.Fatal("Safe with a P1 violation")
	}
}

func TestP1EndsAtHold(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1)
	b.grant(2, 1, "k", 2, 5, 90, 100) // returned exactly at the end of the hold: not certain
	b.grant(3, 1, "j", 3, 0, 0, 1)
	b.grant(4, 1, "j", 4, 0, 0.5, 2) // attempt overlaps the first acquire: not ordered
	wantCount(t, "P1", b.check(Options{}).P1, 0)
}

func TestP1RenewalExtendsHold(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).renew(80, 81, true) // held until 180
	b.grant(2, 1, "k", 2, 5, 120, 130)
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 1)
	if v := r.P1.Examples[0]; v.End != at(180) || !strings.Contains(v.Detail, "renewal sent at 80.0 ms") {
		t.Fatalf("violation %+v", v)
	}

	// A failed renewal proves nothing; nor does one that returned after the
	// second attempt began (it may have reached the server after the grant).
	for _, renew := range []func(*leaseBuilder){
		func(l *leaseBuilder) { l.renew(80, 81, false) },
		func(l *leaseBuilder) { l.renew(80, 125, true) },
	} {
		b := newHistory(hold, ttl, 1000)
		renew(b.grant(1, 1, "k", 1, 0, 0, 1))
		b.grant(2, 1, "k", 2, 5, 120, 130)
		wantCount(t, "P1", b.check(Options{}).P1, 0)
	}
}

func TestP1ReleaseAttemptEndsHold(t *testing.T) {
	// A release call that failed still ends the certain hold when it began: the
	// server may have deleted the key before the reply was lost.
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).release(30, 31, false)
	b.grant(2, 1, "k", 2, 5, 40, 41)
	wantCount(t, "P1", b.check(Options{}).P1, 0)

	b = newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).release(30, 31, false)
	b.grant(2, 1, "k", 2, 5, 20, 25) // granted before the release began
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 1)
	if v := r.P1.Examples[0]; v.End != at(30) || !strings.Contains(v.Detail, "release call began at 30.0 ms") {
		t.Fatalf("violation %+v", v)
	}
}

// A lease its client declared lost ends its certain hold there, like a release
// call: a grant after the loss is not a violation, one before it is.
func TestP1LossEndsHold(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).lost(30)
	b.grant(2, 1, "k", 2, 5, 40, 41)
	wantCount(t, "P1", b.check(Options{}).P1, 0)

	b = newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).lost(30)
	b.grant(2, 1, "k", 2, 5, 20, 25) // granted before the client knew
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 1)
	if v := r.P1.Examples[0]; v.End != at(30) || !strings.Contains(v.Detail, "declared it lost at 30.0 ms") {
		t.Fatalf("violation %+v", v)
	}
}

func TestP1CountsEachGrantOnce(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1)
	b.grant(2, 1, "k", 2, 0, 2, 3)
	b.grant(3, 1, "k", 3, 0, 4, 5) // inside both holds: counted once
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 2)
	// The example names the earlier grant held the longest (here: the latest).
	if v := r.P1.Examples[1]; !slices.Equal(v.Processes, []int{3, 2}) {
		t.Fatalf("second violation %+v", v)
	}
}

func TestP1NoHold(t *testing.T) {
	b := newHistory(0, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1)
	b.grant(2, 1, "k", 2, 5, 10, 20)
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 0)
	if len(r.Notes) == 0 || !strings.Contains(r.Notes[0], "Hold is 0") {
		t.Fatalf("notes %q", r.Notes)
	}
}

func TestP3(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 5, 0, 0, 1).write(2, true, 0).write(3, true, 5).release(4, 5, true)
	b.grant(2, 1, "k", 3, 0, 0, 1).write(6, false, 5) // fenced: rejected
	b.grant(3, 1, "k", 2, 0, 0, 1).write(7, true, 5)  // unfenced: accepted, stale
	r := b.check(Options{PorcupineTimeout: -1})
	wantCount(t, "P3", r.P3.Result, 1)
	if r.P3.Writes != 4 || r.P3.Accepted != 3 || r.P3.Rejected != 1 {
		t.Fatalf("P3 totals %+v", r.P3)
	}
	v := r.P3.Examples[0]
	if v.Time != at(7.05) || !slices.Equal(v.Tokens, []uint64{2, 5}) || !strings.Contains(v.Detail, "token 2") ||
		!strings.Contains(v.Detail, "sent it at 7.0 ms, while its client still held the lease, 50µs before") {
		t.Fatalf("violation %+v", v)
	}
}

// A stale write sent after the client declared its lease lost says so.
func TestP3SentAfterLoss(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 5, 0, 0, 1).write(2, true, 0).release(4, 5, true)
	b.grant(2, 1, "k", 2, 0, 0, 1).lost(6).write(7, true, 5)
	r := b.check(Options{PorcupineTimeout: -1})
	wantCount(t, "P3", r.P3.Result, 1)
	if d := r.P3.Examples[0].Detail; !strings.Contains(d, "after its client had declared the lease lost") {
		t.Fatalf("detail %q", d)
	}
}

func TestP4(t *testing.T) {
	cases := []struct {
		name  string
		build func(b *builder)
		count int
	}{
		{"increasing", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 1)
			b.grant(2, 1, "k", 7, 0, 10, 11)
			b.grant(1, 2, "k", 9, 0, 20, 21)
			b.grant(2, 2, "j", 1, 0, 20, 21) // other key, own order
		}, 0},
		{"inversion", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 1)
			b.grant(2, 1, "k", 3, 0, 10, 11)
			b.grant(1, 2, "k", 4, 0, 20, 21) // smaller than 5, which ended before
		}, 2},
		{"concurrent inversion is not ordered", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 10)
			b.grant(2, 1, "k", 3, 0, 5, 11)
		}, 0},
		{"touching intervals are concurrent", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 10)
			b.grant(2, 1, "k", 3, 0, 10, 11)
		}, 0},
		{"equal tokens in order", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 1)
			b.grant(2, 1, "k", 5, 0, 10, 11)
		}, 1},
		{"equal tokens concurrent", func(b *builder) {
			b.grant(1, 1, "k", 5, 0, 0, 10)
			b.grant(2, 1, "k", 5, 0, 5, 11)
		}, 1},
		{"zero tokens are not checked", func(b *builder) {
			b.grant(1, 1, "k", 0, 0, 0, 1)
			b.grant(2, 1, "k", 0, 0, 10, 11)
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHistory(time.Millisecond, ttl, 1000) // short hold: no P1 violation
			tc.build(b)
			r := b.check(Options{})
			wantCount(t, "P1", r.P1, 0)
			wantCount(t, "P4", r.P4.Result, tc.count)
			want := VerdictOK
			if tc.count > 0 {
				want = VerdictViolation
			}
			if r.P4.Porcupine != want {
				t.Fatalf("porcupine %s, want %s", r.P4.Porcupine, want)
			}
			if r.Safe() != (tc.count == 0) {
				t.Fatalf("Safe() = %v with %d P4 violations", r.Safe(), tc.count)
			}
		})
	}
}

func TestP4Example(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 5, 0, 0, 1)
	b.grant(1, 2, "k", 8, 0, 2, 3)
	b.grant(2, 1, "k", 6, 0, 10, 11) // 8 ended before
	b.grant(3, 1, "k", 0, 0, 20, 21)
	r := b.check(Options{})
	wantCount(t, "P4", r.P4.Result, 1)
	if r.P4.Grants != 3 || r.P4.ZeroToken != 1 {
		t.Fatalf("P4 %+v", r.P4)
	}
	v := r.P4.Examples[0]
	if !slices.Equal(v.Processes, []int{2, 1}) || !slices.Equal(v.Leases, []int{1, 2}) || !slices.Equal(v.Tokens, []uint64{6, 8}) ||
		!strings.Contains(v.Detail, "worker 1 lease 2 (token 8) had been granted it by 3.0 ms") {
		t.Fatalf("violation %+v", v)
	}
}

func TestP5(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	l := b.grant(1, 1, "k", 1, 0, 0, 1)
	l.write(49.95, true, 0).write(109.95, false, 2).write(129.95, true, 1).write(399.95, true, 1)
	b.event(history.Fault, "kill", "redis", 80)
	b.event(history.Heal, "kill", "redis", 100)
	b.event(history.Fault, "pause", "worker 1", 900)
	b.event(history.Heal, "pause", "worker 1", 950)
	r := b.check(Options{})
	p := r.P5
	if len(p.Recoveries) != 2 || p.Recoveries[0].After != 30*time.Millisecond || p.Recoveries[0].Write != at(130) {
		t.Fatalf("recoveries %+v", p.Recoveries)
	}
	if p.Recoveries[1].Write != 0 || p.Recoveries[1].After != 50*time.Millisecond || p.Unrecovered != 1 || p.MaxRecovery != 50*time.Millisecond {
		t.Fatalf("P5 %+v", p)
	}
	if p.LongestGap != 600*time.Millisecond || p.GapStart != at(400) || p.GapEnd != at(1000) {
		t.Fatalf("gap %v from %d to %d", p.LongestGap, p.GapStart, p.GapEnd)
	}
	if r.Summary.Faults != 2 {
		t.Fatalf("summary %+v", r.Summary)
	}
}

func TestLostRelease(t *testing.T) {
	cases := []struct {
		name  string
		build func(b *builder)
		count int
	}{
		{"released, yet a waiter is refused", func(b *builder) {
			b.grant(1, 1, "k", 1, 0, 0, 1).release(10, 11, true)
			b.failed(2, "k", 20, 500, errHeld)
		}, 1},
		{"a holder that renews is live", func(b *builder) {
			b.grant(1, 1, "k", 1, 0, 0, 1).renew(300, 401, true)
			b.failed(2, "k", 20, 500, errHeld)
		}, 0},
		{"a failed renewal may have extended the grant", func(b *builder) {
			b.grant(1, 1, "k", 1, 0, 0, 1).renew(300, 401, false)
			b.failed(2, "k", 20, 500, errHeld)
		}, 0},
		{"a holder that never released expires", func(b *builder) {
			b.grant(1, 1, "k", 1, 0, 0, 1).lost(50)
			b.failed(2, "k", 20, 500, errHeld)
		}, 1},
		{"another key's holder does not count", func(b *builder) {
			b.grant(1, 1, "j", 1, 0, 0, 1).renew(300, 401, true)
			b.failed(2, "k", 20, 500, errHeld)
		}, 1},
		{"a server that is down is not a lost release", func(b *builder) {
			b.event(history.Fault, "kill", "redis", 50)
			b.event(history.Heal, "kill", "redis", 60)
			b.failed(2, "k", 150, 500, errHeld) // within heal + slack
		}, 0},
		{"long after the heal", func(b *builder) {
			b.event(history.Fault, "kill", "redis", 50)
			b.event(history.Heal, "kill", "redis", 60)
			b.failed(2, "k", 170, 500, errHeld)
		}, 1},
		{"a fault that never heals", func(b *builder) {
			b.event(history.Fault, "kill", "redis", 700)
			b.failed(2, "k", 20, 800, errHeld)
		}, 0},
		{"a failed acquire of unknown outcome may hold the key", func(b *builder) {
			b.failed(1, "k", 15, 30, errUnknown) // possibly live until 130
			b.failed(2, "k", 20, 500, errHeld)
		}, 0},
		{"... but only for a TTL", func(b *builder) {
			b.failed(1, "k", 15, 18, errUnknown) // possibly live until 118
			b.failed(2, "k", 20, 500, errHeld)
		}, 1},
		{"a short wait proves nothing", func(b *builder) {
			b.failed(2, "k", 20, 119, errHeld)
		}, 0},
		{"failures that are not waits are not lost releases", func(b *builder) {
			b.failed(2, "k", 20, 500, errUnknown)
		}, 0},
	}
	for _, tc := range cases {
		for _, old := range []bool{false, true} {
			name := tc.name
			if old {
				name += " (history without Op.Held)"
			}
			t.Run(name, func(t *testing.T) {
				b := newHistory(hold, ttl, 1000)
				tc.build(b)
				if old {
					b.h.Meta.HeldRecorded = false
					for i := range b.h.Ops {
						b.h.Ops[i].Held = false
					}
				}
				r := b.check(Options{})
				wantCount(t, "lost releases", r.LostReleases, tc.count)
				if tc.count > 0 {
					v := r.LostReleases.Examples[0]
					if v.Key != "k" || v.Time >= v.End || !strings.Contains(v.Detail, "Worker 2 waited for key k") {
						t.Fatalf("violation %+v", v)
					}
				}
				if !r.Safe() {
					t.Fatal("lost releases are not a safety violation")
				}
			})
		}
	}
}

// With Op.Held recorded, the flag decides, not the error text.
func TestLostReleaseHeldFlag(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).release(10, 11, true)
	b.failedHeld(2, "k", 20, 500, "redlock: acquire \"k\": no majority: 2 of 5 nodes ok (need 3), 3 held", true)
	b.grant(1, 2, "j", 2, 0, 0, 1).release(10, 11, true)
	b.failedHeld(3, "j", 20, 500, errHeld, false) // a "held" text that is not a held failure
	r := b.check(Options{})
	wantCount(t, "lost releases", r.LostReleases, 1)
	if v := r.LostReleases.Examples[0]; v.Key != "k" {
		t.Fatalf("violation %+v", v)
	}
}

func TestLostReleaseSlack(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).release(10, 11, true)
	b.failed(2, "k", 20, 500, errHeld)
	wantCount(t, "lost releases", b.check(Options{Slack: 490 * time.Millisecond}).LostReleases, 0)
	r := b.check(Options{Slack: 400 * time.Millisecond})
	wantCount(t, "lost releases", r.LostReleases, 1)
	if v := r.LostReleases.Examples[0]; v.Time != at(420) || v.End != at(500) {
		t.Fatalf("violation %+v", v)
	}
}

func TestFaultWindows(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.event(history.Fault, "pause", "worker 1", 10)
	b.event(history.Fault, "kill", "redis", 20)
	b.event(history.Note, "", "", 25)
	b.event(history.Heal, "kill", "redis", 30)
	b.event(history.Heal, "pause", "worker 1", 40)
	b.event(history.Fault, "partition", "redis", 50)
	b.event(history.Heal, "other", "x", 60) // heals the partition: the only heal left
	b.event(history.Fault, "kill", "redis", 900)
	got := FaultWindows(&b.h)
	want := []FaultWindow{
		{Fault: "pause", Target: "worker 1", Start: at(10), End: at(40), Healed: true},
		{Fault: "kill", Target: "redis", Start: at(20), End: at(30), Healed: true},
		{Fault: "partition", Target: "redis", Start: at(50), End: at(60), Healed: true},
		{Fault: "kill", Target: "redis", Start: at(900), End: at(1000)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("windows\n got %+v\nwant %+v", got, want)
	}
}

func TestSummaryAndJSON(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 1, 0, 0, 1).renew(30, 31, true).renew(60, 61, false).lost(62).release(70, 71, false)
	b.grant(2, 1, "k", 2, 0, 100, 101).release(110, 111, true)
	b.failed(3, "k", 0, 50, errHeld)
	b.event(history.Fault, "kill", "redis", 55)
	r := b.check(Options{})
	want := Summary{Duration: time.Second, AcquiresOK: 2, AcquiresFailed: 1, Leases: 2, LeasesLost: 1,
		Renewals: 2, RenewalsFailed: 1, Releases: 2, ReleasesFailed: 1, Faults: 1}
	if r.Summary != want {
		t.Fatalf("summary %+v, want %+v", r.Summary, want)
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary != r.Summary || back.P4.Porcupine != r.P4.Porcupine {
		t.Fatalf("JSON round trip: %s", js)
	}
	ls := Leases(&b.h)
	if len(ls) != 2 || ls[0].Outcome() != "lost" || ls[0].LastKnown() != at(62) || ls[1].Outcome() != "released" || ls[1].LastKnown() != at(111) {
		t.Fatalf("leases %+v", ls)
	}
}

func TestP1ExamplesInTimeOrder(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "a", 1, 0, 300, 301)
	b.grant(2, 1, "a", 2, 0, 310, 320) // later, on the first key in order
	b.grant(3, 1, "b", 3, 0, 0, 1)
	b.grant(4, 1, "b", 4, 0, 10, 20)
	r := b.check(Options{})
	wantCount(t, "P1", r.P1, 2)
	if r.P1.Examples[0].Key != "b" || r.P1.Examples[1].Key != "a" {
		t.Fatalf("examples not in time order: %+v", r.P1.Examples)
	}
}

// With a semaphore of 2, two overlapping holders are fine; a third granted while
// both are certainly held violates P1; P3 is not checked.
func TestP1Semaphore(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.h.Meta.Limit = 2
	b.grant(1, 1, "k", 1, 0, 0, 1)
	b.grant(2, 1, "k", 2, 5, 10, 20) // the second permit
	r := b.check(Options{})
	wantCount(t, "P1 with 2 holders of 2", r.P1, 0)
	if !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "P3: a semaphore") }) {
		t.Errorf("notes %q do not say P3 was skipped", r.Notes)
	}
	b.grant(3, 1, "k", 3, 25, 30, 40) // a third, inside both holds
	r = b.check(Options{})
	wantCount(t, "P1 with 3 holders of 2", r.P1, 1)
	if v := r.P1.Examples[0]; !slices.Equal(v.Processes, []int{3, 2}) || !strings.Contains(v.Detail, "3 holders, more than the key's 2 permits") {
		t.Fatalf("violation %+v", v)
	}
}

// A read-write lock: readers beside readers are fine; a writer granted beside a
// reader violates P1, as does a reader beside a writer.
func TestP1ReadWrite(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.h.Meta.RW = true
	b.grant(1, 1, "k", 1, 0, 0, 1)
	b.grant(2, 1, "k", 2, 5, 10, 20)
	b.grant(3, 1, "k", 3, 25, 30, 40)
	for i := range b.h.Ops {
		b.h.Ops[i].Shared = true // three readers
	}
	wantCount(t, "P1 with readers only", b.check(Options{}).P1, 0)
	b.grant(4, 1, "k", 4, 45, 50, 60) // a writer among them
	r := b.check(Options{})
	wantCount(t, "P1 with a writer beside readers", r.P1, 1)
	if v := r.P1.Examples[0]; v.Processes[0] != 4 || !strings.Contains(v.Detail, "The new grant was a writer's, the earlier one a reader's.") {
		t.Fatalf("violation %+v", v)
	}
}

// In a read-write lock, readers promoted together may learn of their grants out of
// token order; a reader granted after a writer, or a writer after anyone, must
// still have the larger token.
func TestP4ReadWrite(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.h.Meta.RW = true
	b.grant(1, 1, "k", 31, 0, 10, 20) // a reader told first
	b.grant(2, 1, "k", 27, 0, 25, 30) // a reader queued earlier, told later
	for i := range b.h.Ops {
		b.h.Ops[i].Shared = true
	}
	r := b.check(Options{})
	wantCount(t, "P4 of readers out of order", r.P4.Result, 0)
	b.grant(3, 1, "k", 29, 40, 50, 60) // a writer after both, with a smaller token
	r = b.check(Options{})
	wantCount(t, "P4 of a writer below a reader", r.P4.Result, 1)
	if r.P4.Porcupine != VerdictSkipped {
		t.Errorf("porcupine %q on a read-write history", r.P4.Porcupine)
	}
}

// In a read-write lock, readers whose acquires overlapped may share a token
// (Redlock's readers draw theirs together); a reader that began after the other
// ended, or a writer, may not.
func TestP4ReadersShareToken(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.h.Meta.RW = true
	b.grant(1, 1, "k", 7, 0, 0, 10)
	b.grant(2, 1, "k", 7, 0, 5, 15) // overlapping the first
	for i := range b.h.Ops {
		b.h.Ops[i].Shared = true
	}
	wantCount(t, "P4 of overlapping readers with one token", b.check(Options{}).P4.Result, 0)
	b.grant(3, 1, "k", 9, 20, 20, 30)
	b.grant(4, 1, "k", 9, 20, 35, 40) // began after the third ended
	b.h.Ops[len(b.h.Ops)-1].Shared, b.h.Ops[len(b.h.Ops)-2].Shared = true, true
	b.grant(5, 1, "k", 11, 45, 45, 50)
	b.grant(6, 1, "k", 11, 45, 46, 55) // a writer beside a reader's token
	b.h.Ops[len(b.h.Ops)-2].Shared = true
	r := b.check(Options{})
	wantCount(t, "P4 of a later reader and of a writer sharing a token", r.P4.Result, 2)
	b.h.Meta.RW = false
	wantCount(t, "P4 of shared tokens in a mutex history", b.check(Options{}).P4.Result, 3)
}
