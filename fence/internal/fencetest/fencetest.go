// Package fencetest holds the checks every fencing guard's tests run against a
// real store.
package fencetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
)

// Interleaved runs writers concurrently, each offering tokens from a shuffled list
// in which every token appears twice (a holder writing again), through write, which
// must make one guarded write that also appends its token to a log in the store. It
// then reads that log back in commit order (committed) and checks that the tokens
// there never go down, that exactly the writes that returned nil are there, and that
// every refused write got a *fence.StaleError naming a higher token.
func Interleaved(t *testing.T, workers, distinct int, write func(ctx context.Context, token uint64) error, committed func(ctx context.Context) []uint64) {
	t.Helper()
	ctx := context.Background()
	var tokens []uint64
	for i := 1; i <= distinct; i++ {
		tokens = append(tokens, uint64(i)*7, uint64(i)*7)
	}
	// Ascending, shuffled within windows of 6, so that many writes pass and many fail.
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(tokens); i += 6 {
		w := tokens[i:min(i+6, len(tokens))]
		r.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	work := make(chan uint64, len(tokens))
	for _, tk := range tokens {
		work <- tk
	}
	close(work)
	var (
		mu       sync.Mutex
		accepted []uint64
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for tk := range work {
				err := write(ctx, tk)
				var se *fence.StaleError
				switch {
				case err == nil:
					mu.Lock()
					accepted = append(accepted, tk)
					mu.Unlock()
				case errors.As(err, &se) && errors.Is(err, fence.ErrStale):
					if se.Token != tk || se.Current <= tk {
						t.Errorf("token %d refused with %v (Token %d, Current %d)", tk, err, se.Token, se.Current)
					}
				default:
					t.Errorf("token %d: unexpected error %v", tk, err)
				}
			}
		})
	}
	wg.Wait()
	log := committed(ctx)
	for i := 1; i < len(log); i++ {
		if log[i] < log[i-1] {
			t.Fatalf("committed tokens went down at %d: %v", i, log)
		}
	}
	slices.Sort(accepted)
	sorted := slices.Clone(log)
	slices.Sort(sorted)
	if !slices.Equal(sorted, accepted) {
		t.Fatalf("committed %v, but writes that returned nil: %v", log, accepted)
	}
	if max := uint64(distinct) * 7; len(log) == 0 || log[len(log)-1] != max {
		t.Fatalf("the highest token %d did not commit last: %v", max, log)
	}
	if len(log) == len(tokens) {
		t.Logf("every write passed (the schedule never interleaved): %v", log)
	}
	t.Logf("%d of %d writes committed", len(log), len(tokens))
}

// Range is the list of tokens around 2^53, 2^63 and 2^64 that guards must order
// exactly, ascending.
var Range = []uint64{1, 1<<53 - 1, 1 << 53, 1<<53 + 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, 1<<64 - 2, 1<<64 - 1}

// FullRange writes every token of Range in ascending order (each must pass, twice),
// then each lower token again after the highest (each must fail with the highest
// as Current).
func FullRange(t *testing.T, write func(ctx context.Context, token uint64) error) {
	t.Helper()
	ctx := context.Background()
	for _, tk := range Range {
		for range 2 {
			if err := write(ctx, tk); err != nil {
				t.Fatalf("token %d: %v", tk, err)
			}
		}
	}
	top := Range[len(Range)-1]
	for _, tk := range Range[:len(Range)-1] {
		err := write(ctx, tk)
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Current != top || se.Token != tk {
			t.Fatalf("token %d after %d: %v", tk, top, err)
		}
	}
}

// Measure runs op b.N times, after a short warm-up, and reports the median latency
// as the metric "p50-µs" beside Go's mean ns/op.
func Measure(b *testing.B, op func(ctx context.Context) error) {
	b.Helper()
	ctx := context.Background()
	for range 20 {
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
}

// Pair runs base and guarded alternately, b.N times each, so that both see the same
// machine load, and reports their median latencies and the ratio of the medians
// ("guarded/base"), the number docs/fencing.md quotes.
func Pair(b *testing.B, base, guarded func(ctx context.Context) error) {
	b.Helper()
	ctx := context.Background()
	ops := [2]func(context.Context) error{base, guarded}
	for range 20 {
		for _, op := range ops {
			if err := op(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	lat := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	b.ResetTimer()
	for i := range b.N {
		for j := range 2 {
			k := (i + j) % 2 // alternate which goes first
			start := time.Now()
			if err := ops[k](ctx); err != nil {
				b.Fatal(err)
			}
			lat[k] = append(lat[k], time.Since(start))
		}
	}
	b.StopTimer()
	var p50 [2]float64
	for k := range 2 {
		slices.Sort(lat[k])
		p50[k] = float64(lat[k][len(lat[k])/2].Nanoseconds()) / 1e3
	}
	b.ReportMetric(p50[0], "base-p50-µs")
	b.ReportMetric(p50[1], "guarded-p50-µs")
	b.ReportMetric(p50[1]/p50[0], "guarded/base")
}

// PausedHolder plays the pause story on a real lock: a holder of key on c writes,
// then its lease ends on the server (a force release, as its expiry would) while it
// is "paused"; a new holder takes the lock and writes; the old holder's late write
// must be refused with a *fence.StaleError naming both tokens, and the new holder's
// writes pass, again with the same token (equal tokens pass). write makes one
// guarded write of body with the lease's token. The caller then checks that the
// store holds "new, again", the last write.
func PausedHolder(t *testing.T, c *dlock.Client, key string, write func(l *dlock.Lease, body string) error) {
	t.Helper()
	ctx := context.Background()
	old, err := c.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(old, "old, before the pause"); err != nil {
		t.Fatal(err)
	}
	// The pause: the lease ends on the server while the holder sleeps.
	if err := c.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nw, err := c.Lock(lctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Release(context.Background()) })
	if nw.Token() <= old.Token() {
		t.Fatalf("tokens: old %d, new %d", old.Token(), nw.Token())
	}
	if err := write(nw, "new"); err != nil {
		t.Fatal(err)
	}
	// The old holder wakes up and writes.
	err = write(old, "old, after the pause")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Current != uint64(nw.Token()) || se.Token != uint64(old.Token()) ||
		!strings.Contains(err.Error(), strconv.FormatUint(uint64(nw.Token()), 10)) {
		t.Fatalf("late write: %v", err)
	}
	if err := write(nw, "new, again"); err != nil { // equal tokens pass
		t.Fatal(err)
	}
}
