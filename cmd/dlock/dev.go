package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/version"

	"github.com/dlockio/dlock/cmd/dlock/internal/devserver"
)

func init() { register(newDevCommand) }

func newDevCommand(e *env) *cobra.Command {
	var dataDir string
	var port int
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an etcd server for development, with nothing to install",
		Long: `dev runs a single-member etcd inside the dlock process, listening on 127.0.0.1
only, and prints the URL to give to dlock.Open or to other dlock commands. It
stops cleanly on Ctrl-C (SIGINT) or SIGTERM.

Without --data-dir the data lives in a temporary directory that is removed on
exit. It is a development server: no TLS, no authentication, one member.`,
		Example: `  dlock dev
  dlock dev --port 0                  # any free port
  dlock dev --data-dir ./etcd-data    # keep the data across runs`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 0 || port > 65535 {
				return usagef("--port %d is not a TCP port (0 to 65535; 0 picks a free one)", port)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			dir, temp := dataDir, dataDir == ""
			if temp {
				var err error
				if dir, err = os.MkdirTemp("", "dlock-dev-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			m, err := devserver.Start(ctx, devserver.Config{Dir: dir, Name: "dlock-dev", ClientPort: port})
			if err != nil {
				if ctx.Err() != nil {
					return nil // interrupted during start-up
				}
				return fmt.Errorf("%w (is the port in use? --port 0 picks a free one)", err)
			}
			where := "data in " + dir
			if temp {
				where += " (removed on exit)"
			}
			out := e.stdout
			fmt.Fprintf(out, "dlock dev: etcd %s on %s, %s\n", version.Version, m.Endpoint(), where)
			fmt.Fprintf(out, "Use this URL with dlock.Open or the dlock commands:\n\n    etcd://%s/dlock\n\n", m.Endpoint())
			fmt.Fprintln(out, "Press Ctrl-C to stop.")
			var failed error
			select {
			case <-ctx.Done():
			case err := <-m.Err():
				failed = fmt.Errorf("etcd stopped: %v", err)
			}
			start := time.Now()
			m.Stop()
			if failed != nil {
				return failed
			}
			fmt.Fprintf(out, "dlock dev: stopped in %v\n", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "keep etcd's data in `DIR` (default: a temporary directory, removed on exit)")
	cmd.Flags().IntVar(&port, "port", 2379, "client `PORT` on 127.0.0.1 (0 picks a free one)")
	return cmd
}
