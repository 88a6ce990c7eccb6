//go:build unix

package bench

import (
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
