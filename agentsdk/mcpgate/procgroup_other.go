//go:build !unix

package mcpgate

import "os/exec"

// ownGroup is a no-op where there are no process groups: a stdio
// upstream's own processes are not stopped with it.
func ownGroup(*exec.Cmd) {}

// endGroup is a no-op where there are no process groups.
func endGroup(*exec.Cmd) {}
