//go:build !linux

package check

import "syscall"

// workerAttr has no parent-death signal to set outside Linux: a checker killed with
// kill -9 leaves its workers running until their lock calls fail.
func workerAttr() *syscall.SysProcAttr { return nil }
