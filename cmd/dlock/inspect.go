package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newInspectCommand) }

func newInspectCommand(e *env) *cobra.Command {
	var (
		backend *string
		asJSON  bool
		watch   bool
		every   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "inspect [flags] KEY",
		Short: "Show who holds a lock",
		Long: `Inspect shows the holder of KEY: its owner id, fencing token, the time left
before the server expires the grant unless renewed, and the number of queued
waiters (-1 when the backend cannot tell), and the value the holder stored with it
(dlock run --value, or a program's WithValue or Campaign), if any. A free key is
reported as free (exit 0). A semaphore (dlock run --limit N) and a read-write lock
held by readers (dlock run --shared) show the limit and every holder, oldest first.
Where the backend lists its queue, every waiter is shown in the order it will be
served, readers (--shared) marked.

With --watch, inspect prints the state again, after a line with the time, whenever
the holders, their tokens or values, or the queue change, until interrupted.
` + passwordHelp,
		Example: `  dlock inspect --backend redis://127.0.0.1:6379/0 nightly-report
  dlock inspect --json deploy
  dlock inspect --watch deploy`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := driver.ValidateKey(args[0]); err != nil {
				return usageError{err}
			}
			c, err := openBackend(cmd, *backend)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if !watch {
				snap, err := inspectKey(ctx, c, args[0])
				if err != nil {
					return exitCodeError{code: 69, err: err}
				}
				return snap.print(e.stdout, asJSON, false)
			}
			if every <= 0 {
				return usagef("--interval must be positive, got %v", every)
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchKey(ctx, c, args[0], every, e.stdout, asJSON)
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per line with --watch)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print the key's state again at every change of holder, token, value or queue, until interrupted")
	cmd.Flags().DurationVar(&every, "interval", dlock.DefaultObserveInterval, "with --watch, how often to read the key besides the holder changes the backend signals")
	return cmd
}

// snapshot is what inspect shows of a key.
type snapshot struct {
	key     string
	held    bool
	info    dlock.Info   // the holder, for a plain lock
	limit   int          // for a semaphore or readers: the limit and every holder
	holders []dlock.Info // nil for a plain lock
	queue   []dlock.Info // nil where the backend does not list it
}

// inspectKey reads the holder(s) of key and, where the backend lists it, its queue.
func inspectKey(ctx context.Context, c *dlock.Client, key string) (snapshot, error) {
	s := snapshot{key: key}
	queue, err := c.Waiters(ctx, key)
	if err == nil {
		s.queue = queue
	}
	limit, holders, err := c.Holders(ctx, key)
	if err == nil && (limit > 1 || len(holders) > 1 || len(holders) == 1 && holders[0].Shared) {
		s.held, s.limit, s.holders = true, limit, holders
		return s, nil
	}
	s.info, err = c.Inspect(ctx, key)
	s.held = err == nil
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return s, err
	}
	return s, nil
}

// same reports whether two snapshots show the same holders, tokens, values and
// queue (TTLs aside, which change all the time).
func (s snapshot) same(o snapshot) bool {
	eq := func(a, b []dlock.Info) bool {
		return slices.EqualFunc(a, b, func(x, y dlock.Info) bool {
			return x.Owner == y.Owner && x.Token == y.Token && x.Shared == y.Shared && bytes.Equal(x.Value, y.Value)
		})
	}
	return s.held == o.held && s.limit == o.limit && (s.queue == nil) == (o.queue == nil) &&
		eq([]dlock.Info{s.info}, []dlock.Info{o.info}) && s.info.Waiters == o.info.Waiters &&
		eq(s.holders, o.holders) && eq(s.queue, o.queue)
}

// print shows the snapshot as text or JSON (on one line when watching).
func (s snapshot) print(w io.Writer, asJSON, watching bool) error {
	if s.holders != nil {
		return printHolders(w, s.key, s.limit, s.holders, s.queue, asJSON, watching)
	}
	info := s.info
	if asJSON {
		out := map[string]any{"key": s.key, "held": s.held}
		if s.held {
			out["owner"], out["token"], out["ttl_ms"], out["waiters"] = info.Owner, info.Token, info.TTL.Milliseconds(), info.Waiters
			addValue(out, info.Value)
		}
		addQueue(out, s.queue)
		return encodeJSON(w, out, watching)
	}
	if !s.held {
		_, err := fmt.Fprintf(w, "%s: free\n", s.key)
		return err
	}
	fmt.Fprintf(w, "key:     %s\nowner:   %s\ntoken:   %d\nttl:     %v\n",
		s.key, info.Owner, info.Token, info.TTL.Round(time.Millisecond))
	if len(info.Value) > 0 {
		fmt.Fprintf(w, "value:   %s\n", showValue(info.Value))
	}
	printQueue(w, info.Waiters, s.queue)
	return nil
}

