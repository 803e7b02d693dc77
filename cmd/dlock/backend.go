package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/runner"
)

// backendFlag adds --backend (default $DLOCK_URL) to cmd and returns the value.
func backendFlag(cmd *cobra.Command) *string {
	s := cmd.Flags().String("backend", "", "backend URL (default $DLOCK_URL), e.g. redis://127.0.0.1:6379/0 or etcd://127.0.0.1:2379")
	return s
}

// openBackend opens a client for the --backend URL or $DLOCK_URL. A bad URL is a
// usage error (64); refused credentials or permission exit 77 (EX_NOPERM); an
// unreachable backend exits 69. Errors never show a password.
func openBackend(ctx context.Context, url string, opts ...dlock.Option) (*dlock.Client, error) {
	if url == "" {
		url = os.Getenv("DLOCK_URL")
	}
	if url == "" {
		return nil, usagef("no backend: give --backend URL or set DLOCK_URL")
	}
	octx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := dlock.Open(octx, url, opts...)
	switch {
	case err == nil:
		return c, nil
	case errors.Is(err, dlock.ErrInvalid):
		return nil, usageError{err}
	case errors.Is(err, dlock.ErrAuth):
		return nil, exitCodeError{code: exitNoPerm, err: fmt.Errorf("backend refused access: %w", err)}
	default:
		return nil, exitCodeError{code: runner.ExitUnavailable, err: fmt.Errorf("backend unreachable: %w", err)}
	}
}
