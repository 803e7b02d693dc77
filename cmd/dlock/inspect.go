package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newInspectCommand) }

func newInspectCommand(e *env) *cobra.Command {
	var backend *string
	var asJSON bool
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
` + passwordHelp,
		Example: `  dlock inspect --backend redis://127.0.0.1:6379/0 nightly-report
  dlock inspect --json deploy`,
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
			// The queue, where the backend lists it; an error here leaves it out.
			queue, qerr := c.Waiters(ctx, args[0])
			if qerr != nil {
				queue = nil // not listed
			}
			limit, holders, err := c.Holders(ctx, args[0])
			if err == nil && (limit > 1 || len(holders) > 1 || len(holders) == 1 && holders[0].Shared) {
				return printHolders(e.stdout, args[0], limit, holders, queue, asJSON)
			}
			info, err := c.Inspect(ctx, args[0])
			held := err == nil
			if err != nil && !errors.Is(err, dlock.ErrNotHeld) {
				return exitCodeError{code: 69, err: err}
			}
			if asJSON {
				out := map[string]any{"key": args[0], "held": held}
				if held {
					out["owner"], out["token"], out["ttl_ms"], out["waiters"] = info.Owner, info.Token, info.TTL.Milliseconds(), info.Waiters
					addValue(out, info.Value)
				}
				addQueue(out, queue)
				return writeJSON(e.stdout, out)
			}
			if !held {
				fmt.Fprintf(e.stdout, "%s: free\n", args[0])
				return nil
			}
			fmt.Fprintf(e.stdout, "key:     %s\nowner:   %s\ntoken:   %d\nttl:     %v\n",
				args[0], info.Owner, info.Token, info.TTL.Round(time.Millisecond))
			if len(info.Value) > 0 {
				fmt.Fprintf(e.stdout, "value:   %s\n", showValue(info.Value))
			}
			printQueue(e.stdout, info.Waiters, queue)
			return nil
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printHolders shows a semaphore's holders, or a read-write lock's readers.
func printHolders(w io.Writer, key string, limit int, holders []dlock.Info, queue []dlock.Info, asJSON bool) error {
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
		return writeJSON(w, out)
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

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
