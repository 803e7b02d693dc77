package main

import (
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/runner"
)

func init() { register(newRunCommand) }

func newRunCommand(e *env) *cobra.Command {
	var (
		backend *string
		ttl     time.Duration
		wait    string
		grace   time.Duration
		owner   string
		resume  bool
		quiet   bool
	)
	cmd := &cobra.Command{
		Use:   "run [flags] KEY -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Run acquires KEY, runs COMMAND while the lease renews itself, and releases the
lock when the command exits. The command sees DLOCK_KEY, DLOCK_TOKEN (the fencing
token: pass it to what you write, so stale holders can be rejected) and DLOCK_HELD=1.

Signals sent to dlock (INT, TERM, HUP) are forwarded to the command. If the lease
is lost while the command runs, the command's process group gets SIGTERM, then
SIGKILL after --grace, and dlock exits 76.

Exit codes:
  the command's own    it ran to the end while holding the lease
  64                   usage error (bad flags, missing "--" or command, bad URL)
  69                   backend unreachable or failing
  75                   lock not acquired within --wait
  76                   lease lost while the command ran
  127                  the command could not be started
  128+N                dlock was interrupted by signal N while waiting`,
		Example: `  dlock run --backend redis://127.0.0.1:6379/0 nightly-report -- ./report.sh
  DLOCK_URL=etcd://127.0.0.1:2379 dlock run --wait 10m --ttl 30s deploy -- make deploy`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case dash < 0:
				return usagef(`missing "--" between KEY and COMMAND`)
			case dash == 0:
				return usagef("missing KEY before \"--\"")
			case dash > 1:
				return usagef("one KEY before \"--\", got %q", strings.Join(args[:dash], " "))
			case len(args) == dash:
				return usagef(`missing COMMAND after "--"`)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			w, err := parseWait(wait)
			if err != nil {
				return err
			}
			if grace < 0 {
				return usagef("--grace must not be negative, got %v", grace)
			}
			opts := []dlock.Option{}
			if cmd.Flags().Changed("ttl") {
				opts = append(opts, dlock.WithTTL(ttl))
			}
			if owner != "" {
				opts = append(opts, dlock.WithOwner(owner))
			}
			if resume {
				if owner == "" {
					return usagef("--resume needs --owner")
				}
				opts = append(opts, dlock.WithResume())
			}
			c, err := openBackend(cmd.Context(), *backend, opts...)
			if err != nil {
				return err
			}
			defer c.Close()
			code := runner.Run(cmd.Context(), c, runner.Config{
				Key: args[0], Command: args[1:], Wait: w, Grace: grace, Quiet: quiet,
				Stderr: e.stderr, ChildStdin: e.stdin, ChildStdout: e.stdout, ChildStderr: e.stderr,
			})
			if code == 0 {
				return nil
			}
			return exitCodeError{code: code}
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", dlock.DefaultTTL, "lease TTL: how long a crashed dlock blocks others")
	cmd.Flags().StringVar(&wait, "wait", "0", `how long to wait for the lock: 0 (fail at once if held), a duration such as 30s, or "forever"`)
	cmd.Flags().DurationVar(&grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the lease is lost")
	cmd.Flags().StringVar(&owner, "owner", "", "stable owner id ([A-Za-z0-9._:-]); another run with the same id is refused while this one holds the lock (see --resume)")
	cmd.Flags().BoolVar(&resume, "resume", false, "with --owner: take over the lock if that owner id already holds it (a restarted job picking up its lease); only if no other live run uses that id, else both hold at once")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only errors")
	return cmd
}

func parseWait(s string) (time.Duration, error) {
	switch s {
	case "forever":
		return runner.Forever, nil
	case "0":
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, usagef(`--wait must be 0, a duration such as 30s, or "forever"; got %q`, s)
	}
	return d, nil
}
