package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/cmd/dlock/internal/runner"
	"github.com/dlockio/dlock/driver"
)

// passwordHelp documents, in each command's --help, how to give a password without
// putting it in argv.
const passwordHelp = `
The backend's password may be given without showing it in the process list: in a
file (--password-file FILE) or in the DLOCK_PASSWORD environment variable; dlock
puts it in the URL's user info (redis://[user]@host, etcd://user@host, ...). A URL
that holds a password already cannot take another.`

// backendFlag adds --backend (default $DLOCK_URL) and --password-file to cmd and
// returns the URL's value.
func backendFlag(cmd *cobra.Command) *string {
	s := cmd.Flags().String("backend", "", "backend URL (default $DLOCK_URL), e.g. redis://127.0.0.1:6379/0 or etcd://127.0.0.1:2379")
	cmd.Flags().String("password-file", "", "read the backend's password from `FILE` (default $DLOCK_PASSWORD)")
	return s
}

// openBackend opens a client for the --backend URL or $DLOCK_URL, with the password
// from --password-file or $DLOCK_PASSWORD if given. A bad URL is a usage error (64);
// refused credentials or permission exit 77 (EX_NOPERM); an unreachable backend
// exits 69. Errors never show a password.
func openBackend(cmd *cobra.Command, rawURL string, opts ...dlock.Option) (*dlock.Client, error) {
	if rawURL == "" {
		rawURL = os.Getenv("DLOCK_URL")
	}
	if rawURL == "" {
		return nil, usagef("no backend: give --backend URL or set DLOCK_URL")
	}
	file, _ := cmd.Flags().GetString("password-file")
	rawURL, err := withPassword(rawURL, file, os.Getenv("DLOCK_PASSWORD"))
	if err != nil {
		return nil, err
	}
	l, err := logger(cmd, cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	opts = append([]dlock.Option{dlock.WithLogger(l)}, opts...)
	octx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
	defer cancel()
	c, err := dlock.Open(octx, rawURL, opts...)
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

// withPassword puts the password read from file (if not empty), else env (if not
// empty), into the URL's user info. Either one with a URL that holds a password
// already is a usage error.
func withPassword(rawURL, file, env string) (string, error) {
	var pw, from string
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usagef("--password-file: %v", err)
		}
		pw, from = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), "--password-file"
		if pw == "" {
			return "", usagef("--password-file: %s is empty", file)
		}
	case env != "":
		pw, from = env, "DLOCK_PASSWORD"
	default:
		return rawURL, nil
	}
	u, err := driver.ParseURL(rawURL)
	if err != nil {
		return "", usageError{err} // never repeats the user info
	}
	user := ""
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return "", usagef("%s given, but the backend URL holds a password already", from)
		}
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, pw)
	return u.String(), nil
}