// watchKey prints the key's state, then again whenever it changes, until ctx
// ends: it reads at every holder change the backend signals (Client.Observe) and
// every interval (for the queue, and where the backend signals nothing).
func watchKey(ctx context.Context, c *dlock.Client, key string, interval time.Duration, w io.Writer, asJSON bool) error {
	changes, err := c.Observe(ctx, key, dlock.WithObserveInterval(interval))
	if err != nil {
		return exitCodeError{code: 69, err: err}
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last *snapshot
	for {
		snap, err := inspectKey(ctx, c, key)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return exitCodeError{code: 69, err: err}
		case last == nil || !snap.same(*last):
			if last != nil && !asJSON {
				fmt.Fprintf(w, "-- %s\n", time.Now().Format(time.TimeOnly))
			}
			if err := snap.print(w, asJSON, true); err != nil {
				return err
			}
			last = &snap
		}
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-changes:
			if !ok {
				return nil
			}
		case <-tick.C:
		}
	}
}

// printHolders shows a semaphore's holders, or a read-write lock's readers.
func printHolders(w io.Writer, key string, limit int, holders []dlock.Info, queue []dlock.Info, asJSON, watching bool) error {
	waiters := -1
	if len(holders) > 0 {
		waiters = holders[0].Waiters
	}
	if asJSON {
		hs := make([]map[string]any, len(holders))
		for i, h := range holders {
			hs[i] = map[string]any{"owner": h.Owner, "token": h.Token, "ttl_ms": h.TTL.Milliseconds(), "shared": h.Shared}
			addValue(hs[i], h.Value)
		}
		out := map[string]any{"key": key, "held": len(holders) > 0, "limit": limit, "holders": hs, "waiters": waiters}
		addQueue(out, queue)
		return encodeJSON(w, out, watching)
	}
	fmt.Fprintf(w, "key:     %s\nlimit:   %d\nholders: %d\n", key, limit, len(holders))
	for _, h := range holders {
		fmt.Fprintf(w, "  owner %s, token %d, TTL left %v", h.Owner, h.Token, h.TTL.Round(time.Millisecond))
		if h.Shared {
			fmt.Fprint(w, ", shared")
		}
		if len(h.Value) > 0 {
			fmt.Fprintf(w, ", value %s", showValue(h.Value))
		}
		fmt.Fprintln(w)
	}
	printQueue(w, waiters, queue)
	return nil
}

// printQueue shows the number of waiters and, where the backend lists them (queue
// not nil), each queued place in the order it will be served, readers marked.
func printQueue(w io.Writer, waiters int, queue []dlock.Info) {
	if queue == nil {
		fmt.Fprintf(w, "waiters: %d\n", waiters)
		return
	}
	readers := 0
	for _, p := range queue {
		if p.Shared {
			readers++
		}
	}
	fmt.Fprintf(w, "waiters: %d", len(queue))
	if readers > 0 {
		fmt.Fprintf(w, " (%d shared, %d exclusive)", readers, len(queue)-readers)
	}
	fmt.Fprintln(w)
	for i, p := range queue {
		fmt.Fprintf(w, "  %d. owner %s", i+1, p.Owner)
		if p.Shared {
			fmt.Fprint(w, ", shared")
		}
		if len(p.Value) > 0 {
			fmt.Fprintf(w, ", value %s", showValue(p.Value))
		}
		fmt.Fprintln(w)
	}
}

// addQueue adds the queued places to a JSON object, where the backend lists them.
func addQueue(out map[string]any, queue []dlock.Info) {
	if queue == nil {
		return
	}
	q := make([]map[string]any, len(queue))
	for i, p := range queue {
		q[i] = map[string]any{"owner": p.Owner, "shared": p.Shared}
		addValue(q[i], p.Value)
	}
	out["queue"] = q
	out["waiters"] = len(queue)
}

// encodeJSON writes v as indented JSON, or on one line (for a stream of objects).
func encodeJSON(w io.Writer, v any, oneLine bool) error {
	enc := json.NewEncoder(w)
	if !oneLine {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}
