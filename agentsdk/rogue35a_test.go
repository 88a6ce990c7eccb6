package agentsdk_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-fifth hostile pass, exit evidence × fenced job leases, for the
// Go SDK's Fence (the TypeScript and Python ones: rogue35a tests there; the
// control plane's read and the record: controlplane's rogue35a test). A
// holder claims its exit and goes on writing under its ACTIVE generation
// at a tool whose fence asks the coordinator: admitted until the lease's
// expiry before the fix. Now the fence refuses it, 403, saying why.
func TestRogue35AFenceRefusesAHolderWhoseExitWasConfirmed(t *testing.T) {
	s := newLeaseSetup(t)
	w := s.newWorker(t, t.TempDir(), time.Hour) // renewals driven by the test
	ctx := context.Background()
	tool := newFencedTool(t, s, "rogue35a-fenced-tool")
	j, dec, err := w.Accept(ctx, s.offer(t, "job-rogue35a", 5*time.Minute), agentsdk.JobOptions{})
	accepted(t, "accept", dec, err)
	h := http.Header{}
	j.Header(h)
	if code, body := tool.send(h); code != http.StatusOK || tool.effects != 1 {
		t.Fatalf("the holder before its exit: %d %q", code, body)
	}

	if _, err := s.worker.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: s.node, Reason: "done, gone"})); err != nil {
		t.Fatal(err)
	}
	code, body := tool.send(h)
	if code != http.StatusForbidden || tool.effects != 1 || !strings.Contains(body, "exit was confirmed") {
		t.Fatalf("the holder's side effect after its confirmed exit: %d %q, the tool ran %d times; want 403 naming its exit, nothing run", code, body, tool.effects-1)
	}
	if l := s.get(t, "job-rogue35a"); l.GetState() != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
		t.Fatalf("the lease after the refused side effect: %v, want it unchanged (ACTIVE)", l)
	}
}
