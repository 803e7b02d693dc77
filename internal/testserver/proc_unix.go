//go:build unix

package testserver

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// credential is the user a server process runs as.
type credential = syscall.Credential

const sigStop, sigCont = syscall.SIGSTOP, syscall.SIGCONT

// serverCredential returns the credential to run PostgreSQL under, which refuses to
// run as root: the "postgres" system user (made by the Debian package), else "nobody".
func serverCredential() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, fmt.Errorf("running as root, and neither the postgres nor the nobody user exists to run PostgreSQL as")
}

// killGroup sends sig to every process of the process group pgid.
func killGroup(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }
