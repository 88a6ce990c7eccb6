// Package orphans finds and kills what a child process left behind
// outside its process group: on Linux the program becomes a child
// subreaper (once, for the whole process), so a process orphaned anywhere
// below it — in whatever session or process group — is reparented to it
// instead of to init, and stays within reach. agentsdk.Launcher sweeps
// what an agent's process left, the MCP gateway what a stdio upstream's
// did. Elsewhere there is nothing to adopt: Watch and Sweep find nothing.
//
// The rule attributes by time, not by lineage: an orphan of the program
// that started at or after the watched process and that no os.Process of
// the program holds (a pidfd) is taken for the watched process's.
package orphans
