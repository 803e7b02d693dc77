package main

import "syscall"

// workerSysProcAttr makes a demo worker die with the demo process.
func workerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
