//go:build linux

package orphans

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

var subreaper struct {
	once sync.Once
	err  error
}

// adoptOrphans makes the program's process a child subreaper (once, for
// the whole process): a process orphaned anywhere below it — a watched
// process's child whose parent exited, in whatever session or process
// group — is reparented to it instead of to init, so it stays within
// reach.
func adoptOrphans() error {
	subreaper.once.Do(func() {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
			subreaper.err = fmt.Errorf("cannot adopt orphans (prctl PR_SET_CHILD_SUBREAPER: %w)", errno)
		}
	})
	return subreaper.err
}

// Adopt makes the program's process a child subreaper, if it is not yet:
// call it before starting a process to Watch, so that nothing it leaves
// in between escapes.
func Adopt() error { return adoptOrphans() }

// Watch is what Sweep needs to find a watched process's orphans.
type Watch struct {
	// since is when the watched process started (clock ticks since boot,
	// as /proc/<pid>/stat gives it): nothing that started earlier
	// descends from it.
	since uint64
	// held: the program's own children can be told from orphans (the
	// watched process, just started by os/exec, is held by a pidfd).
	held bool
	// err: orphans are not adopted, so none can be proven gone.
	err error
}

// Err says why the watched process's orphans cannot be proven gone, nil
// if they can.
func (w Watch) Err() error { return w.err }

// Start watches process pid: called right after it started (and before
// it is waited for, so /proc/<pid> is there even if it exited).
func Start(pid int) Watch {
	if err := adoptOrphans(); err != nil {
		return Watch{err: err}
	}
	st, ok := readStat(pid)
	if !ok {
		return Watch{err: fmt.Errorf("cannot read the start of process %d (/proc/%d/stat)", pid, pid)}
	}
	return Watch{since: st.start, held: heldPids()[pid]}
}

