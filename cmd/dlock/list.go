package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newListCommand) }

func newListCommand(e *env) *cobra.Command {
	var (
		backend *string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "list [flags] [PREFIX]",
		Short: "List the held locks under a prefix",
		Long: `List shows every held lock whose key starts with PREFIX (every lock without
one), ordered by key: the key, the holder's owner id, fencing token, time left before
the server expires the grant unless renewed, the number of waiters (-1 when the
backend cannot tell), whether it is held shared (a reader), and its value. A key
with several holders (a semaphore, readers) has a line per holder. Nothing held is
not an error (exit 0).

It may read every lock the backend keeps (a scan on Redis, a range read on etcd, a
listing on ZooKeeper, a query on PostgreSQL): a tool to look, not to call in a loop.
Redlock cannot list (its locks live on a majority of masters): exit 64.
` + passwordHelp,
		Example: `  dlock list --backend redis://127.0.0.1:6379/0
  dlock list --json orders/`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
				if err := driver.ValidateKey(prefix); err != nil {
					return usageError{err}
				}
			}
			c, err := openBackend(cmd, *backend)
			if err != nil {
				return err
			}
			defer c.Close()
			infos, err := c.List(cmd.Context(), prefix)
			switch {
			case errors.Is(err, dlock.ErrUnsupported):
				return usageError{err}
			case err != nil:
				return exitCodeError{code: 69, err: err}
			}
			if asJSON {
				out := make([]map[string]any, len(infos))
				for i, in := range infos {
					out[i] = map[string]any{"key": in.Key, "owner": in.Owner, "token": in.Token, "ttl_ms": in.TTL.Milliseconds(), "waiters": in.Waiters, "shared": in.Shared}
					addValue(out[i], in.Value)
				}
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			if len(infos) == 0 {
				if prefix == "" {
					fmt.Fprintln(e.stdout, "no locks held")
				} else {
					fmt.Fprintf(e.stdout, "no locks held under %q\n", prefix)
				}
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tOWNER\tTOKEN\tTTL\tWAITERS\tMODE\tVALUE")
			for _, in := range infos {
				mode := "exclusive"
				if in.Shared {
					mode = "shared"
				}
				value := ""
				if len(in.Value) > 0 {
					value = showValue(in.Value)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%d\t%s\t%s\n", showKey(in.Key), in.Owner, in.Token, in.TTL.Round(time.Millisecond), in.Waiters, mode, value)
			}
			return tw.Flush()
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (an array of holders)")
	return cmd
}

// showKey prints a key as it is when it is plain, quoted when it holds a space or
// a tab, which would break the table's columns.
func showKey(k string) string {
	for _, r := range k {
		if r == ' ' || r == '\t' || r == '"' {
			return fmt.Sprintf("%q", k)
		}
	}
	return k
}
