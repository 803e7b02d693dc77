package runner

import (
	"os"
	"syscall"
)

// On Windows the child's processes are held by a job object rather than a process
// group (group_windows.go). The decisions below do not depend on Windows, so they
// are tested everywhere.

// jobAction is what the runner does to the job for a signal it would send to a
// Unix process group.
type jobAction int

const (
	jobIgnore    jobAction = iota // no Windows counterpart
	jobBreak                      // CTRL_BREAK_EVENT to the child's console process group
	jobTerminate                  // TerminateJobObject: every process of the job ends at once
)

// jobActionFor maps sig: the signals that ask a program to stop (INT, TERM, HUP)
// become CTRL_BREAK_EVENT, the only console event that reaches a process group
// created with CREATE_NEW_PROCESS_GROUP (CTRL_C is disabled in it); KILL becomes
// termination of the job.
func jobActionFor(sig os.Signal) jobAction {
	switch sig {
	case os.Kill, syscall.SIGKILL:
		return jobTerminate
	case os.Interrupt, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP:
		return jobBreak
	}
	return jobIgnore
}

// thread is one entry of a system thread snapshot.
type thread struct{ id, owner uint32 }

// threadsOf returns the ids of the threads of process pid in a snapshot: those to
// resume in a child created suspended (only its first thread, unless something else
// created one meanwhile).
func threadsOf(snapshot []thread, pid uint32) []uint32 {
	var ids []uint32
	for _, t := range snapshot {
		if t.owner == pid {
			ids = append(ids, t.id)
		}
	}
	return ids
}
