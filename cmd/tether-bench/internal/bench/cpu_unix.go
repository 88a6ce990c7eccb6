//go:build unix

package bench

import (
	"bytes"
	"os"
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