// Sweep kills and reaps, until none is left, every orphan the program's
// process adopted that may descend from the process watched by w, with
// everything below it. An orphan here is a child of the program's process
// that started at or after the watched process and that no os.Process of
// the program holds (os/exec and os.StartProcess hold a pidfd to every
// child they start until it is waited for: those are the program's own
// children, and the other watched processes). Because the process is a
// subreaper, every process still running that descends from the watched
// one is below such an orphan once the watched process has exited (call
// Sweep then). Each orphan's process group is killed whole as well, when
// every member of it is the watched process's (killGroups). It returns
// nil only once there is none left, and an error if that cannot be proven
// by deadline.
func Sweep(w Watch, deadline time.Time) error {
	if w.err != nil {
		return w.err
	}
	self := os.Getpid()
	pause := time.Millisecond
	for {
		procs, err := readProcs()
		if err != nil {
			return err
		}
		held := heldPids()
		children := map[int][]int{}
		var roots []int
		for pid, st := range procs {
			children[st.ppid] = append(children[st.ppid], pid)
			if st.ppid == self && st.start >= w.since && !held[pid] {
				roots = append(roots, pid)
			}
		}
		if len(roots) == 0 {
			return nil
		}
		if !w.held {
			// The program's own children cannot be told from the
			// watched process's orphans: kill none, prove nothing.
			return fmt.Errorf("%d processes adopted since the watched process started cannot be told from the program's own (os/exec holds no pidfd here)", len(roots))
		}
		// Everything below each orphan, leaves first. A process that
		// forks meanwhile leaves an orphan for the next round.
		var victims []int
		var walk func(int)
		walk = func(pid int) {
			for _, c := range children[pid] {
				walk(c)
			}
			victims = append(victims, pid)
		}
		for _, r := range roots {
			walk(r)
		}
		for _, pid := range victims {
			// The same process still (not a pid reused since the scan).
			if st, ok := readStat(pid); ok && st.start == procs[pid].start && !st.zombie {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// Then their groups, whole, waiting for them to end: after the
		// kills by pid, which reach a process whose main thread exited
		// (rogue41l), as a group's signal may not.
		killGroups(procs, victims, held, w.since, deadline)
		for _, pid := range roots {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		// Past the deadline only once what this scan found was killed:
		// on a busy host a scan may take longer than the deadline, and a
		// sweep that gave up before its first kill left everything
		// running.
		if time.Now().After(deadline) {
			slices.Sort(roots)
			return fmt.Errorf("processes left behind still run after SIGKILL (adopted pids %v)", roots)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// killGroups kills (SIGKILL) the process group of each of victims
// (everything below the orphans one scan found, procs) whose every member
// in that scan is among them: the kernel signals a whole group at once,
// a fork under way included, where the victims' pids one at a time are
// each a step behind a process that forks and exits in a loop — its
// pid a new one each time, every copy gone (a zombie) by the time its
// kill comes, while its child runs on. Such a runner, a few of them
// side by side, outran every round of the sweep until its deadline
// (rogue46f test). A group with a member that is not a victim (a
// process of the program's that started before the watched one, one the
// program holds, the program's own group) is left to the kills by pid.
// A group is signalled only while a member the scan saw is still in it
// (a zombie too: not reaped, its pid is not reused), so the group id
// names the same group. A runner that leaves its group at each
// generation (setsid) is outrun as before: only a cgroup of its own
// would hold it (docs/design.md §11).
func killGroups(procs map[int]procStat, victims []int, held map[int]bool, since uint64, deadline time.Time) {
	if len(victims) == 0 {
		return
	}
	members := map[int][]int{} // group: its victims
	isVictim := make(map[int]bool, len(victims))
	for _, pid := range victims {
		isVictim[pid] = true
		members[procs[pid].pgrp] = append(members[procs[pid].pgrp], pid)
	}
	delete(members, syscall.Getpgrp())
	delete(members, 0)
	for pid, st := range procs {
		if _, ok := members[st.pgrp]; ok && !isVictim[pid] && foreign(procs, pid, isVictim, held, since) {
			delete(members, st.pgrp)
		}
	}
	for g, pids := range members {
		for _, pid := range pids {
			if st, ok := readStat(pid); ok && st.start == procs[pid].start && st.pgrp == g {
				_ = syscall.Kill(-g, syscall.SIGKILL)
				reapGroup(g, deadline)
				break
			}
		}
	}
}

// foreign reports whether process pid, in the group of a victim but not
// one, is not the watched process's: the program holds it, it started
// before the watched process, or its parents lead to a process the scan
// saw that is not a victim (another agent's process, the program's own).
// One whose parents lead out of the scan (a parent born after /proc was
// listed, on a busy host a scan of seconds) is taken for a runner's,
// which is what it is in a group of orphans: else one such process kept
// the group from the kill that would end it.
func foreign(procs map[int]procStat, pid int, isVictim, held map[int]bool, since uint64) bool {
	self := os.Getpid()
	for range len(procs) + 1 {
		st, ok := procs[pid]
		switch {
		case !ok:
			return false
		case isVictim[pid]:
			return false
		case held[pid] || st.start < since || st.ppid == self || st.ppid <= 1:
			return true
		}
		pid = st.ppid
	}
	return true
}

// reapGroup reaps the members of process group g, just killed, until it
// has none (or deadline): they are the program's to reap, adopted, each
// once its parent in the group has died, and the signal takes a moment to
// end each. Until then every one left is a zombie the sweep's next scan of
// /proc reads (thousands of a runner's, by then) and finds left. Only the
// group's members are waited for: the program's own children are not in
// it (killGroups), and their waits are left to them.
func reapGroup(g int, deadline time.Time) {
	pause := 100 * time.Microsecond
	for {
		for {
			var ws syscall.WaitStatus
			if r, err := syscall.Wait4(-g, &ws, syscall.WNOHANG, nil); err != nil || r <= 0 {
				break
			}
		}
		if syscall.Kill(-g, 0) != nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

type procStat struct {
	ppid  int
	pgrp  int
	start uint64
	// zombie: the process has exited, every thread of it. Its stat
	// says its leader's state: a process whose main thread exited
	// (exit, not exit_group) while another thread runs on says Z, and
	// lives — signalled, the whole thread group dies; never reaped until
	// then (rogue41l test).
	zombie bool
}

// readStat parses /proc/<pid>/stat.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	// After the command: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime priority nice
	// num_threads itrealvalue starttime …
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err3 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, false
	}
	return procStat{ppid: ppid, pgrp: pgrp, start: start, zombie: f[0] == "Z" && !threadRunsOn(pid)}, true
}

// threadRunsOn reports whether a thread of process pid, whose leader is a
// zombie, has not exited: the process lives on without its main thread.
func threadRunsOn(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Name() == strconv.Itoa(pid) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X' {
			return true
		}
	}
	return false
}

// readProcs reads every process's stat.
func readProcs() (map[int]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("cannot list processes: %w", err)
	}
	procs := make(map[int]procStat, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			procs[pid] = st
		}
	}
	return procs, nil
}

// heldPids returns the pids of the processes the program holds a pidfd
// to.
func heldPids() map[int]bool {
	held := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return held
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.Contains(link, "pidfd") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && pid > 0 {
					held[pid] = true
				}
			}
		}
	}
	return held
}

// ProcStart returns when process pid started (clock ticks since boot),
// 0 if it cannot be read.
func ProcStart(pid int) uint64 {
	st, ok := readStat(pid)
	if !ok {
		return 0
	}
	return st.start
}

// KillLeft kills (SIGKILL) process pid and the process group it leads, if
// it is still the process that started at start: a process a previous
// run of the program left. It reports whether it killed anything.
func KillLeft(pid int, start uint64) (bool, error) {
	if start == 0 {
		return false, fmt.Errorf("the start of pid %d was not recorded; it cannot be told from a later process with its pid", pid)
	}
	st, ok := readStat(pid)
	if !ok || st.start != start || st.zombie {
		return false, nil // gone (or its pid is another process's now)
	}
	if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return false, fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return true, nil
}
