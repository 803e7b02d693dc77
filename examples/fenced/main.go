// Command fenced shows a lock and its fencing tokens at work: workers take turns
// under one lock and write to a store that rejects stale tokens; one worker is
// paused past its lease (as a long GC pause would), and its late write is rejected.
//
//	go run ./examples/fenced                      # in-process backend
//	go run ./examples/fenced redis://127.0.0.1:6379/0
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	_ "github.com/dlockio/dlock/all"
)

// store is a resource that accepts a write only with a token at least as large as
// every token it has accepted: the check that makes fencing work.
type store struct {
	mu      sync.Mutex
	highest dlock.Token
	value   string
}

func (s *store) write(tok dlock.Token, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tok < s.highest {
		return fmt.Errorf("rejected: token %d is older than %d", tok, s.highest)
	}
	s.highest, s.value = tok, v
	return nil
}

func main() {
	url := "mem://fenced-example"
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	ctx := context.Background()
	start := time.Now()
	logf := func(format string, a ...any) {
		fmt.Printf("%6.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	st := &store{}
	var wg sync.WaitGroup
	var rejected, accepted int
	var mu sync.Mutex
	for w := range 3 {
		c, err := dlock.Open(ctx, url, dlock.WithTTL(300*time.Millisecond))
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			for round := range 3 {
				l, err := c.Lock(ctx, "report")
				if err != nil {
					log.Fatal(err)
				}
				logf("worker %d holds the lock, token %d", w, l.Token())
				if w == 0 && round == 0 {
					// Simulate a pause: the lease is lost meanwhile, and the
					// lock goes to someone else. (Renewal is still running in this
					// process, so we drop the lease on purpose to imitate a
					// frozen process whose renewals stopped.)
					logf("worker %d pauses for 1s (its lease is 300ms)", w)
					pausedTok := l.Token()
					_ = l.Release(ctx)
					time.Sleep(time.Second)
					err := st.write(pausedTok, fmt.Sprintf("late write by worker %d", w))
					mu.Lock()
					if err != nil {
						rejected++
					}
					mu.Unlock()
					logf("worker %d wakes and writes with token %d: %v", w, pausedTok, errOr(err, "accepted"))
					continue
				}
				err = st.write(l.Token(), fmt.Sprintf("worker %d round %d", w, round))
				mu.Lock()
				if err == nil {
					accepted++
				}
				mu.Unlock()
				logf("worker %d writes with token %d: %v", w, l.Token(), errOr(err, "accepted"))
				time.Sleep(50 * time.Millisecond)
				if err := l.Release(ctx); err != nil && !errors.Is(err, dlock.ErrLeaseLost) {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("done: %d writes accepted, %d stale write(s) rejected by fencing\n", accepted, rejected)
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}
