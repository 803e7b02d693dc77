package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newLeaderCommand) }

func newLeaderCommand(e *env) *cobra.Command {
	var (
		backend *string
		asJSON  bool
		watch   bool
		every   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "leader [flags] NAME",
		Short: "Show the leader of an election, or follow it",
		Long: `Leader shows who leads the election NAME: the leader's owner id, the value it
published, its epoch (the fencing token, larger for every later leader) and the time
left before its grant expires unless renewed. "No leader" is not an error (exit 0).

An election is a lock: a process leads NAME while it holds the lock NAME, so
  dlock run --wait forever --value "$(hostname):8080" NAME -- ./serve
runs ./serve only while it leads (several such runs on several machines take turns,
each taking over when the leader dies), and publishes the address for followers.
Programs use dlock.Client.Campaign, Leader and Observe.

With --watch, leader prints the current state and then one line per change (a new
leader, a new value, no leader) until interrupted. On a backend that cannot watch a
key's holder it reads every --interval, so a change shows up to that late there.
` + passwordHelp,
		Example: `  dlock leader --backend etcd://127.0.0.1:2379 scheduler
  dlock leader --watch --json scheduler`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := driver.ValidateKey(name); err != nil {
				return usageError{err}
			}
			if every <= 0 {
				return usagef("--interval must be positive, got %v", every)
			}
			c, err := openBackend(cmd, *backend, dlock.WithObserveInterval(every))
			if err != nil {
				return err
			}
			defer c.Close()
			p := leaderPrinter{w: e.stdout, json: asJSON}
			if !watch {
				ld, err := c.Leader(cmd.Context(), name)
				if err != nil && !errors.Is(err, dlock.ErrNoLeader) {
					return exitCodeError{code: 69, err: err}
				}
				return p.print(ld)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			obs, err := c.Observe(ctx, name)
			if err != nil {
				return exitCodeError{code: 69, err: err}
			}
			for ld := range obs {
				if err := p.print(ld); err != nil {
					return err
				}
			}
			return nil
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per line with --watch)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print every change until interrupted")
	cmd.Flags().DurationVar(&every, "interval", dlock.DefaultObserveInterval, "with --watch, how often to read on a backend that cannot watch holders")
	return cmd
}

// leaderPrinter prints leaders as text or JSON.
type leaderPrinter struct {
	w    io.Writer
	json bool
}

func (p leaderPrinter) print(ld dlock.Leader) error {
	if p.json {
		out := map[string]any{"name": ld.Name, "leader": ld.Exists()}
		if ld.Exists() {
			out["owner"], out["token"], out["ttl_ms"] = ld.Owner, ld.Token, ld.TTL.Milliseconds()
			addValue(out, ld.Value)
		}
		return json.NewEncoder(p.w).Encode(out)
	}
	if !ld.Exists() {
		_, err := fmt.Fprintf(p.w, "%s: no leader\n", ld.Name)
		return err
	}
	_, err := fmt.Fprintf(p.w, "%s: leader %s, token %d, value %s, TTL left %v\n",
		ld.Name, ld.Owner, ld.Token, showValue(ld.Value), ld.TTL.Round(time.Millisecond))
	return err
}

// showValue quotes a value for a line of text: a Go string literal, so that
// control characters and invalid UTF-8 cannot break the line or the terminal.
func showValue(v []byte) string {
	if len(v) == 0 {
		return `""`
	}
	return strconv.Quote(string(v))
}

// addValue puts a value into a JSON object: as "value" if it is UTF-8 text, else
// as "value_base64" (encoding/json encodes a []byte in base64).
func addValue(out map[string]any, v []byte) {
	switch {
	case len(v) == 0:
	case utf8.Valid(v):
		out["value"] = string(v)
	default:
		out["value_base64"] = v
	}
}
