package main

import (
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/cmd/dlock/internal/runner"
	"github.com/dlockio/dlock/dlockprom"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newRunCommand) }

// newRunCommand builds `dlock run`. It is long (about 130 lines) because it is the
// command's flags and their help, declared in one place; the work is in package
// runner.
func newRunCommand(e *env) *cobra.Command {
	var (
		backend *string
		ttl     time.Duration
		wait    string
		grace   time.Duration
		owner   string
		resume  bool
		quiet   bool
		value   string
		limit   int
		shared  bool
		keys    []string
		metrics string
	)
	cmd := &cobra.Command{
		Use:   "run [flags] KEY|--key KEY... -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Run acquires KEY, runs COMMAND while the lease renews itself, and releases the
lock when the command and every process it left in its process group are gone. The
command sees DLOCK_KEY, DLOCK_TOKEN (the fencing token: pass it to what you write,
so stale holders can be rejected) and DLOCK_HELD=1; it does not see the backend's
password (DLOCK_PASSWORD, and DLOCK_URL if it holds a password, are removed).

While it waits for KEY (--wait), dlock shows who holds it on one line of stderr:
the holder's owner id, its fencing token, the time left before its grant expires
unless renewed, the number of waiters and this run's place in the queue when the
backend tells (Redis does not tell the place). On a terminal
the line is rewritten in place each second; elsewhere a line is printed when the
holder, token or queue changes. --quiet turns it off.

Semaphore: with --limit N, up to N runs hold KEY at once (each with its own lease
and token), like "consul lock -n N"; the next waits for a permit. Every run on
KEY must give the same N while any holds or waits: another N is refused (64).

Read-write lock: with --shared, runs hold KEY together as readers, while a run
without it is a writer and holds KEY alone; a reader that arrives while a writer
waits queues behind it, so readers cannot starve a writer.

Several keys: with --key given more than once (a KEY before "--" counts too),
the run holds every key or none, as one lease (Client.LockAll): taken in one
atomic step where the backend can (Redis, etcd, ZooKeeper, PostgreSQL), else one
by one in ascending key order, so runs that list overlapping keys in any order
cannot deadlock. The command then sees DLOCK_KEYS (how many), and DLOCK_KEY_1,
DLOCK_TOKEN_1, DLOCK_KEY_2, ... in key order, instead of DLOCK_KEY and
DLOCK_TOKEN; losing any key's lease stops it as losing the lease does.

Metrics: with --metrics-addr ADDR, the run serves its lease's metrics at
http://ADDR/metrics while it runs (package dlockprom's, labelled with the key):
dlock_leases_active, dlock_lease_renewals_total, dlock_lease_losses_total and the
wait and hold durations, for cron-style jobs watched by Prometheus.

Leader election: with --wait forever, run is a candidate that runs COMMAND only
while it leads KEY; start one on each machine and the next takes over, with a
larger DLOCK_TOKEN (its epoch), within the TTL of the leader's death. --value
publishes, say, the leader's address; "dlock leader KEY" shows it and follows
every change.

The command runs in its own process group, and dlock acts on the whole group:
  - INT, TERM and HUP sent to dlock are forwarded to the group;
  - if the lease is lost, the group gets SIGTERM, then SIGKILL after --grace, and
    dlock exits 76;
  - when the command exits, processes left in its group get SIGTERM, then SIGKILL
    after --grace; the lock is released only once the group is gone. If it cannot
    be confirmed gone, dlock does not release the lock: it expires after its TTL.
  - if dlock itself is killed (kill -9, out of memory), a watchdog process kills the
    group (on Linux the command also gets SIGKILL as its parent dies).
Not covered: processes that leave the group (setsid, daemons), and, if dlock dies in
the instant between starting the command and arming the watchdog, the command's
descendants. As the group is not the terminal's foreground group, a command that
reads from the terminal is stopped (SIGTTIN): give it its input another way. The
lock protects a resource only as far as it checks DLOCK_TOKEN.

On Windows, which has neither process groups nor signals, what differs is:
  - the command and every process it starts run in a job object that they cannot
    leave; when dlock ends in any way, killed included, Windows ends every process
    still in it, so there is no watchdog process. The command is created suspended
    and resumed once in the job: none of its code runs outside it;
  - the command leads its own console process group: Ctrl-C, Ctrl-Break or closing
    the console reach dlock, which forwards them as CTRL_BREAK_EVENT; above,
    SIGTERM means CTRL_BREAK_EVENT and SIGKILL means terminating the job (exit
    status 1). Processes without a console, or in a console group of their own,
    get no CTRL_BREAK_EVENT, only the termination after --grace;
  - if the job object cannot be made (a rare system policy), dlock says so and
    the command runs as a single process that would outlive a killed dlock.
` + passwordHelp + `

Exit codes:
  the command's own    it ran to the end while holding the lease
  64                   usage error (bad flags, missing "--" or command, bad URL)
  69                   backend unreachable or failing
  75                   lock not acquired within --wait (or the TTL is too short to use a grant)
  76                   lease lost while the command ran
  77                   the backend refused the credentials or a permission
  126                  the command could not be executed (not executable)
  127                  the command was not found
  128+N                dlock was interrupted by signal N while waiting`,
		Example: `  dlock run --backend redis://127.0.0.1:6379/0 nightly-report -- ./report.sh
  DLOCK_URL=etcd://127.0.0.1:2379 dlock run --wait 10m --ttl 30s deploy -- make deploy
  dlock run --backend redis://127.0.0.1:6379/0 --password-file /run/secrets/redis job -- ./job.sh
  dlock run --wait forever --value "$(hostname):8080" scheduler -- ./scheduler   # leader election
  dlock run --wait 10m --limit 4 encoder -- ./encode.sh                           # at most 4 at once
  dlock run --wait 1m --key account:17 --key account:42 -- ./transfer.sh 17 42     # both or neither`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case dash < 0:
				return usagef(`missing "--" between KEY and COMMAND`)
			case dash == 0 && len(keys) == 0:
				return usagef("missing KEY before \"--\" (or --key)")
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
			dash := cmd.ArgsLenAtDash()
			all := append(append([]string{}, args[:dash]...), keys...)
			for _, k := range all {
				if err := driver.ValidateKey(k); err != nil {
					return usageError{err}
				}
			}
			if len(all) > dlock.MaxKeys {
				return usagef("%d keys; one run holds at most %d", len(all), dlock.MaxKeys)
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
			if cmd.Flags().Changed("limit") {
				if limit < 1 || limit > dlock.MaxLimit {
					return usagef("--limit must be from 1 to %d, got %d", dlock.MaxLimit, limit)
				}
				opts = append(opts, dlock.WithLimit(limit))
			}
			if shared {
				if limit > 1 {
					return usagef("--shared and --limit %d do not go together: a read-write lock has one writer", limit)
				}
				opts = append(opts, dlock.WithShared())
			}
			if value != "" {
				if err := driver.ValidateValue([]byte(value)); err != nil {
					return usageError{err}
				}
				opts = append(opts, dlock.WithValue([]byte(value)))
			}
			if resume {
				if owner == "" {
					return usagef("--resume needs --owner")
				}
				opts = append(opts, dlock.WithResume())
			}
			var stopMetrics func()
			if metrics != "" {
				// The run's lease as Prometheus metrics, while it runs: the
				// listener is bound before the lock is asked for.
				m := dlockprom.New(dlockprom.WithKeys(func(k string) string { return k }))
				if stopMetrics, err = serveMetrics(metrics, m, e.stderr); err != nil {
					return err
				}
				defer stopMetrics()
				opts = append(opts, dlock.WithObserver(m))
			}
			c, err := openBackend(cmd, *backend, opts...)
			if err != nil {
				return err
			}
			res := runner.Run(cmd.Context(), c, runner.Config{
				Key: all[0], Keys: all, Command: args[dash:], Wait: w, Grace: grace, Quiet: quiet,
				Stderr: e.stderr, ChildStdin: e.stdin, ChildStdout: e.stdout, ChildStderr: e.stderr,
			})
			if !res.Abandoned {
				// Close would release a lease the runner kept because processes
				// of the command may still run; the process exits instead, and
				// the lock expires after its TTL.
				c.Close()
			}
			if res.Code == 0 {
				return nil
			}
			return exitCodeError{code: res.Code}
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", dlock.DefaultTTL, "lease TTL: how long a crashed dlock blocks others")
	cmd.Flags().StringVar(&wait, "wait", "0", `how long to wait for the lock: 0 (fail at once if held), a duration such as 30s, or "forever"`)
	cmd.Flags().DurationVar(&grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL to the command's process group (lease lost, or processes left when the command exits)")
	cmd.Flags().StringVar(&owner, "owner", "", "stable owner id ([A-Za-z0-9._:-]); another run with the same id is refused while this one holds the lock (see --resume)")
	cmd.Flags().BoolVar(&resume, "resume", false, "with --owner: take over the lock if that owner id already holds it (a restarted job picking up its lease); only if no other live run uses that id, else both hold at once")
	cmd.Flags().IntVar(&limit, "limit", 1, "hold one of `N` permits of KEY (a semaphore: up to N runs at once); every run on KEY must give the same N")
	cmd.Flags().BoolVar(&shared, "shared", false, "hold KEY shared, as a reader of a read-write lock: readers run together, a run without --shared (a writer) alone")
	cmd.Flags().StringVar(&metrics, "metrics-addr", "", "serve Prometheus metrics of the run's lease (held, renewals, losses, wait) at http://`ADDR`/metrics while it runs, e.g. 127.0.0.1:9464")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "hold `KEY` too; give it several times to hold every key or none, as one lease (a multi-key lock)")
	cmd.Flags().StringVar(&value, "value", "", "store `TEXT` with the lock for others to read (dlock inspect, dlock leader): a leader's address, say")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only errors (no status while waiting, no \"acquired\" line)")
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
