package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
)

func init() { register(newDemoWorkerCommand) }

// newDemoWorkerCommand is one worker process of "dlock demo". It speaks a line
// protocol with the demo: it prints "acquired <token>", "releasing", "lost <cause>"
// and "error <message>", and after each "acquired" it waits for a "go" line on stdin
// before writing. The handshake makes the demo's pause land at the same point every
// run: after the grant, before the write.
func newDemoWorkerCommand(e *env) *cobra.Command {
	var lockURL, storeURL string
	var id, rounds int
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Short:  "One worker process of dlock demo (internal)",
		Hidden: true,
		Args:   usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lockURL == "" || storeURL == "" || id < 1 || rounds < 1 || ttl <= 0 {
				return usagef("demo-worker needs --url, --store, --id, --rounds and --ttl")
			}
			return runDemoWorker(cmd.Context(), e, lockURL, storeURL, id, rounds, ttl)
		},
	}
	cmd.Flags().StringVar(&lockURL, "url", "", "lock backend `URL`")
	cmd.Flags().StringVar(&storeURL, "store", "", "fenced store `URL`")
	cmd.Flags().IntVar(&id, "id", 0, "worker number")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "times to take the lock")
	cmd.Flags().DurationVar(&ttl, "ttl", 2*time.Second, "lock TTL")
	return cmd
}

func runDemoWorker(ctx context.Context, e *env, lockURL, storeURL string, id, rounds int, ttl time.Duration) error {
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
	in := bufio.NewScanner(e.stdin)
	httpc := &http.Client{Timeout: 10 * time.Second}
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
		// can come right after the check. The store's token check is what holds.
		if err := write(ctx, httpc, storeURL, id, uint64(l.Token()), fmt.Sprintf("round %d of worker %d", round, id)); err != nil {
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

// write sends a write to the fenced store. A rejection is the store's business (the
// demo logs it); only a failure to talk to the store is an error.
func write(ctx context.Context, httpc *http.Client, storeURL string, id int, token uint64, value string) error {
	form := url.Values{"worker": {strconv.Itoa(id)}, "token": {strconv.FormatUint(token, 10)}, "value": {value}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, storeURL, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := httpc.Do(req)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		return fmt.Errorf("store: %s", resp.Status)
	}
	return nil
}
