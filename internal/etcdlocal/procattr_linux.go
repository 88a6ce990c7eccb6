package etcdlocal

import "syscall"

// procAttr makes the kernel kill a member when the process that started it
// dies, so that a test binary that crashes or times out leaves no etcd
// behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
