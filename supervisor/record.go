package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

// RecordSchemaVersion is the version of the reconciliation record's schema
// (docs/record.schema.json). It changes only compatibly: fields are added,
// never renamed or re-typed.
const RecordSchemaVersion = 1

// recordPartBytes keeps each stored part of a record under the store's
// value limit; a record of a 10,000-agent subtree spans a few parts.
const recordPartBytes = 512 << 10

// buildRecord assembles the record from stored state inside the
// transaction that terminates the subtree: nodes and their confirmations,
// the calls the termination had to account for, privileges, grants and
// leases. Open calls still waiting for a cancel ack are closed here as
// cancel_unacknowledged.
func buildRecord(tx store.Txn, t Termination, grants []HeldGrant, leases []*tetherv1.RecordLease, now time.Time) (*tetherv1.ReconciliationRecord, error) {
	rec := &tetherv1.ReconciliationRecord{
		RecordId:      id.New(id.Record),
		TerminationId: t.ID,
		SchemaVersion: RecordSchemaVersion,
		NodeId:        t.NodeID,
		Mode:          modeToProto(t.Mode),
		RequestedBy:   t.RequestedBy,
		Reason:        t.Reason,
		Escalated:     t.Escalated,
		WrittenAt:     timestamppb.New(now),
		Leases:        leases,
		RootNodeIds:   t.Roots,
		RolloutId:     t.RolloutID,
	}
	if t.ProposalID != "" {
		p := &tetherv1.StopProposal{}
		if err := getProto(tx, proposalKey(t.ProposalID), p); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		rec.StopRule = p.Rule
	}
	heldGrants := map[string][]string{}
	liveGrants := map[string][]string{}
	for _, g := range grants {
		heldGrants[g.NodeID] = append(heldGrants[g.NodeID], g.GrantID)
		outcome := tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED
		switch g.Outcome {
		case privilege.OutcomeRevoked:
			outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED
		case privilege.OutcomeExpired:
			outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_EXPIRED
		default:
			liveGrants[g.NodeID] = append(liveGrants[g.NodeID], g.GrantID)
		}
		rec.Privileges = append(rec.Privileges, &tetherv1.RecordPrivilege{
			PrivilegeId: g.GrantID, Kind: "grant", ExternalId: g.GrantID, NodeId: g.NodeID, Outcome: outcome,
		})
	}
	heldJobs := map[string][]string{}
	for _, l := range leases {
		heldJobs[l.HolderIdentity] = append(heldJobs[l.HolderIdentity], l.JobId)
	}
	if err := store.Prefetch(tx, keysOf(t.Members, nodeKey), nil); err != nil {
		return nil, err
	}
	inWorkload := t.workloadIn(tx)
	for _, m := range t.Members {
		n, err := getNode(tx, m)
		if err != nil {
			return nil, err
		}
		rec.Nodes = append(rec.Nodes, recordNode(n, inWorkload, liveGrants[n.NodeId], heldGrants[n.NodeId], heldJobs[n.NodeId]))
	}
	if err := composeRecordNodes(tx, t, rec); err != nil {
		return nil, err
	}
	privs, err := privilege.PrivilegesIn(tx, t.Members)
	if err != nil {
		return nil, err
	}
	for _, p := range privs {
		outcome := tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED
		switch p.Outcome {
		case privilege.OutcomeRevoked:
			outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED
		case privilege.OutcomeExpired:
			outcome = tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_EXPIRED
		}
		rec.Privileges = append(rec.Privileges, &tetherv1.RecordPrivilege{
			PrivilegeId: p.ID, Kind: p.Kind, ExternalId: p.ExternalID, NodeId: p.NodeID, Outcome: outcome, Error: p.Error,
		})
	}
	// Every call the termination had to account for.
	var callIDs []string
	prefix := termCallPrefix(t.ID)
	if err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		callIDs = append(callIDs, string(k[len(prefix):]))
		return nil
	}); err != nil {
		return nil, err
	}
	if err := store.Prefetch(tx, keysOf(callIDs, callKey), nil); err != nil {
		return nil, err
	}
	ts := timestamppb.New(now)
	for _, cid := range callIDs {
		c, err := getCall(tx, cid)
		if err != nil {
			return nil, err
		}
		if c.State != tetherv1.CallState_CALL_STATE_ENDED {
			// Never acknowledged (or, after an escalation, never ended):
			// close it in the ledger so the record and the ledger agree.
			c.State = tetherv1.CallState_CALL_STATE_ENDED
			c.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED
			c.EndedAt = ts
			c.EndedBy = "termination:" + t.ID
			if err := tx.Delete(openCallKey(c.NodeId, c.CallId)); err != nil {
				return nil, err
			}
			if err := tx.Delete(cancelKey(c.GateId, c.CallId)); err != nil {
				return nil, err
			}
			if err := putCall(tx, c); err != nil {
				return nil, err
			}
		}
		rec.ToolCalls = append(rec.ToolCalls, &tetherv1.RecordToolCall{
			CallId: c.CallId, NodeId: c.NodeId, Tool: c.Tool, GateId: c.GateId, Resolution: c.Resolution,
			BegunBy: c.BegunBy, EndedBy: c.EndedBy, AcknowledgedBy: c.AcknowledgedBy,
		})
	}
	sort.Slice(rec.ToolCalls, func(i, j int) bool { return rec.ToolCalls[i].CallId < rec.ToolCalls[j].CallId })
	for _, ph := range t.Phases {
		rec.Phases = append(rec.Phases, &tetherv1.RecordPhase{
			Name: ph.Phase.String(), StartedAt: timestamppb.New(ph.StartedAt), Duration: durationpb.New(ph.Duration),
		})
	}
	return rec, nil
}

