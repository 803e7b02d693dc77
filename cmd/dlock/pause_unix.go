//go:build unix

package main

import (
	"os"
	"syscall"
)

// pauseProcess freezes p (SIGSTOP): it runs no code at all, timers included, until
// resumed, as in a long stop-the-world pause.
func pauseProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

// resumeProcess lets p run again (SIGCONT).
func resumeProcess(p *os.Process) { _ = p.Signal(syscall.SIGCONT) }
