//go:build !linux

package main

import "syscall"

func workerSysProcAttr() *syscall.SysProcAttr { return nil }
