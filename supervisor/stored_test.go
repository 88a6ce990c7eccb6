package supervisor_test

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/internal/storecodec"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The stored proposals and records keep the bytes of their tether.v1
// messages: what the previous version wrote (proto.Marshal of the
// message) reads back as the same domain value, and what this version
// writes decodes, as a message, to what the RPC edge sends.

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)

func fullFiring() *supervisor.StopRuleFiring {
	return &supervisor.StopRuleFiring{
		RuleID: "rule_1", Name: "too-many-shells", Expression: `observed.calls_by_tool["shell"] >= 3`, SetBy: "operator:alice",
		Severity: "critical", Labels: map[string]string{"team": "research", "tier": "batch"}, RuleNodeID: "node_r",
		NodeID: "node_1", SelfReported: true, FiredAt: t0.Add(time.Second), Action: "abort",
		Values: []supervisor.StopRuleValue{
			{Name: `observed.calls_by_tool["shell"]`, Value: "3"},
			{Name: "self_reported.cost_usd", Value: "12.5", SelfReported: true},
		},
	}
}

func fullProposal(nodeID string) *supervisor.StopProposal {
	return &supervisor.StopProposal{
		ProposalID: id.New(id.Proposal), NodeID: nodeID, Condition: "calls>=3", Reason: "done", State: supervisor.ProposalStatePending,
		ProposedBy: "agent:" + nodeID, DecidedBy: "operator:bob", TerminationID: "term_1", CreatedAt: t0, DecidedAt: t0.Add(time.Minute),
		Mode: supervisor.ModeAbort, DrainWindow: 90 * time.Second, Rule: fullFiring(),
	}
}

// fullRecord is a record with every field set, two entries of each kind.
func fullRecord(recordID, terminationID string) *supervisor.ReconciliationRecord {
	node := func(i int) supervisor.RecordNode {
		return supervisor.RecordNode{
			NodeID: fmt.Sprint("node_", i), Name: fmt.Sprint("agent-", i), ParentNodeID: "node_0",
			Outcome: supervisor.NodeOutcomeUnaccounted, ConfirmedBy: "operator:launcher (launcher)", ConfirmedAt: t0.Add(2 * time.Second),
			LastSeenAt: t0.Add(3 * time.Second), HeldGrantIDs: []string{"grant_1", "grant_2"}, HeldJobIDs: []string{"job-a"},
			ClaimedBy: "agent:node_1 (self)", ClaimedAt: t0.Add(4 * time.Second),
			Contradictions: []tree.Contradiction{
				{Kind: "heartbeat", At: t0.Add(5 * time.Second), Detail: "a heartbeat after the exit"},
				{Kind: "tool_call", At: t0.Add(6 * time.Second), Detail: "shell"},
			},
			SessionClosedAt: t0.Add(7 * time.Second), SessionOpen: true, UnaccountedReason: "its session is still open",
			InnerTerminationID: "term_inner", InnerOutcome: supervisor.InnerOutcomeTakenOverAborting, InnerRecordID: "rec_inner",
			SupersededByTerminationID: "term_outer",
		}
	}
	call := func(i int) supervisor.RecordToolCall {
		return supervisor.RecordToolCall{
			CallID: fmt.Sprint("call_", i), NodeID: "node_1", Tool: "shell", GateID: "gate-1",
			Resolution: ledger.CallResolutionCancelUnacknowledged, BegunBy: "gate:gate-1", EndedBy: "termination:term_1", AcknowledgedBy: "agent:node_1",
		}
	}
	priv := func(i int) supervisor.RecordPrivilege {
		return supervisor.RecordPrivilege{
			PrivilegeID: fmt.Sprint("priv_", i), Kind: "file_lock", ExternalID: "/tmp/lock", NodeID: "node_1",
			Outcome: supervisor.PrivilegeOutcomeRevokeFailed, Error: "revoke webhook answered 500",
		}
	}
	lease := func(i int) supervisor.RecordLease {
		return supervisor.RecordLease{
			JobID: fmt.Sprint("job-", i), LeaseID: "L-1", LeaseGeneration: 1 << 40, HolderIdentity: "node_1",
			Outcome: supervisor.LeaseOutcomeHandedOver,
		}
	}
	return &supervisor.ReconciliationRecord{
		RecordID: recordID, TerminationID: terminationID, SchemaVersion: supervisor.RecordSchemaVersion, NodeID: "node_0",
		Mode: supervisor.ModeAbort, RequestedBy: "operator:alice", Reason: "stop", Escalated: true,
		Nodes: []supervisor.RecordNode{node(1), node(2)}, ToolCalls: []supervisor.RecordToolCall{call(1), call(2)},
		Privileges: []supervisor.RecordPrivilege{priv(1), priv(2)}, Leases: []supervisor.RecordLease{lease(1), lease(2)},
		Phases: []supervisor.RecordPhase{
			{Name: "requested", StartedAt: t0, Duration: 1500 * time.Millisecond},
			{Name: "aborting", StartedAt: t0.Add(1500 * time.Millisecond), Duration: time.Minute},
		},
		WrittenAt: t0.Add(time.Hour), RootNodeIDs: []string{"node_0", "node_9"}, RolloutID: "rollout_1", StopRule: fullFiring(),
	}
}

