//go:build linux

package bench

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// datasync is what etcd's WAL does per batch on Linux: fdatasync, which
// skips the inode's timestamps.
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// childCPU is the CPU time (user and system) process pid has used, read
// from /proc: how the bench counts the etcd server's share of a renew.
func childCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are space-separated, utime and stime being the
	// 14th and 15th of the line.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const ticksPerSecond = 100 // USER_HZ, 100 on every Linux architecture Go supports
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, true
}
