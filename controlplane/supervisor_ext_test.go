package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/tree"
)

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func terminate(t *testing.T, c *testserver.Clients, node string, mode tetherv1.TerminationMode, window, ack, confirm time.Duration) *tetherv1.Termination {
	t.Helper()
	resp, err := c.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: node, Mode: mode, Reason: "test",
		DrainWindow: durationpb.New(window), CancelAckTimeout: durationpb.New(ack), ConfirmTimeout: durationpb.New(confirm),
	}))
	if err != nil {
		t.Fatalf("terminate %s: %v", node, err)
	}
	return resp.Msg.Termination
}

func getTermination(t *testing.T, c *testserver.Clients, id string) *tetherv1.Termination {
	t.Helper()
	resp, err := c.Supervisor.GetTermination(context.Background(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Termination
}

// waitState waits until the termination reaches state, and returns it as
// GetTermination answers it. It reads the store, not the API: a wait that
// polls GetTermination spends the operator's rate budget, which on a
// server with a small burst and a manual clock refills only when the test
// moves the clock, so a loaded machine, polling more often before the
// state came, ran the operator out of budget and failed the test with
// resource_exhausted (GetTermination reads the store and nothing more).
//
// A wait for RECONCILING is met by a termination past it too: one whose
// nodes are all accounted for once its subtree is revoked (its confirm
// timeout passed already, the clock having moved past it at once) goes
// on to TERMINATED in the next pass, so RECONCILING may last one pass,
// which a loaded machine's poll could miss, waiting then for a state gone.
func waitState(t *testing.T, srv *testserver.Server, id string, state tetherv1.TerminationState) *tetherv1.Termination {
	t.Helper()
	var last supervisor.Termination
	stateOf := func(tm supervisor.Termination) tetherv1.TerminationState {
		return tetherv1.TerminationState(tetherv1.TerminationState_value["TERMINATION_STATE_"+strings.ToUpper(tm.Phase.String())])
	}
	reached := func() bool {
		return stateOf(last) == state ||
			state == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING && last.Phase == supervisor.PhaseTerminated ||
			// Past the drain: said below, at once, not after a timeout.
			state == tetherv1.TerminationState_TERMINATION_STATE_DRAINING && last.Phase > supervisor.PhaseDraining ||
			// Aborting is held open only by a call whose cancel is not
			// acknowledged; with none, an abort (or an escalated drain)
			// passes it in the pass that orders the cancels, so a wait
			// for it is met by a state past it, the cancels ordered.
			state == tetherv1.TerminationState_TERMINATION_STATE_ABORTING && last.Phase > supervisor.PhaseAborting &&
				(last.Mode == supervisor.ModeAbort || last.Escalated)
	}
	defer func() {
		// A wait that timed out says where the termination stood.
		if last.ID != "" && !reached() {
			t.Logf("termination %s was last seen as: %+v", id, last)
		}
	}()
	testserver.WaitFor(t, 20*time.Second, "termination "+id+" to reach "+state.String(), func() bool {
		err := srv.Store().View(context.Background(), func(tx store.ReadTxn) error {
			var err error
			last, err = supervisor.GetTerminationIn(tx, id)
			return err
		})
		if err != nil {
			t.Fatalf("read termination %s: %v", id, err)
		}
		return reached()
	})
	if state == tetherv1.TerminationState_TERMINATION_STATE_DRAINING && (last.Phase != supervisor.PhaseDraining || last.Progress.CallsInFlight == 0 && last.Progress.CancelsPending == 0) {
		// Only a call in flight (or one it carries with a cancel order
		// unanswered) holds a drain open: with none it ends in the next
		// pass, so a wait for DRAINING would pass only when its poll came
		// first (on a loaded machine, seldom). A test that waits for
		// DRAINING holds the drain open with a call of its own; one that
		// does not is told so at once, not after a timeout.
		t.Fatalf("termination %s, awaited draining, is %s with %d call(s) in flight: nothing held the drain open (begin a call before the stop, or wait for what the test needs)", id, last.Phase, last.Progress.CallsInFlight)
	}
	if state == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		// A drain that ends reconciles a pass before it revokes, and the
		// confirm timeout runs from the revocation: a test that moves the
		// clock past that timeout waits for the revocation first (on etcd
		// the pass in between is often slower than the test).
		testserver.WaitFor(t, 20*time.Second, "termination "+id+" to revoke its subtree", func() bool {
			var revoked bool
			err := srv.Store().View(context.Background(), func(tx store.ReadTxn) error {
				stored, err := supervisor.GetTerminationIn(tx, id)
				revoked = stored.Revoked || stored.Phase != supervisor.PhaseReconciling
				return err
			})
			return err == nil && revoked
		})
	}
	return getTermination(t, srv.AdminClients(), id)
}

// sessionEndStored reports whether the node's session's end is stored,
// read from the store: a wait on it costs no caller's rate budget (see
// waitState).
func sessionEndStored(t *testing.T, srv *testserver.Server, nodeID string) bool {
	t.Helper()
	var closed bool
	err := srv.Store().View(context.Background(), func(tx store.ReadTxn) error {
		n, err := tree.GetNodeIn(tx, nodeID)
		if err == nil {
			closed = !n.SessionClosedAt.IsZero()
		}
		return err
	})
	if err != nil {
		t.Fatalf("read node %s: %v", nodeID, err)
	}
	return closed
}

func record(t *testing.T, c *testserver.Clients, termID string) *tetherv1.ReconciliationRecord {
	t.Helper()
	resp, err := c.Supervisor.GetRecord(context.Background(), connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: termID}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Record
}

func nodeOutcomes(rec *tetherv1.ReconciliationRecord) map[string]tetherv1.NodeOutcome {
	out := map[string]tetherv1.NodeOutcome{}
	for _, n := range rec.Nodes {
		if _, dup := out[n.NodeId]; dup {
			out[n.NodeId] = -1 // listed twice: a defect the caller will see
			continue
		}
		out[n.NodeId] = n.Outcome
	}
	return out
}

func TestSelfTerminationAndTerminationByADescendantAreRefused(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	child := spawn(t, srv.Clients(root.Credential), root.Node.NodeId, "child")
	grandchild := spawn(t, srv.Clients(child.Credential), child.Node.NodeId, "grandchild")
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		caller string
		target string
		want   connect.Code
	}{
		{"self", child.Credential, child.Node.NodeId, connect.CodePermissionDenied},
		{"descendant", grandchild.Credential, child.Node.NodeId, connect.CodePermissionDenied},
		{"descendant of the root", child.Credential, root.Node.NodeId, connect.CodePermissionDenied},
	} {
		_, err := srv.Clients(tc.caller).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: tc.target}))
		if connect.CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
	}
	n, err := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: child.Node.NodeId}))
	if err != nil || n.Msg.Node.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("a refused termination changed the node: %v %v", n, err)
	}
	// An ancestor may.
	term := terminate(t, srv.Clients(root.Credential), grandchild.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	if term.RequestedBy != "agent:"+root.Node.NodeId {
		t.Fatalf("requested_by = %q", term.RequestedBy)
	}
}

