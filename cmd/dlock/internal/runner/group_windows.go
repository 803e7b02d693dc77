package runner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// group is, on Windows, a job object that holds the child and every process it
// starts: descendants cannot leave it (breakaway is not allowed), unlike a Unix
// process group, which setsid leaves. The job is made with
// JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, and only the runner holds its handle, so
// when the runner ends in any way (kill, crash, a normal exit) Windows closes the
// handle and ends every process left in the job. That is the watchdog's job on
// Unix; there is no watchdog process on Windows.
//
// The child is created suspended (CREATE_SUSPENDED) and resumed only once it is in
// the job, so no code of it runs outside the job. If the runner dies in the instant
// between creating it and assigning it, the child stays suspended, never having
// run: it does nothing, but it is left behind until killed.
//
// The child also leads a new console process group (CREATE_NEW_PROCESS_GROUP), so
// that the runner can send it CTRL_BREAK_EVENT in place of SIGTERM; Ctrl-C at the
// console reaches the runner, which forwards it as CTRL_BREAK. Processes that make
// a console group of their own, or that have no console, do not get the event;
// SIGKILL's counterpart, TerminateJobObject, reaches them all.
type group struct {
	cmd *exec.Cmd
	job windows.Handle // 0 if the job could not be made: the child alone, as on other systems
}

// startGroup starts cmd in a new job object. warnf reports a job that could not be
// made or joined; the command runs anyway, as a single process.
func startGroup(cmd *exec.Cmd, warnf func(format string, a ...any)) (*group, error) {
	job, err := newJob()
	if err != nil {
		warnf("no job object (%v): the command would outlive a killed dlock, and only it, not its children, is stopped", err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
	if job != 0 {
		cmd.SysProcAttr.CreationFlags |= windows.CREATE_SUSPENDED
	}
	if err := cmd.Start(); err != nil {
		if job != 0 {
			_ = windows.CloseHandle(job)
		}
		return nil, err
	}
	g := &group{cmd: cmd, job: job}
	if job == 0 {
		return g, nil
	}
	pid := uint32(cmd.Process.Pid)
	if err := assign(job, pid); err != nil {
		warnf("cannot put the command in a job object (%v): it would outlive a killed dlock, and only it, not its children, is stopped", err)
		_ = windows.CloseHandle(job)
		g.job = 0
	}
	if err := resume(pid); err != nil {
		// A child that cannot be resumed would wait forever: end it.
		_ = cmd.Process.Kill()
		return g, fmt.Errorf("resume the suspended command: %w", err)
	}
	return g, nil
}

// newJob makes a job object whose processes end when its last handle closes.
func newJob() (windows.Handle, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, err
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{}
	info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(job)
		return 0, err
	}
	return job, nil
}

func assign(job windows.Handle, pid uint32) error {
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, pid)
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	return windows.AssignProcessToJobObject(job, h)
}

// resume starts the threads of process pid, created suspended. os/exec closes the
// thread handle that CreateProcess returns, so the thread is found in a snapshot.
func resume(pid uint32) error {
	snap, err := windows.CreateToolhelp32Snapshot(windows.TH32CS_SNAPTHREAD, 0)
	if err != nil {
		return err
	}
	defer windows.CloseHandle(snap)
	var all []thread
	e := windows.ThreadEntry32{Size: uint32(unsafe.Sizeof(windows.ThreadEntry32{}))}
	for err = windows.Thread32First(snap, &e); err == nil; err = windows.Thread32Next(snap, &e) {
		all = append(all, thread{id: e.ThreadID, owner: e.OwnerProcessID})
	}
	ids := threadsOf(all, pid)
	if len(ids) == 0 {
		return errors.New("no thread found")
	}
	for _, id := range ids {
		th, err := windows.OpenThread(windows.THREAD_SUSPEND_RESUME, false, id)
		if err != nil {
			return err
		}
		_, err = windows.ResumeThread(th)
		windows.CloseHandle(th)
		if err != nil {
			return err
		}
	}
	return nil
}

// signal acts on the whole job: CTRL_BREAK_EVENT for INT, TERM and HUP, termination
// for KILL (see jobActionFor). Without a job it acts on the child alone.
func (g *group) signal(sig os.Signal) {
	switch jobActionFor(sig) {
	case jobBreak:
		// The console process group's id is the child's pid.
		_ = windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(g.cmd.Process.Pid))
	case jobTerminate:
		if g.job != 0 {
			_ = windows.TerminateJobObject(g.job, 1)
		} else {
			_ = g.cmd.Process.Kill()
		}
	}
}

// jobAccounting is JOBOBJECT_BASIC_ACCOUNTING_INFORMATION.
type jobAccounting struct {
	TotalUserTime, TotalKernelTime, ThisPeriodTotalUserTime, ThisPeriodTotalKernelTime int64
	TotalPageFaultCount, TotalProcesses, ActiveProcesses, TotalTerminatedProcesses     uint32
}

// gone reports whether no process of the job remains. It is called only after the
// child itself was reaped.
func (g *group) gone() bool {
	if g.job == 0 {
		return true
	}
	var info jobAccounting
	err := windows.QueryInformationJobObject(g.job, windows.JobObjectBasicAccountingInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info)), nil)
	return err == nil && info.ActiveProcesses == 0
}

// close ends the job: closing its only handle ends whatever is still in it.
func (g *group) close(gone bool) {
	if g.job == 0 {
		return
	}
	if !gone {
		_ = windows.TerminateJobObject(g.job, 1)
	}
	_ = windows.CloseHandle(g.job)
	g.job = 0
}

func (g *group) String() string { return fmt.Sprintf("job object of process %d", g.cmd.Process.Pid) }

// MaybeRunWatchdog does nothing on Windows: the job object does the watchdog's work.
func MaybeRunWatchdog() {}
