package runner

import (
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// prepareChild makes the child die with the runner: SIGKILL when the runner's thread
// that started it ends, which in a Go program means when the runner exits (the
// runtime ends threads only for goroutines that exit locked to one, and Run locks
// none). Its descendants are the watchdog's job.
//
// It also makes the runner a child subreaper, so that processes of the group whose
// parent exits are re-parented to the runner rather than to init, and their zombies
// can be reaped (see group.gone): an init that does not reap, as in many
// containers, would otherwise leave them counting as members of the group forever.
func prepareChild(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// selfExe is the runner's own executable, even if the file was replaced since.
func selfExe() (string, error) { return "/proc/self/exe", nil }