// TestRogueChildIsUnaccountedWhileItsCredentialIsRejected: a worker that
// honours the drain claims its exit as its session's last word; a rogue
// sibling that ignores it is unaccounted in the record, and its credential
// is dead anyway.
func TestRogueChildIsUnaccountedWhileItsCredentialIsRejected(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	planner, err := agentsdk.RegisterRoot(ctx, agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP)), "planner", nil)
	if err != nil {
		t.Fatal(err)
	}
	workerChild, err := planner.Spawn(ctx, "worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := planner.Spawn(ctx, "rogue", nil)
	if err != nil {
		t.Fatal(err)
	}
	worker, err := agentsdk.Join(ctx, srv.URL, workerChild.Credential, srv.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan agentsdk.Signal, 1)
	worker.OnDrain(func(s agentsdk.Signal) { drained <- s })
	go worker.Run(ctx)
	go planner.Run(ctx)
	<-worker.Opened()
	<-planner.Opened()
	go func() {
		<-planner.Draining()
		_ = planner.Exit(context.Background(), "drained")
	}()

	term := terminate(t, admin, planner.NodeID(), tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 30*time.Second, 5*time.Second, 60*time.Second)
	sig := <-drained // pushed on the session, not polled
	if sig.Abort || sig.TerminationID != term.TerminationId {
		t.Fatalf("worker got %+v", sig)
	}
	if err := worker.Exit(ctx, "drained"); err != nil {
		t.Fatal(err)
	}
	// The rogue ignores the drain. Its spawns are refused already.
	if _, err := srv.Clients(rogue.Credential).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "more"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("rogue spawn while draining: %v", err)
	}
	testserver.WaitFor(t, 10*time.Second, "two confirmations", func() bool {
		return getTermination(t, admin, term.TerminationId).Progress.GetConfirmations() == 2
	})
	if st := getTermination(t, admin, term.TerminationId).State; st != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		t.Fatalf("before the confirm timeout the termination is %s, want reconciling", st)
	}
	clk.Advance(61 * time.Second)
	done := waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	rec := record(t, admin, done.TerminationId)
	outcomes := nodeOutcomes(rec)
	if len(rec.Nodes) != 3 {
		t.Fatalf("record lists %d nodes, want 3", len(rec.Nodes))
	}
	if outcomes[rogue.Node.NodeId] != tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
		t.Fatalf("rogue is %v, want unaccounted", outcomes[rogue.Node.NodeId])
	}
	for _, id := range []string{planner.NodeID(), worker.NodeID()} {
		if outcomes[id] != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
			t.Fatalf("%s is %v, want confirmed", id, outcomes[id])
		}
	}
	// The worker's own word is a claim; what confirms it is the control
	// plane's observation (its session ended right after the claim, and
	// nothing came from it since).
	for _, n := range rec.Nodes {
		if n.NodeId == worker.NodeID() && (!strings.HasSuffix(n.ClaimedBy, "(self)") || n.ConfirmedBy != "control-plane") {
			t.Fatalf("worker claimed_by %q confirmed_by %q, want its own claim corroborated by the control plane", n.ClaimedBy, n.ConfirmedBy)
		}
	}
	// The rogue's credential is dead.
	if _, err := srv.Clients(rogue.Credential).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("rogue's credential after termination: %v", err)
	}
	// The record reached the sink.
	path := filepath.Join(srv.DataDir, "records", rec.RecordId+".json")
	testserver.WaitFor(t, 10*time.Second, "the record file", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
}

