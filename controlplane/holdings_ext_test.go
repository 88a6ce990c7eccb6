package controlplane_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// olderBinary writes a grant as a binary from before the holdings notes
// did: the grant and its indexes, and nothing on its holder's node.
type olderBinary struct{}

func (olderBinary) NoteHolderIn(store.Txn, string) error { return nil }

// TestATerminationFindsWhatItsNodesHoldByTheirNotes: a termination reads
// the grants, privileges and open calls only of the nodes whose notes
// (tree.Holdings, written with the first of each) say they may have some.
// Each kind is given here the way an agent or an operator gives it — a
// child (whose list the mark walks), a root grant issued straight to a child (not derived from the root's, so
// no tombstone of the root's covers it), a grant delegated to another, a
// privilege, a tool call left in flight — and the record must list each
// and the grants must be revoked: a writer that did not note its holding
// would have it missed. A node written before the notes were kept (no
// HoldsTracked), holding a grant written without a note, is read as
// before and its grant revoked too.
func TestATerminationFindsWhatItsNodesHoldByTheirNotes(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(time.Now().UTC())
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusNoContent) }))
	defer hook.Close()
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	child := func(name string) string { return spawn(t, admin, root.Node.NodeId, name).Node.NodeId }
	grantedAgent := spawn(t, admin, root.Node.NodeId, "granted")
	granted := grantedAgent.Node.NodeId
	delegated := spawn(t, admin, granted, "delegated").Node.NodeId
	privileged, calling, idle, legacy := child("privileged"), child("calling"), child("idle"), child("legacy")

	issued := issueRoot(t, admin, granted, time.Hour, "tool:*")
	delegatedGrant := delegate(t, srv.Clients(grantedAgent.Credential), issued, delegated, "tool:shell")
	callerGrant := issueRoot(t, admin, calling, time.Hour, "tool:*")
	if err := registerPrivilege(ctx, admin, privileged, "file_lock", hook.URL, clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	gate := agentsdk.NewToolGate(agentsdk.Dial(srv.URL, srv.ToolServerToken(t, "gate-h"), agentsdk.WithHTTPClient(srv.HTTP)), "gate-h")
	gate.NeverAck = true
	t.Cleanup(gate.Close)
	<-gate.Ready()
	started := make(chan struct{})
	// The call runs until the test ends (its gate never acknowledges a
	// cancel), not for the rest of the package's tests.
	callCtx, endCall := context.WithCancel(ctx)
	t.Cleanup(endCall)
	go gate.Call(callCtx, callerGrant.token, "shell", func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	<-started

	// The legacy node: its notes cleared, as a node stored before them,
	// and a root grant written for it without a note.
	var legacyGrant capability.Grant
	if err := srv.Store().Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, legacy)
		if err != nil {
			return err
		}
		n.Holds = 0
		if err := tree.PutNodeIn(tx, n); err != nil {
			return err
		}
		legacyGrant, err = capability.NewRoot(capability.RootRequest{GrantID: id.New(id.Grant), Issuer: "operator:older", HolderNodeID: legacy, Scopes: []string{"tool:*"}, TTL: time.Hour}, clk.Now())
		if err != nil {
			return err
		}
		return grantstore.PutNewGrantIn(tx, olderBinary{}, legacyGrant)
	}); err != nil {
		t.Fatal(err)
	}

	// What each node's notes say before the termination.
	want := map[string]tree.Holdings{
		root.Node.NodeId: tree.HoldsTracked | tree.HoldsChildren,
		granted:          tree.HoldsTracked | tree.HoldsGrants | tree.HoldsChildren,
		delegated:        tree.HoldsTracked | tree.HoldsGrants,
		privileged:       tree.HoldsTracked | tree.HoldsPrivileges,
		calling:          tree.HoldsTracked | tree.HoldsGrants | tree.HoldsCalls,
		idle:             tree.HoldsTracked,
		legacy:           0,
	}
	if err := srv.Store().View(ctx, func(tx store.ReadTxn) error {
		for node, holds := range want {
			n, err := tree.GetNodeIn(tx, node)
			if err != nil {
				return err
			}
			if n.Holds != holds {
				t.Errorf("node %s notes %b, want %b", n.Name, n.Holds, holds)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, 0)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	clk.Advance(2 * time.Second) // past the cancel acknowledgement timeout: the gate never acks
	rec := record(t, admin, waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).TerminationId)

	heldGrants := map[string][]string{}
	for _, n := range rec.Nodes {
		heldGrants[n.NodeId] = n.HeldGrantIds
	}
	for node, g := range map[string]string{granted: issued.grant.GrantId, delegated: delegatedGrant.grant.GrantId, calling: callerGrant.grant.GrantId, legacy: legacyGrant.GrantID} {
		if got := heldGrants[node]; len(got) != 1 || got[0] != g {
			t.Errorf("the record lists grants %v for node %s, want [%s]", got, node, g)
		}
		if st := getGrant(t, admin, g).State; st != tetherv1.GrantState_GRANT_STATE_REVOKED {
			t.Errorf("grant %s of node %s is %s after the termination, want revoked", g, node, st)
		}
	}
	if got := privilegeOutcomes(rec)["file_lock"]; got == nil || got.NodeId != privileged || got.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
		t.Errorf("the privilege in the record: %v, want file_lock of %s revoked", got, privileged)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].NodeId != calling || rec.ToolCalls[0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Errorf("the record's calls: %v, want the call of %s cancel_unacknowledged", rec.ToolCalls, calling)
	}
	if len(heldGrants[idle]) != 0 || len(heldGrants[privileged]) != 0 {
		t.Errorf("grants listed for nodes that hold none: idle %v, privileged %v", heldGrants[idle], heldGrants[privileged])
	}
}
