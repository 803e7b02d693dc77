package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock/cmd/dlock/internal/errline"

	_ "github.com/dlockio/dlock/all" // every backend, for URLs given on the command line
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1  // the command failed
	exitUsage = 64 // bad command line (EX_USAGE from sysexits.h)
	// exitNoPerm: the backend refused the credentials or a permission (EX_NOPERM).
	exitNoPerm = 77
)

// env is what a command may use of the outside world; tests give their own.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// commands lists the constructors of the subcommands. Each command lives in its own
// file and adds itself from init:
//
//	func init() { register(newFooCommand) }
var commands []func(*env) *cobra.Command

func register(newCommand func(*env) *cobra.Command) {
	commands = append(commands, newCommand)
}

// usageError marks a bad command line: exit code 64.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// exitCodeError makes the command exit with a given code (for example the exit
// status of a program it ran), after printing err if it is not nil.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e exitCodeError) Unwrap() error { return e.err }

// noArgs is the argument validator of commands that take none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasSubCommands() {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
}

// usageArgs wraps a cobra argument validator so that its errors are usage errors.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "dlock",
		Short: "Distributed locks with leases and fencing tokens",
		Long: `dlock works with distributed locks from the shell.

A lock is a lease with a fencing token: a number that is larger for every later
holder, so that the resource you protect can reject a stale holder's writes.

Start with "dlock demo": it needs nothing installed and shows a paused lock holder
being fenced off. "dlock dev" runs an etcd server for development.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// "dlock completion" is this command's own (completion.go), with install notes.
	root.CompletionOptions.DisableDefaultCmd = true
	root.Version = "set" // any value turns --version on; the template prints the build
	root.SetVersionTemplate(versionText(debug.ReadBuildInfo()))
	logLevelFlag(root)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		l, err := logger(cmd, e.stderr)
		if err != nil {
			return err
		}
		setRedisLogger(l)
		return nil
	}
	for _, newCommand := range commands {
		root.AddCommand(newCommand(e))
	}
	return root
}

// Main runs the dlock command line and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := newRoot(e)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(context.Background())
	if err == nil {
		return exitOK
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		if ec.err != nil {
			fmt.Fprintln(stderr, message(ec.err))
		}
		return ec.code
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "%s\nusage: %s (see %q)\n", message(err), cmd.UseLine(), cmd.CommandPath()+" --help")
		return exitUsage
	}
	fmt.Fprintln(stderr, message(err))
	return exitError
}

// message is the one line printed for err: "dlock: " and the error flattened to
// one line (see errline). The library's errors start with "dlock: " themselves (as a
// Go package's errors name the package); that prefix is not repeated.
func message(err error) string { return errline.Message(err.Error()) }

// oneLine is err flattened to one line, without the "dlock: " prefix.
func oneLine(err error) string { return errline.Line(err.Error()) }
