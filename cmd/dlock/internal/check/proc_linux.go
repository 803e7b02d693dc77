package check

import "syscall"

// workerAttr makes a worker die with the checker (parent-death signal).
func workerAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
