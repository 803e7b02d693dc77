package checker

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
)

// randomHistory is n grants over keys, in time order per key, with attempts that
// often overlap the previous grant's acquire and tokens that grow with the
// attempts (a clean history), then `swaps` token swaps and `dups` duplicated
// tokens injected at random. Leases renew and release at random, some holders
// never release, and the hold is short or long, so that P1 has work too.
func randomHistory(rng *rand.Rand, keys, n, swaps, dups int) *builder {
	holds := []time.Duration{200 * time.Microsecond, 2 * time.Millisecond, 40 * time.Millisecond}
	b := newHistory(holds[rng.IntN(len(holds))], 40*time.Millisecond, 0)
	var all [][]int // per key: indexes into b.h.Ops of the acquires
	last := 0.0
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		t := 0.0
		var idx []int
		for i := range n / keys {
			attempt := t + rng.Float64()*3
			end := attempt + 0.1 + rng.Float64()*5
			t = attempt + rng.Float64()*6
			p := 1 + rng.IntN(8)
			idx = append(idx, len(b.h.Ops))
			lb := b.grant(p, 1000*k+i+1, key, uint64(i+1), attempt-rng.Float64()*10, attempt, end)
			s := end
			for rng.IntN(3) == 0 {
				s += rng.Float64() * 30
				lb.renew(s, s+rng.Float64()*20, rng.IntN(4) != 0)
			}
			switch rng.IntN(8) {
			case 0:
				// never released
			case 1:
				s += rng.Float64() * 40
				lb.lost(s)
			default:
				s += rng.Float64() * 40
				lb.release(s, s+rng.Float64()*2, rng.IntN(6) != 0)
			}
			last = max(last, s+100)
		}
		all = append(all, idx)
	}
	b.h.Meta.End = at(last)
	pick := func() (*history.Op, *history.Op) {
		idx := all[rng.IntN(len(all))]
		return &b.h.Ops[idx[rng.IntN(len(idx))]], &b.h.Ops[idx[rng.IntN(len(idx))]]
	}
	for range swaps {
		x, y := pick()
		x.Token, y.Token = y.Token, x.Token
	}
	for range dups {
		x, y := pick()
		y.Token = x.Token
	}
	return b
}

// bruteP4 counts, in O(n²), the grants the sweep must flag.
func bruteP4(ls []*Lease) int {
	n := 0
	for _, b := range ls {
		for _, a := range ls {
			if a == b || a.Key != b.Key || a.Token == 0 || b.Token == 0 {
				continue
			}
			if a.Acquire.End < b.Attempt() && a.Token >= b.Token || a.Token == b.Token && byCall(a, b) < 0 {
				n++
				break
			}
		}
	}
	return n
}

// bruteP1 counts, in O(n²) and straight from the definition, the grants made
// inside an earlier grant's certain hold.
func bruteP1(ls []*Lease, hold int64) int {
	n := 0
	for _, g2 := range ls {
		for _, g1 := range ls {
			if g1 == g2 || g1.Key != g2.Key || g1.Acquire.End >= g2.Attempt() {
				continue
			}
			h := g1.Attempt()
			for _, r := range g1.Renews {
				if r.OK && r.End < g2.Attempt() {
					h = max(h, r.Start)
				}
			}
			h += hold
			for _, r := range g1.Releases {
				h = min(h, r.Start)
			}
			if g1.Lost != 0 {
				h = min(h, g1.Lost)
			}
			if g2.Acquire.End < h {
				n++
				break
			}
		}
	}
	return n
}

func TestRandomHistoriesAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	violations, p1 := 0, 0
	for i := range 60 {
		keys := 1 + rng.IntN(3)
		n := 20 + rng.IntN(300)
		swaps, dups := 0, 0
		switch i % 3 {
		case 1:
			swaps = 1 + rng.IntN(3)
		case 2:
			dups = 1 + rng.IntN(2)
		}
		b := randomHistory(rng, keys, n, swaps, dups)
		r := b.check(Options{PorcupineTimeout: 10 * time.Second})
		ls := Leases(&b.h)
		if want := bruteP4(ls); r.P4.Count != want {
			t.Fatalf("history %d: sweep counts %d, brute force %d", i, r.P4.Count, want)
		}
		if want := bruteP1(ls, int64(b.h.Meta.Hold)); r.P1.Count != want {
			t.Fatalf("history %d: P1 counts %d, brute force %d", i, r.P1.Count, want)
		}
		if r.P1.Count > 0 {
			p1++
		}
		want := VerdictOK
		if r.P4.Count > 0 {
			want = VerdictViolation
			violations++
		}
		if r.P4.Porcupine != want {
			t.Fatalf("history %d (%d swaps, %d dups): porcupine %s, sweep %d violations", i, swaps, dups, r.P4.Porcupine, r.P4.Count)
		}
		if swaps+dups == 0 && r.P4.Count != 0 {
			t.Fatalf("history %d: clean history has %d P4 violations: %+v", i, r.P4.Count, r.P4.Examples)
		}
	}
	t.Logf("%d histories with P4 violations, %d with P1 violations", violations, p1)
	if p1 == 0 || p1 == 60 {
		t.Fatalf("%d of 60 histories have P1 violations: the generator does not exercise P1", p1)
	}
	if violations < 20 {
		t.Fatalf("only %d of 40 injected histories had a P4 violation: the generator injects too few", violations)
	}
}

