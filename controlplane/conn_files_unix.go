//go:build unix

package controlplane

import "syscall"

// openFileLimit is the process's limit on open files (ulimit -n), which
// every connection takes one of; 0 when it cannot be read.
func openFileLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 0
	}
	return int(l.Cur)
}
