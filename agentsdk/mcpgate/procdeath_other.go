//go:build !linux

package mcpgate

import "os/exec"

// diesWithGateway is a no-op where there is no parent-death signal: a
// stdio upstream outlives a gateway's process killed without closing it.
func diesWithGateway(*exec.Cmd) {}

// startLocked runs start.
func startLocked[T any](start func() (T, error)) (T, error) { return start() }