// bothWays checks that v (a pointer to a domain value) and m (the
// message the edge converts it to) have one stored form: storecodec's
// bytes decode as m, and m's bytes decode as v.
func bothWays(t *testing.T, v any, m proto.Message) {
	t.Helper()
	b, err := storecodec.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, m) {
		t.Fatalf("stored by this version, read as tether.v1:\n got %v\nwant %v", got, m)
	}
	old, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back := reflect.New(reflect.TypeOf(v).Elem())
	if err := storecodec.Unmarshal(old, back.Interface()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Interface(), v) {
		t.Fatalf("stored by the previous version, read by this one:\n got %+v\nwant %+v", back.Interface(), v)
	}
}

func TestStoredProposalReadsBothWays(t *testing.T) {
	p := fullProposal("node_1")
	bothWays(t, p, wire.Proposal(p))
	firing := fullFiring()
	bothWays(t, firing, wire.StopRuleFiring(firing))
}

func TestStoredRecordReadsBothWays(t *testing.T) {
	rec := fullRecord(id.New(id.Record), id.New(id.Termination))
	bothWays(t, rec, wire.Record(rec))
	for i := range rec.Nodes {
		bothWays(t, &rec.Nodes[i], wire.RecordNode(&rec.Nodes[i]))
	}
}

func openSupervisor(t *testing.T) (*supervisor.Supervisor, store.Store) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(t0)
	return &supervisor.Supervisor{Store: st, Clock: clk, Tree: &tree.Tree{Store: st, Clock: clk}, Log: log}, st
}

// TestAProposalStoredByThePreviousVersionIsDecided stores a pending
// proposal as the previous version did (the tether.v1 message's bytes):
// it is listed as the same proposal, and an operator's rejection decides
// it; what is stored then still reads as a tether.v1 message.
func TestAProposalStoredByThePreviousVersionIsDecided(t *testing.T) {
	s, st := openSupervisor(t)
	ctx := context.Background()
	want := fullProposal("node_1")
	want.DecidedBy, want.DecidedAt, want.TerminationID = "", time.Time{}, ""
	old, err := proto.Marshal(wire.Proposal(want))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx store.Txn) error {
		if err := tx.Put([]byte("proposals/"+want.ProposalID), old); err != nil {
			return err
		}
		return tx.Put([]byte("proposals-pending/node_1/"+want.ProposalID), nil)
	}); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Proposals(ctx, supervisor.ProposalStatePending, "", "", 0)
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("pending proposals: %+v, %v; want %+v", got, err, want)
	}
	decided, _, err := s.Decide(ctx, want.ProposalID, false, "no", "operator:bob")
	if err != nil {
		t.Fatal(err)
	}
	if decided.State != supervisor.ProposalStateRejected || decided.Rule == nil || decided.Rule.Name != want.Rule.Name {
		t.Fatalf("decided: %+v", decided)
	}
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		b, err := tx.Get([]byte("proposals/" + want.ProposalID))
		if err != nil {
			return err
		}
		return storedAs(b, wire.Proposal(decided))
	}); err != nil {
		t.Fatal(err)
	}
}

