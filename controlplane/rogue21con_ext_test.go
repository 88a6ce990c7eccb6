package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// prefixCountingStore is the server's real Badger store, counting the keys
// its scans read under the proposals' and the records' own prefixes (a
// read of every stored proposal, or every record), and under the records'
// indexes (records-by-…).
type prefixCountingStore struct {
	store.Store
	proposals, records, recordIndexes atomic.Int64
}

type prefixCountingRead struct {
	store.ReadTxn
	s *prefixCountingStore
}

type prefixCountingTxn struct {
	store.Txn
	s *prefixCountingStore
}

func (s *prefixCountingStore) count(prefix []byte, fn func(k, v []byte) error) func(k, v []byte) error {
	var n *atomic.Int64
	switch {
	case strings.HasPrefix(string(prefix), "proposals/"):
		n = &s.proposals
	case strings.HasPrefix(string(prefix), "records/"):
		n = &s.records
	case strings.HasPrefix(string(prefix), "records-by-"):
		n = &s.recordIndexes
	default:
		return fn
	}
	return func(k, v []byte) error { n.Add(1); return fn(k, v) }
}

func (r prefixCountingRead) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return r.ReadTxn.Scan(prefix, start, r.s.count(prefix, fn))
}

func (r prefixCountingTxn) Scan(prefix, start []byte, fn func(k, v []byte) error) error {
	return r.Txn.Scan(prefix, start, r.s.count(prefix, fn))
}

func (s *prefixCountingStore) View(ctx context.Context, fn func(tx store.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx store.ReadTxn) error { return fn(prefixCountingRead{tx, s}) })
}

func (s *prefixCountingStore) Update(ctx context.Context, fn func(tx store.Txn) error) error {
	return s.Store.Update(ctx, func(tx store.Txn) error { return fn(prefixCountingTxn{tx, s}) })
}

// stopChild has parent stop its child (abort) and confirm its exit, and
// returns the record's id.
func stopChild(t *testing.T, srv *testserver.Server, parent *testserver.Clients, child string) string {
	t.Helper()
	bg := context.Background()
	term, err := parent.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: child, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "churn"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child})); err != nil {
		t.Fatal(err)
	}
	return waitState(t, srv, term.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).RecordId
}

// rejectedProposals has each of n new children of parent propose its stop,
// and an operator reject it.
func rejectedProposals(t *testing.T, srv *testserver.Server, parent *testserver.Clients, parentID string, n int) {
	t.Helper()
	bg := context.Background()
	admin := srv.AdminClients()
	for i := range n {
		child, err := parent.Agent.Spawn(bg, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parentID, Name: fmt.Sprintf("p%d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		p, err := srv.Clients(child.Msg.Credential).Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "again"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Supervisor.DecideProposal(bg, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.Msg.Proposal.ProposalId})); err != nil {
			t.Fatal(err)
		}
	}
}

// TestARoguesDecidedProposalsAreNotReadForAnotherNode: ListProposals of
// one node found the node's decided proposals by reading every stored
// one, and decided ones are never pruned: a rogue tree whose children
// each propose and are rejected, again and again, made every node page
// (and every `proposal ls --node`) read all of them. A node's proposals,
// decided ones too, are now read from an index by node. (Fails if a
// node's listing scans the stored proposals, or misses its decided one.)
func TestARoguesDecidedProposalsAreNotReadForAnotherNode(t *testing.T) {
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
	rejectedProposals(t, srv, srv.Clients(rogue.Credential), rogue.Node.NodeId, 30)
	victim := register(t, admin, "victim")
	vc := srv.Clients(victim.Credential)
	p, err := vc.Agent.ProposeStop(bg, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "mine"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Supervisor.DecideProposal(bg, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.Msg.Proposal.ProposalId})); err != nil {
		t.Fatal(err)
	}
	for _, state := range []tetherv1.ProposalState{tetherv1.ProposalState_PROPOSAL_STATE_UNSPECIFIED, tetherv1.ProposalState_PROPOSAL_STATE_REJECTED} {
		st.proposals.Store(0)
		got, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: victim.Node.NodeId, State: state}))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Msg.Proposals) != 1 || got.Msg.Proposals[0].ProposalId != p.Msg.Proposal.ProposalId {
			t.Errorf("ListProposals of the victim (state %v) answers %d proposals, want its rejected one", state, len(got.Msg.Proposals))
		}
		if n := st.proposals.Load(); n != 0 {
			t.Errorf("ListProposals of the victim (state %v) scanned %d stored proposals (the rogue tree's 30 among them), want none: its index only", state, n)
		}
	}
}