// TestP4AcrossPartitions puts one key's grants in several porcupine partitions
// and an inversion across a partition boundary: the floor operation must carry
// the earlier partition's largest token.
func TestP4AcrossPartitions(t *testing.T) {
	for _, inject := range []bool{false, true} {
		b := newHistory(hold, ttl, 0)
		n := 3*partSize + 17
		for i := range n {
			s := float64(i) * 10
			b.grant(1+i%4, i+1, "k", uint64(i+1), s, s, s+3)
		}
		if inject {
			b.h.Ops[2*partSize+5].Token = 7 // far below the tokens of the partitions before
		}
		b.h.Meta.End = at(float64(n) * 10)
		parts, _ := tokenPartitions([]string{"k"}, map[string][]*Lease{"k": Leases(&b.h)})
		if len(parts) != 4 || parts[1][0].Input != "floor" {
			t.Fatalf("%d partitions, second starts with %v", len(parts), parts[1][0].Input)
		}
		r := b.check(Options{})
		wantN, wantV := 0, VerdictOK
		if inject {
			wantN, wantV = 1, VerdictViolation
		}
		if r.P4.Count != wantN || r.P4.Porcupine != wantV {
			t.Fatalf("inject=%v: %d violations, porcupine %s", inject, r.P4.Count, r.P4.Porcupine)
		}
	}
}

func TestPorcupineVisualization(t *testing.T) {
	b := newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 5, 0, 0, 1)
	b.grant(2, 1, "k", 3, 0, 10, 11)
	path := filepath.Join(t.TempDir(), "p4.html")
	r := b.check(Options{PorcupineHTML: path})
	if r.P4.PorcupineHTML != path {
		t.Fatalf("no visualization: %+v notes %q", r.P4, r.Notes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "w2 l1: token 3") {
		t.Fatalf("visualization lacks the offending grant (%d bytes)", len(data))
	}
	// No file for a clean history.
	path2 := filepath.Join(t.TempDir(), "clean.html")
	b = newHistory(hold, ttl, 1000)
	b.grant(1, 1, "k", 3, 0, 0, 1)
	if r := b.check(Options{PorcupineHTML: path2}); r.P4.PorcupineHTML != "" {
		t.Fatalf("visualization for a clean history: %+v", r.P4)
	}
	if _, err := os.Stat(path2); !os.IsNotExist(err) {
		t.Fatalf("stat: %v", err)
	}
}

// largeHistory is a clean run of n grants over keys keys, sequential per key,
// each renewed and released, with a write each.
func largeHistory(n, keys int) *history.History {
	b := newHistory(hold, ttl, 0)
	t := make([]float64, keys)
	for i := range n {
		k := i % keys
		s := t[k]
		lb := b.grant(1+i%16, i+1, fmt.Sprintf("k%d", k), uint64(i+1), s-5, s, s+1)
		lb.renew(s+2, s+3, true).write(s+4, true, uint64(i)).release(s+5, s+6, true)
		t[k] = s + 7
	}
	b.h.Meta.End = at(t[0] + 10)
	return &b.h
}

func TestLargeHistory(t *testing.T) {
	h := largeHistory(100_000, 8)
	r := Check(h, Options{})
	if !r.Safe() || r.P4.Porcupine != VerdictOK || r.Summary.AcquiresOK != 100_000 || r.LostReleases.Count != 0 {
		t.Fatalf("report %+v", r)
	}
}

func BenchmarkCheck100k(b *testing.B) {
	h := largeHistory(100_000, 8)
	for b.Loop() {
		Check(h, Options{})
	}
}
