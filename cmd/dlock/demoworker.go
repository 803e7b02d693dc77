package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/fence/etcdfence"
)

func init() { register(newDemoWorkerCommand) }

// newDemoWorkerCommand is one worker process of "dlock demo". It speaks a line
// protocol with the demo: it prints "acquired <token>", "accepted <token>",
// "rejected <token> <newer token>", "releasing", "lost <cause>" and "error
// <message>", and after each "acquired" it waits for a "go" line on stdin before
// writing. The write goes to the demo's etcd through etcdfence. The handshake makes the demo's pause land at the same point every
// run: after the grant, before the write.
func newDemoWorkerCommand(e *env) *cobra.Command {
	var lockURL, endpoint string
	var id, rounds int
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Short:  "One worker process of dlock demo (internal)",
		Hidden: true,
		Args:   usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lockURL == "" || endpoint == "" || id < 1 || rounds < 1 || ttl <= 0 {
				return usagef("demo-worker needs --url, --etcd, --id, --rounds and --ttl")
			}
			return runDemoWorker(cmd.Context(), e, lockURL, endpoint, id, rounds, ttl)
		},
	}
	cmd.Flags().StringVar(&lockURL, "url", "", "lock backend `URL`")
	cmd.Flags().StringVar(&endpoint, "etcd", "", "`HOST:PORT` of the etcd that holds the protected value")
	cmd.Flags().IntVar(&id, "id", 0, "worker number")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "times to take the lock")
	cmd.Flags().DurationVar(&ttl, "ttl", 2*time.Second, "lock TTL")
	return cmd
}

func runDemoWorker(ctx context.Context, e *env, lockURL, endpoint string, id, rounds int, ttl time.Duration) error {
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(e.stdout, format+"\n", a...)
	}
	c, err := dlock.Open(ctx, lockURL, dlock.WithTTL(ttl))
	if err != nil {
		say("error %v", oneLine(err))
		return err
	}
	defer c.Close()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		say("error %v", oneLine(err))
		return err
	}
	defer etcd.Close()
	in := bufio.NewScanner(e.stdin)
	var watchers sync.WaitGroup
	defer watchers.Wait()
	for round := 1; round <= rounds; round++ {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		l, err := c.Lock(lctx, "demo")
		cancel()
		if err != nil {
			say("error %v", oneLine(err))
			return err
		}
		watchers.Go(func() {
			<-l.Done()
			if cause := context.Cause(l.Context()); errors.Is(cause, dlock.ErrLeaseLost) {
				say("lost %v", oneLine(cause))
			}
		})
		say("acquired %d", l.Token())
		if !in.Scan() {
			return errors.New("demo-worker: the demo closed stdin")
		}
		// A careful program checks l.Context() here, before writing, but a pause
		// can come right after the check. The guard's token check is what holds.
		tok := uint64(l.Token())
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = etcdfence.New(etcd, demoFenceKey, tok).
			Then(clientv3.OpPut(demoValueKey, fmt.Sprintf("round %d of worker %d, token %d", round, id, tok))).
			Commit(wctx)
		cancel()
		var stale *fence.StaleError
		switch {
		case err == nil:
			say("accepted %d", tok)
		case errors.As(err, &stale):
			say("rejected %d %d", tok, stale.Current)
		default:
			say("error %v", oneLine(err))
			return err
		}
		time.Sleep(100 * time.Millisecond) // the rest of the work
		if l.Err() == nil {
			say("releasing") // before the release, so that it shows before the next grant
		}
		if err := l.Release(ctx); err != nil && !errors.Is(err, dlock.ErrLeaseLost) {
			say("error %v", oneLine(err))
			return err
		}
	}
	return nil
}

// The demo's protected resource in its etcd: a value, and the fence key that
// etcdfence compares and moves in the same transaction.
const (
	demoValueKey = "dlock-demo/value"
	demoFenceKey = "dlock-demo/fence"
)
