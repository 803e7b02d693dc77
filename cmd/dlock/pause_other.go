//go:build !unix

package main

import (
	"errors"
	"os"
)

var errNoPause = errors.New("pausing a process needs a Unix system (SIGSTOP)")

func pauseProcess(*os.Process) error { return errNoPause }

func resumeProcess(*os.Process) {}