// TestARoguesOwnStopsAreListedApartFromAnOperatorsRecords: ListRecords had
// no filter; an agent that stops its own children writes a record each
// time, and an operator's record sank among them. ListRecords now filters
// by tree and by requester, each from an index. (Fails if a filtered
// listing carries another tree's or requester's record, or scans the
// stored records.)
func TestARoguesOwnStopsAreListedApartFromAnOperatorsRecords(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	st := &prefixCountingStore{Store: b}
	srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	bg := context.Background()
	victim := register(t, admin, "victim")
	worker := spawn(t, srv.Clients(victim.Credential), victim.Node.NodeId, "worker")
	opTerm, err := admin.Supervisor.Terminate(bg, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: worker.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "operator's stop"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Agent.ConfirmExit(bg, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: worker.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	opRecord := waitState(t, srv, opTerm.Msg.Termination.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED).RecordId
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	rogueRecords := map[string]bool{}
	for i := range 12 {
		child := spawn(t, rc, rogue.Node.NodeId, fmt.Sprintf("c%d", i))
		rogueRecords[stopChild(t, srv, rc, child.Node.NodeId)] = true
	}
	list := func(req *tetherv1.ListRecordsRequest) []string {
		t.Helper()
		st.records.Store(0)
		var ids []string
		for {
			resp, err := admin.Supervisor.ListRecords(bg, connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range resp.Msg.Records {
				ids = append(ids, r.RecordId)
			}
			if resp.Msg.NextPageToken == "" {
				break
			}
			req.PageToken = resp.Msg.NextPageToken
		}
		if n := st.records.Load(); n != 0 {
			t.Errorf("a filtered ListRecords (%v) scanned %d keys of the stored records, want none: its index only", req, n)
		}
		return ids
	}
	if got := list(&tetherv1.ListRecordsRequest{RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_OPERATOR}); len(got) != 1 || got[0] != opRecord {
		t.Errorf("the operators' records: %v, want the operator's one, %s", got, opRecord)
	}
	// Any node of the tree names it: the victim's worker, stopped.
	if got := list(&tetherv1.ListRecordsRequest{TreeNodeId: worker.Node.NodeId}); len(got) != 1 || got[0] != opRecord {
		t.Errorf("the victim's tree's records: %v, want the operator's one, %s", got, opRecord)
	}
	for _, req := range []*tetherv1.ListRecordsRequest{
		{TreeNodeId: rogue.Node.NodeId, PageSize: 5},
		{RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_AGENT, PageSize: 5},
		{TreeNodeId: rogue.Node.NodeId, RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_AGENT, PageSize: 5},
	} {
		got := list(req)
		seen := map[string]bool{}
		for _, id := range got {
			if !rogueRecords[id] || seen[id] {
				t.Errorf("the rogue's records (%v) list %s, not one of its stops' or twice", req, id)
			}
			seen[id] = true
		}
		if len(seen) != len(rogueRecords) {
			t.Errorf("the rogue's records (%v) list %d, want its %d", req, len(seen), len(rogueRecords))
		}
	}
	if got := list(&tetherv1.ListRecordsRequest{TreeNodeId: rogue.Node.NodeId, RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_OPERATOR}); len(got) != 0 {
		t.Errorf("the operators' records of the rogue's tree: %v, want none", got)
	}
	for _, c := range []struct {
		req  *tetherv1.ListRecordsRequest
		code connect.Code
	}{
		{&tetherv1.ListRecordsRequest{TreeNodeId: "not-a-node"}, connect.CodeInvalidArgument},
		{&tetherv1.ListRecordsRequest{TreeNodeId: "n_00000000000000000000"}, connect.CodeNotFound},
		{&tetherv1.ListRecordsRequest{RequestedBy: 9}, connect.CodeInvalidArgument},
	} {
		if _, err := admin.Supervisor.ListRecords(bg, connect.NewRequest(c.req)); connect.CodeOf(err) != c.code {
			t.Errorf("ListRecords(%v): %v, want %v", c.req, err, c.code)
		}
	}
}

// TestProposalsAndRecordsStoredBeforeTheirIndexesAreIndexedAtStart: a
// data directory written before the indexes of proposals by node and of
// records by tree and requester has neither; the server indexes it at
// start, a chunk per transaction and the mark last, so that a start
// killed half-way (some entries indexed, no mark) is finished by the
// next. (Fails if a restarted server's filtered listings miss what was
// stored without its index.)
func TestProposalsAndRecordsStoredBeforeTheirIndexesAreIndexedAtStart(t *testing.T) {
	dir := t.TempDir()
	srv := testserver.StartIn(t, dir)
	admin := srv.AdminClients()
	bg := context.Background()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	rejectedProposals(t, srv, rc, rogue.Node.NodeId, 3)
	var records []string
	for i := range 3 {
		child := spawn(t, rc, rogue.Node.NodeId, fmt.Sprintf("c%d", i))
		records = append(records, stopChild(t, srv, rc, child.Node.NodeId))
	}
	all, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Msg.Proposals) != 3 {
		t.Fatalf("%d proposals stored, want 3", len(all.Msg.Proposals))
	}
	srv.Stop()
	// As an earlier version left it: no index, no mark; then as a start
	// killed half-way left it: one record's and one proposal's entries;
	// then as the version before the index of records by tree and
	// requester left it: the other indexes and their mark, not that one.
	everyIndex := []string{"proposals-by-node/", "records-by-tree/", "records-by-requester/", "records-by-tree-requester/", "supervisor-meta/"}
	unindex := func(keep int, prefixes ...string) {
		t.Helper()
		// The store the server ran on: Badger in dir, or its etcd keyspace.
		st := testserver.OpenStoreOf(t, dir)
		defer st.Close()
		err = st.Update(bg, func(tx store.Txn) error {
			for _, prefix := range prefixes {
				var keys [][]byte
				if err := tx.Scan([]byte(prefix), nil, func(k, _ []byte) error {
					keys = append(keys, append([]byte(nil), k...))
					return nil
				}); err != nil {
					return err
				}
				if len(keys) == 0 && !strings.HasPrefix(prefix, "supervisor-meta/") {
					return fmt.Errorf("no keys under %s: the test no longer knows the index's layout", prefix)
				}
				if strings.HasPrefix(prefix, "supervisor-meta/") {
					keep = 0 // never the mark
				}
				for _, k := range keys[min(keep, len(keys)):] {
					if err := tx.Delete(k); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string) {
		t.Helper()
		srv := testserver.StartIn(t, dir)
		defer srv.Stop()
		admin := srv.AdminClients()
		for _, p := range all.Msg.Proposals {
			got, err := admin.Supervisor.ListProposals(bg, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: p.NodeId}))
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Msg.Proposals) != 1 || got.Msg.Proposals[0].ProposalId != p.ProposalId {
				t.Errorf("%s: ListProposals of node %s answers %d proposals, want its rejected one", what, p.NodeId, len(got.Msg.Proposals))
			}
		}
		for _, req := range []*tetherv1.ListRecordsRequest{
			{TreeNodeId: rogue.Node.NodeId},
			{RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_AGENT},
			{TreeNodeId: rogue.Node.NodeId, RequestedBy: tetherv1.RecordRequester_RECORD_REQUESTER_AGENT},
		} {
			got, err := admin.Supervisor.ListRecords(bg, connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Msg.Records) != len(records) {
				t.Errorf("%s: ListRecords(%v) lists %d records, want the rogue's %d", what, req, len(got.Msg.Records), len(records))
			}
		}
	}
	unindex(0, everyIndex...)
	check("a data directory without the indexes")
	unindex(1, everyIndex...)
	check("a data directory indexed in part, without the mark")
	unindex(0, "records-by-tree-requester/", "supervisor-meta/indexed/records-by-tree-requester")
	check("a data directory with the indexes before the one by tree and requester")
}
