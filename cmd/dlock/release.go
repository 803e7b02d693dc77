package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

func init() { register(newReleaseCommand) }

func newReleaseCommand(e *env) *cobra.Command {
	var backend *string
	var force bool
	cmd := &cobra.Command{
		Use:   "release --force [flags] KEY",
		Short: "Release a lock whoever holds it (administrative)",
		Long: `Release --force frees KEY whoever holds it, for example after a holder hung.

The old holder may still be running and will only notice at its next renewal. The
next grant's fencing token is larger than the old holder's, so resources that check
tokens stay safe; resources that do not check them are not protected.

A key that is free already is reported as free, and the exit status is 0, as after
a release: the command can run unconditionally in scripts.
` + passwordHelp,
		Example: `  dlock release --force --backend redis://127.0.0.1:6379/0 nightly-report`,
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				return usagef("release frees a lock that another process may still hold; confirm with --force")
			}
			if err := driver.ValidateKey(args[0]); err != nil {
				return usageError{err}
			}
			c, err := openBackend(cmd, *backend)
			if err != nil {
				return err
			}
			defer c.Close()
			switch err := c.ForceRelease(cmd.Context(), args[0]); {
			case errors.Is(err, dlock.ErrNotHeld):
				// The goal, a free key, is met: scripts may release unconditionally.
				fmt.Fprintf(e.stderr, "dlock: %s was free; nothing to release\n", args[0])
				return nil
			case err != nil:
				return exitCodeError{code: 69, err: err}
			}
			fmt.Fprintf(e.stderr, "dlock: released %s by force; its old holder may still be running until its next renewal fails. Fenced resources reject it.\n", args[0])
			return nil
		},
	}
	backend = backendFlag(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "confirm the administrative release")
	return cmd
}