// TestSpawnRacingATerminationIsNeverMissed spawns under the subtree from
// many goroutines while it is being terminated: every spawn that was
// acknowledged is in the record, and every other one was refused.
func TestSpawnRacingATerminationIsNeverMissed(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	parent := spawn(t, admin, root.Node.NodeId, "spawner")
	spawner := srv.Clients(parent.Credential)
	var (
		mu      sync.Mutex
		acked   []string
		refused int
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < 40; i++ {
				resp, err := spawner.Agent.Spawn(context.Background(), connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent.Node.NodeId, Name: "racer"}))
				mu.Lock()
				if err == nil {
					acked = append(acked, resp.Msg.Node.NodeId)
				} else if code := connect.CodeOf(err); code == connect.CodeFailedPrecondition || code == connect.CodeUnauthenticated {
					refused++
				} else {
					t.Errorf("spawn: %v", err)
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
	wg.Wait()
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	outcomes := nodeOutcomes(record(t, admin, term.TerminationId))
	for _, id := range acked {
		if _, ok := outcomes[id]; !ok {
			t.Errorf("acknowledged spawn %s is missing from the record", id)
		}
	}
	for id, o := range outcomes {
		if o == -1 {
			t.Errorf("node %s listed twice", id)
		}
	}
	if len(outcomes) != len(acked)+2 {
		t.Errorf("record has %d nodes; %d spawns acknowledged + root + spawner", len(outcomes), len(acked))
	}
	t.Logf("%d spawns acknowledged and recorded, %d refused", len(acked), refused)
}

func TestStopProposalDoesNothingUntilApproved(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	root := register(t, admin, "root")
	agent := srv.Clients(root.Credential)
	ctx := context.Background()
	resp, err := agent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "task finished"}))
	if err != nil {
		t.Fatal(err)
	}
	prop := resp.Msg.Proposal
	if prop.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
		t.Fatalf("proposal state %s", prop.State)
	}
	n, _ := admin.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: root.Node.NodeId}))
	if n.Msg.Node.State != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("a pending proposal moved the node to %s", n.Msg.Node.State)
	}
	// The agent cannot decide its own proposal.
	if _, err := agent.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.ProposalId, Approve: true})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("agent deciding its own proposal: %v", err)
	}
	if _, err := agent.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "whenever I like"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unknown condition: %v", err)
	}
	dec, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.ProposalId, Approve: true}))
	if err != nil {
		t.Fatal(err)
	}
	if dec.Msg.Termination == nil || dec.Msg.Termination.RequestedBy != "operator:admin" {
		t.Fatalf("approval did not start a termination requested by the operator: %v", dec.Msg.Termination)
	}
	if _, err := admin.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: prop.ProposalId, Approve: false})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("deciding twice: %v", err)
	}
}
