package testserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// procAttr starts a server process that gets SIGKILL when the test binary dies
// (parent-death signal), in its own process group when group is set, as the user
// cred when it is not nil.
func procAttr(group bool, cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: group, Credential: cred}
}

// groupAlive reports whether a live (non-zombie) process is in process group pgid.
func groupAlive(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) >= 3 && fields[0] != "Z" && fields[0] != "X" && fields[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}
