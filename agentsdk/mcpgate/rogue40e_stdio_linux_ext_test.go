//go:build linux

package mcpgate_test

import "testing"

// The fortieth rogue pass against the MCP gateway (helper E).

// A rogue stdio upstream cannot have a call's worker outlive the call's
// record by moving it out of the upstream's process group. Since the
// thirty-ninth pass what is left of the group is killed once the
// upstream's process has gone, before the calls it abandoned are recorded
// ended; a worker started in a session of its own (setsid, as a daemon
// does) was beyond it, and went on with the call's work after the gateway
// had recorded the call ended and its Close had returned. The gateway
// now adopts the orphans of its stdio upstreams (on Linux, a child
// subreaper, as agentsdk.Launcher does) and kills, with everything below
// it, each one that started since the upstream did, before the calls are
// recorded. (Fails, before that, because the worker is still there.)
func TestRogue40EStdioUpstreamsSetsidWorkerDoesNotOutliveTheRecordedCall(t *testing.T) {
	workerDoesNotOutliveTheRecordedCall(t, true)
}

// The same when the upstream's process exits mid-call, its setsid worker
// left doing the call's work while the gateway recorded the call failed
// and started the upstream again. (Fails, before the fix, because the
// worker is still there.)
func TestRogue40EStdioUpstreamsSetsidWorkerDoesNotOutliveItsCrash(t *testing.T) {
	workerDoesNotOutliveItsCrash(t, true)
}