// composeRecordNodes completes the record's nodes where terminations
// composed: members taken over from another termination name it and the
// node's state under it; nodes another termination accounts for are listed
// superseded, naming it; nodes an earlier termination had terminated are
// listed with that termination, its record and the outcome it gave them.
// With the members, every node of the subtree is listed exactly once.
func composeRecordNodes(tx store.Txn, t Termination, rec *tetherv1.ReconciliationRecord) error {
	if len(t.TakenOver) > 0 {
		taken := make(map[string]Handoff, len(t.TakenOver))
		for _, h := range t.TakenOver {
			taken[h.NodeID] = h
		}
		for _, rn := range rec.Nodes {
			h, ok := taken[rn.NodeId]
			if !ok {
				continue
			}
			rn.InnerTerminationId = h.TerminationID
			rn.InnerOutcome = tetherv1.InnerOutcome_INNER_OUTCOME_TAKEN_OVER_DRAINING
			if h.State == tree.StateName(tetherv1.NodeState_NODE_STATE_ABORTING) {
				rn.InnerOutcome = tetherv1.InnerOutcome_INNER_OUTCOME_TAKEN_OVER_ABORTING
			}
		}
	}
	others := append(append([]Handoff(nil), t.HandedOver...), t.Prior...)
	if len(others) == 0 {
		return nil
	}
	ids := make([]string, len(others))
	for i, h := range others {
		ids[i] = h.NodeID
	}
	if err := store.Prefetch(tx, keysOf(ids, nodeKey), nil); err != nil {
		return err
	}
	for _, h := range t.HandedOver {
		n, err := getNode(tx, h.NodeID)
		if err != nil {
			return err
		}
		rec.Nodes = append(rec.Nodes, &tetherv1.RecordNode{
			NodeId: n.NodeId, Name: n.Name, ParentNodeId: n.ParentNodeId, LastSeenAt: n.LastSeenAt,
			Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED, SupersededByTerminationId: h.TerminationID,
		})
	}
	// The outcome an earlier record gave each prior node (each record
	// read once).
	earlier := map[string]map[string]*tetherv1.RecordNode{}
	for _, h := range t.Prior {
		n, err := getNode(tx, h.NodeID)
		if err != nil {
			return err
		}
		rn := &tetherv1.RecordNode{
			NodeId: n.NodeId, Name: n.Name, ParentNodeId: n.ParentNodeId, LastSeenAt: n.LastSeenAt,
			Outcome:            tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED,
			InnerTerminationId: h.TerminationID, InnerOutcome: tetherv1.InnerOutcome_INNER_OUTCOME_TERMINATED, InnerRecordId: h.RecordID,
		}
		if h.RecordID != "" {
			nodes, ok := earlier[h.RecordID]
			if !ok {
				prev, err := getRecord(tx, h.RecordID)
				if err != nil {
					return err
				}
				nodes = make(map[string]*tetherv1.RecordNode, len(prev.Nodes))
				for _, pn := range prev.Nodes {
					nodes[pn.NodeId] = pn
				}
				earlier[h.RecordID] = nodes
			}
			if pn, ok := nodes[n.NodeId]; ok {
				rn.Outcome, rn.ConfirmedBy, rn.ConfirmedAt = pn.Outcome, pn.ConfirmedBy, pn.ConfirmedAt
			}
		}
		rec.Nodes = append(rec.Nodes, rn)
	}
	return nil
}

// recordNode is a node's entry: its exit weighed against the control
// plane's evidence (judgeExit), the claim and the contradictions shown.
func recordNode(n *tetherv1.Node, inWorkload func(nodeID string) bool, liveGrants, heldGrants, heldJobs []string) *tetherv1.RecordNode {
	v := judgeExit(n, inWorkload, liveGrants)
	rn := &tetherv1.RecordNode{
		NodeId: n.NodeId, Name: n.Name, ParentNodeId: n.ParentNodeId, LastSeenAt: n.LastSeenAt,
		ClaimedBy: v.ClaimedBy, ClaimedAt: v.ClaimedAt, Contradictions: n.Contradictions,
		SessionClosedAt: n.SessionClosedAt, SessionOpen: sessionOpen(n),
	}
	if v.Confirmed {
		rn.Outcome = tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED
		rn.ConfirmedBy, rn.ConfirmedAt = v.ConfirmedBy, v.ConfirmedAt
		return rn
	}
	rn.Outcome = tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED
	rn.UnaccountedReason = v.UnaccountedReason
	rn.HeldGrantIds = heldGrants
	rn.HeldJobIds = heldJobs
	return rn
}