// storedAs reports whether b is m's encoding, read as a tether.v1 message.
func storedAs(b []byte, m proto.Message) error {
	got := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, got); err != nil {
		return err
	}
	if !proto.Equal(got, m) {
		return fmt.Errorf("stored:\n%v\nwant:\n%v", got, m)
	}
	return nil
}

// TestARecordStoredByThePreviousVersionReads stores records as the
// previous version did — the entries in one part, the header in the next
// ("2 1"), and an older one whole in one part ("1") — each part the bytes
// of a tether.v1 message. Each reads back as the same record: whole, in
// pages of one entry, and in the list.
func TestARecordStoredByThePreviousVersionReads(t *testing.T) {
	s, st := openSupervisor(t)
	ctx := context.Background()
	var recs []*supervisor.ReconciliationRecord
	for _, header := range []string{"2 1", "1"} {
		rec := fullRecord(id.New(id.Record), id.New(id.Termination))
		m := wire.Record(rec)
		var parts [][]byte
		if header == "1" {
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, b)
		} else {
			entries := &tetherv1.ReconciliationRecord{Nodes: m.Nodes, ToolCalls: m.ToolCalls, Privileges: m.Privileges, Leases: m.Leases}
			header := proto.Clone(m).(*tetherv1.ReconciliationRecord)
			header.Nodes, header.ToolCalls, header.Privileges, header.Leases = nil, nil, nil, nil
			for _, part := range []*tetherv1.ReconciliationRecord{entries, header} {
				b, err := proto.Marshal(part)
				if err != nil {
					t.Fatal(err)
				}
				parts = append(parts, b)
			}
		}
		if err := st.Update(ctx, func(tx store.Txn) error {
			for i, p := range parts {
				if err := tx.Put([]byte(fmt.Sprintf("records/%s/part/%06d", rec.RecordID, i)), p); err != nil {
					return err
				}
			}
			if err := tx.Put([]byte("records/"+rec.RecordID), []byte(header)); err != nil {
				return err
			}
			return tx.Put([]byte("records-by-term/"+rec.TerminationID), []byte(rec.RecordID))
		}); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)

		got, err := s.Record(ctx, "", rec.TerminationID)
		if err != nil || !reflect.DeepEqual(got, rec) {
			t.Fatalf("record %q read whole: %v\n got %+v\nwant %+v", header, err, got, rec)
		}
		page, next, err := s.RecordPage(ctx, rec.RecordID, "", "", 1)
		if err != nil {
			t.Fatal(err)
		}
		for next != "" {
			var more *supervisor.ReconciliationRecord
			more, next, err = s.RecordPage(ctx, "", "", next, 1)
			if err != nil {
				t.Fatal(err)
			}
			page.Nodes = append(page.Nodes, more.Nodes...)
			page.ToolCalls = append(page.ToolCalls, more.ToolCalls...)
			page.Privileges = append(page.Privileges, more.Privileges...)
			page.Leases = append(page.Leases, more.Leases...)
		}
		if !reflect.DeepEqual(page, rec) {
			t.Fatalf("record %q read in pages of one entry:\n got %+v\nwant %+v", header, page, rec)
		}
	}
	list, _, partial, err := s.Records(ctx, "", 10)
	if err != nil || len(list) != 2 || len(partial) != 0 {
		t.Fatalf("records: %d, partial %v, %v", len(list), partial, err)
	}
	for _, got := range list {
		i := 0
		if got.RecordID == recs[1].RecordID {
			i = 1
		}
		if !reflect.DeepEqual(got, recs[i]) {
			t.Fatalf("listed:\n got %+v\nwant %+v", got, recs[i])
		}
	}
}
