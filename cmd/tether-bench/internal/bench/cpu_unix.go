//go:build unix

package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used, user and system. A
// rate per CPU-second does not depend on what else the machine runs,
// which a rate per wall-clock second does.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// childCPU is the CPU time, user and system, that the process pid has used
// (an etcd member the bench started), read from /proc; false where there
// is no /proc.
func childCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted from 3 start after its closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	fields := bytes.Fields(stat[i+1:])
	if len(fields) < 13 {
		return 0, false
	}
	// Fields 14 and 15 (utime, stime) are the 12th and 13th after it,
	// in clock ticks, which Linux fixes at 100 a second for /proc.
	utime, err1 := strconv.ParseUint(string(fields[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(fields[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * (time.Second / 100), true
}

// childSwitches is how many times the threads of process pid have been
// switched out, voluntarily (to wait: a parked thread, a blocking system
// call) or not, summed over its threads from /proc; false where there is
// no /proc. A goroutine hand-off that wakes another thread costs a switch
// or two, so switches per operation count a server's hand-offs where its
// CPU time, on a shared machine, is too noisy to.
func childSwitches(pid int) (uint64, bool) {
	if pid <= 0 {
		return 0, false
	}
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/status")
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var total uint64
	for _, t := range tasks {
		status, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		for _, line := range bytes.Split(status, []byte("\n")) {
			name, value, ok := bytes.Cut(line, []byte(":"))
			if !ok || !bytes.HasSuffix(name, []byte("ctxt_switches")) {
				continue
			}
			n, err := strconv.ParseUint(string(bytes.TrimSpace(value)), 10, 64)
			if err != nil {
				return 0, false
			}
			total += n
		}
	}
	return total, true
}
