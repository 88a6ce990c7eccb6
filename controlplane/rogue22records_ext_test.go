package controlplane_test

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue22ARoguesStopsDoNotCostTheOperatorsRecordsOfItsTree: a listing
// of records filtered by both tree and requester read the tree's index
// and kept the entries of that requester, so "the operator's records of
// this tree" read every record of the tree: a rogue that stops its own
// children again and again (each stop an agent's record of its tree) made
// the operator's page of its tree cost as many index reads as it had
// stopped children — 20 for 20 stops, to find one record. The records are
// now also indexed by tree and requester together, and a listing with
// both filters reads that index only. (Fails if the page reads an index
// key per agent record of the tree, or misses the operator's record.)
func TestRogue22ARoguesStopsDoNotCostTheOperatorsRecordsOfItsTree(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &prefixCountingStore{Store: b}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	bg := context.Background()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	const stops = 20
	for i := range stops {
		child := spawn(t, rc, rogue.Node.NodeId, fmt.Sprintf("c%d", i))
		stopChild(t, srv, rc, child.Node.NodeId)
	}
	// One operator's stop in the rogue's tree, filed after the rogue's.
	victim := spawn(t, rc, rogue.Node.NodeId, "stopped-by-the-operator")
	term, err := admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: victim.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "operator"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: victim.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	want := waitState(t, srv, term.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).RecordId

	st.recordIndexes.Store(0)
	got, err := admin.Supervisor.ListRecords(bg, connect.NewRequest(&tetherv1.ListRecordsRequest{
		TreeNodeId: rogue.Node.NodeId, RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_OPERATOR, PageSize: 10}))
	if err != nil {
		t.Fatal(err)
	}
	if n := st.recordIndexes.Load(); n > 2 {
		t.Errorf("the operator's records of the rogue's tree read %d index keys, after the rogue's %d stops: want at most 2 (its one record)", n, stops)
	}
	if len(got.Msg.Records) != 1 || got.Msg.Records[0].RecordId != want {
		t.Errorf("the operator's records of the rogue's tree: %d records, want its one record %s", len(got.Msg.Records), want)
	}
	// The agent's records of the tree, by the same index, page by page.
	seen := 0
	token := ""
	for {
		page, err := admin.Supervisor.ListRecords(bg, connect.NewRequest(&tetherv1.ListRecordsRequest{
			TreeNodeId: rogue.Node.NodeId, RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_AGENT, PageSize: 7, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Msg.Records {
			if r.RecordId == want {
				t.Errorf("the agent's records of the rogue's tree list the operator's record %s", want)
			}
		}
		seen += len(page.Msg.Records)
		if token = page.Msg.NextPageToken; token == "" {
			break
		}
	}
	if seen != stops {
		t.Errorf("the agent's records of the rogue's tree: %d, want its %d stops", seen, stops)
	}
}