// stoppedSet is the set of nodes this termination stops: an ancestor among
// them that confirms a descendant's exit only claims it.
func (t Termination) stoppedSet() map[string]bool {
	set := make(map[string]bool, len(t.Members))
	for _, m := range t.Members {
		set[m] = true
	}
	return set
}

// workloadIn reports, read in tx, whether a node is part of the workload
// being stopped, so that its word about a descendant's exit is only a
// claim: a node this termination stops, or one that is itself stopping,
// stopped or exited — under another termination, or by its own claim. Only
// an ancestor still running outside every stop attests.
func (t Termination) workloadIn(tx store.ReadTxn) func(nodeID string) bool {
	stopped := t.stoppedSet()
	seen := map[string]bool{}
	return func(nodeID string) bool {
		if stopped[nodeID] {
			return true
		}
		in, ok := seen[nodeID]
		if !ok {
			n, err := getNode(tx, nodeID)
			in = err != nil || n.State != tetherv1.NodeState_NODE_STATE_RUNNING || exitConfirmed(n)
			seen[nodeID] = in
		}
		return in
	}
}

// putRecord stores a record in parts under the store's value limit.
func putRecord(tx store.Txn, rec *tetherv1.ReconciliationRecord) error {
	b, err := proto.Marshal(rec)
	if err != nil {
		return err
	}
	parts := 0
	for off := 0; off < len(b) || parts == 0; off += recordPartBytes {
		end := min(off+recordPartBytes, len(b))
		if err := tx.Put(recordPartKey(rec.RecordId, parts), b[off:end]); err != nil {
			return err
		}
		parts++
	}
	if err := tx.Put(recordKey(rec.RecordId), []byte(strconv.Itoa(parts))); err != nil {
		return err
	}
	return tx.Put(recordByTermKey(rec.TerminationId), []byte(rec.RecordId))
}

func getRecord(tx store.ReadTxn, recordID string) (*tetherv1.ReconciliationRecord, error) {
	v, err := tx.Get(recordKey(recordID))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: record_id %s", ErrRecordNotFound, recordID)
	}
	if err != nil {
		return nil, err
	}
	parts, err := strconv.Atoi(string(v))
	if err != nil {
		return nil, fmt.Errorf("supervisor: record %s header: %w", recordID, err)
	}
	var b []byte
	for i := range parts {
		part, err := tx.Get(recordPartKey(recordID, i))
		if err != nil {
			return nil, fmt.Errorf("supervisor: record %s part %d: %w", recordID, i, err)
		}
		b = append(b, part...)
	}
	rec := &tetherv1.ReconciliationRecord{}
	if err := proto.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("supervisor: decode record %s: %w", recordID, err)
	}
	return rec, nil
}

// Record returns a record by its id or its termination's id.
func (s *Supervisor) Record(ctx context.Context, recordID, terminationID string) (*tetherv1.ReconciliationRecord, error) {
	switch {
	case recordID != "":
		if err := id.Check(id.Record, "record_id", recordID); err != nil {
			return nil, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
		}
	case terminationID != "":
		if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
			return nil, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
		}
	default:
		return nil, fmt.Errorf("%w: record_id or termination_id is required", tree.ErrInvalidArgument)
	}
	var rec *tetherv1.ReconciliationRecord
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		rid := recordID
		if rid == "" {
			v, err := tx.Get(recordByTermKey(terminationID))
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: termination_id %s has no record yet", ErrRecordNotFound, terminationID)
			}
			if err != nil {
				return err
			}
			rid = string(v)
		}
		var err error
		rec, err = getRecord(tx, rid)
		return err
	})
	return rec, err
}

// Records lists records in id order after pageToken.
func (s *Supervisor) Records(ctx context.Context, pageToken string, pageSize int) ([]*tetherv1.ReconciliationRecord, string, error) {
	var out []*tetherv1.ReconciliationRecord
	next := ""
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next = nil, ""
		var ids []string
		var start []byte
		if pageToken != "" {
			start = append(recordPartKey(pageToken, 1<<30), 0)
		}
		err := tx.Scan([]byte(prefixRecord), start, func(k, _ []byte) error {
			rest := string(k[len(prefixRecord):])
			if strings.Contains(rest, "/") {
				return nil
			}
			if len(ids) == pageSize {
				next = ids[len(ids)-1]
				return store.ErrStopScan
			}
			ids = append(ids, rest)
			return nil
		})
		if err != nil {
			return err
		}
		for _, rid := range ids {
			rec, err := getRecord(tx, rid)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, next, err
}

func modeToProto(m Mode) tetherv1.TerminationMode {
	if m == ModeAbort {
		return tetherv1.TerminationMode_TERMINATION_MODE_ABORT
	}
	return tetherv1.TerminationMode_TERMINATION_MODE_DRAIN
}
