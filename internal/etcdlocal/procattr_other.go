//go:build !linux

package etcdlocal

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
