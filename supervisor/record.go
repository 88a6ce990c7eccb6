package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

// RecordSchemaVersion is the version of the reconciliation record's schema
// (docs/record.schema.json). It changes only compatibly: fields are added,
// never renamed or re-typed.
const RecordSchemaVersion = 1

// recordPartBytes keeps each stored part of a record under the store's
// value limit; each chunk of a termination writes one part or a few
// (chunks.go), so a record spans as many parts as its subtree needs. A
// variable so tests can split entries across parts.
var recordPartBytes = 512 << 10

// newRecordID allocates a record's id (when its first part is written).
func newRecordID() string { return id.New(id.Record) }

// recordHeaderOf is the part of the record that describes the whole
// termination, written last (chunks.go writes the nodes, privileges,
// leases and calls before it, in parts).
func recordHeaderOf(tx store.ReadTxn, t Termination, recordID string, now time.Time) (*ReconciliationRecord, error) {
	rec := &ReconciliationRecord{
		RecordID:      recordID,
		TerminationID: t.ID,
		SchemaVersion: RecordSchemaVersion,
		NodeID:        t.NodeID,
		Mode:          recordedMode(t.Mode),
		RequestedBy:   t.RequestedBy,
		Reason:        t.Reason,
		Escalated:     t.Escalated,
		WrittenAt:     now,
		RootNodeIDs:   t.Roots,
		RolloutID:     t.RolloutID,
	}
	if t.ProposalID != "" {
		p := &StopProposal{}
		if err := getProposal(tx, t.ProposalID, p); err != nil && !errors.Is(err, ErrProposalNotFound) {
			return nil, err
		}
		rec.StopRule = p.Rule
	}
	for _, ph := range t.Phases {
		rec.Phases = append(rec.Phases, RecordPhase{Name: ph.Phase.String(), StartedAt: ph.StartedAt, Duration: ph.Duration})
	}
	return rec, nil
}

// grantPrivilege is a grant as the record lists it.
func grantPrivilege(g HeldGrant) RecordPrivilege {
	outcome := privilegeOutcome(g.Outcome)
	return RecordPrivilege{
		PrivilegeID: g.GrantID, Kind: "grant", ExternalID: g.GrantID, NodeID: g.NodeID, Outcome: outcome,
		DecidedAt: g.DecidedAt, ExpiresAt: g.ExpiresAt, RevokedBy: g.RevokedBy, RegisteredBy: g.Issuer,
	}
}

// privilegeOutcome is a privilege's outcome as the record states it:
// anything but revoked or expired is a failed revocation.
func privilegeOutcome(o string) PrivilegeOutcome {
	switch o {
	case privilege.OutcomeRevoked:
		return PrivilegeOutcomeRevoked
	case privilege.OutcomeExpired:
		return PrivilegeOutcomeExpired
	}
	return PrivilegeOutcomeRevokeFailed
}

// registeredPrivilege is a registered privilege as the record lists it.
func registeredPrivilege(p privilege.Privilege) RecordPrivilege {
	outcome := privilegeOutcome(p.Outcome)
	rp := RecordPrivilege{
		PrivilegeID: p.ID, Kind: p.Kind, ExternalID: p.ExternalID, NodeID: p.NodeID, Outcome: outcome, Error: p.Error,
		DecidedAt: p.DecidedAt, ExpiresAt: p.ExpiresAt, RegisteredBy: p.RegisteredBy,
	}
	switch {
	case outcome == PrivilegeOutcomeExpired:
		// It ended at its expiry, not when the termination looked.
		rp.DecidedAt = p.ExpiresAt
	case outcome == PrivilegeOutcomeRevoked && p.RevokeURL != "":
		rp.RevokedBy = "webhook"
	case outcome == PrivilegeOutcomeRevoked:
		rp.RevokedBy = "handler"
	}
	if rp.RegisteredBy == "" {
		// Registered before the registrant's principal was kept.
		rp.RegisteredBy = "agent"
		if p.ByOperator {
			rp.RegisteredBy = "operator"
		}
	}
	return rp
}

// closeUnacknowledged closes a call the termination accounts for that
// never ended (never acknowledged, or, after an escalation, never ended)
// in the ledger, so the record and the ledger agree. now is when the
// termination stopped waiting for the gate (StoppedWaitingAt). The
// ledger's Observer is told of the end (observe): the stop rules count a
// call open at its node's ancestors until it ends.
func closeUnacknowledged(tx store.Txn, terminationID string, c *ledger.ToolCall, now time.Time, observe *ledger.Ledger) error {
	if c.State == ledger.CallStateEnded {
		return nil
	}
	before := *c // (no slice or map: a copy is a deep copy)
	c.State = ledger.CallStateEnded
	c.Resolution = ledger.CallResolutionCancelUnacknowledged
	c.EndedAt = now
	c.EndedBy = "termination:" + terminationID
	if err := ledger.CloseOpenIn(tx, c); err != nil {
		return err
	}
	if err := tx.Delete(ledger.CancelKey(c.GateID, c.CallID)); err != nil {
		return err
	}
	if err := observe.ObserveIn(tx, &before, c); err != nil {
		return err
	}
	return ledger.PutCallIn(tx, c)
}

// CancelAckWindow is the ledger's AckWindow: a cancel acknowledgement
// counts only while the termination that ordered it still waits for it,
// before its acknowledgement deadline and while it is aborting, or while
// it is draining (a drain waits for every call it carries, those with a
// cancel order too: a node it took over aborting, Next). Past that the termination has gone on, or goes on at
// its next pass, to revoke, and its record closes the call
// cancel_unacknowledged (recordCalls): the error says so.
//
// It returns the acknowledgement deadline of a termination it saw aborting
// (set when it enters aborting, never changed after), which the ledger
// keeps to judge the next acknowledgements without this read: a
// termination leaves aborting before its deadline only once every cancel
// it ordered was acknowledged or ended.
func CancelAckWindow(tx store.ReadTxn, terminationID string, now time.Time) (time.Time, error) {
	var t Termination
	if err := getTermination(tx, terminationID, &t); err != nil {
		if errors.Is(err, ErrTerminationNotFound) {
			return time.Time{}, nil
		}
		return time.Time{}, err
	}
	switch {
	case t.Phase >= PhaseReconciling:
		// (No deadline kept: seen past aborting, every later
		// acknowledgement reads the termination, so none is judged on a
		// deadline alone.)
		return time.Time{}, fmt.Errorf("the termination stopped waiting for cancel acknowledgements and is %s; the record lists the call cancel_unacknowledged", t.Phase)
	case t.Phase == PhaseAborting && !t.CancelDeadline.IsZero() && !now.Before(t.CancelDeadline):
		return t.CancelDeadline, ledger.AckDeadlinePassed(t.CancelDeadline)
	}
	if t.Phase != PhaseAborting {
		return time.Time{}, nil
	}
	return t.CancelDeadline, nil
}

// recordCall is a call as the record lists it.
func recordCall(c *ledger.ToolCall) RecordToolCall {
	return RecordToolCall{
		CallID: c.CallID, NodeID: c.NodeID, Tool: c.Tool, GateID: c.GateID, Resolution: c.Resolution,
		BegunBy: c.BegunBy, EndedBy: c.EndedBy, AcknowledgedBy: c.AcknowledgedBy,
		BegunAt: c.BegunAt, EndedAt: c.EndedAt, CancelRequestedAt: c.CancelRequestedAt, AcknowledgedAt: c.CancelAckedAt,
		Error: c.Error,
	}
}

// recordNode is a node's entry: its exit weighed against the control
// plane's evidence (tree.JudgeExit), the claim and the contradictions shown.
// beside: the node's descendants and open call as read now
// (tree.JudgeExitBeside), read only for a node whose bare claim the
// control plane would corroborate.
func recordNode(n *tree.Node, inWorkload func(nodeID string) bool, liveGrants, heldGrants, heldJobs []string, beside tree.Beside) RecordNode {
	v := tree.JudgeExitBeside(n, inWorkload, liveGrants, beside)
	rn := RecordNode{
		NodeID: n.NodeID, Name: n.Name, ParentNodeID: n.ParentNodeID, LastSeenAt: n.LastSeenAt,
		ClaimedBy: v.ClaimedBy, ClaimedAt: v.ClaimedAt, Contradictions: n.Contradictions,
		SessionClosedAt: n.SessionClosedAt, SessionOpen: tree.SessionOpen(n),
	}
	if v.Confirmed {
		rn.Outcome = NodeOutcomeConfirmed
		rn.ConfirmedBy, rn.ConfirmedAt = v.ConfirmedBy, v.ConfirmedAt
		return rn
	}
	rn.Outcome = NodeOutcomeUnaccounted
	rn.UnaccountedReason = v.UnaccountedReason
	rn.HeldGrantIDs = heldGrants
	rn.HeldJobIDs = heldJobs
	return rn
}

// reweighPrior weighs again, against this termination's workload, the
// verdict an earlier record gave a node it terminated (rn, carried over
// from it): v is the node's exit judged now (tree.JudgeExit with this
// termination's workload). The earlier record judged the node against its
// own workload; an ancestor that vouched for the node from outside that
// one (a rogue that stopped its own child, then confirmed its exit while
// itself running) may be this termination's workload, and its word only
// a claim. A node the earlier record left unaccounted stays so; one it
// confirmed stays confirmed only if the evidence still confirms it, by
// whom it does now, and is otherwise unaccounted, the claim shown.
func reweighPrior(rn RecordNode, v tree.ExitVerdict) RecordNode {
	if rn.Outcome != NodeOutcomeConfirmed {
		return rn
	}
	rn.ClaimedBy, rn.ClaimedAt = v.ClaimedBy, v.ClaimedAt
	if v.Confirmed {
		rn.ConfirmedBy, rn.ConfirmedAt = v.ConfirmedBy, v.ConfirmedAt
		return rn
	}
	rn.Outcome = NodeOutcomeUnaccounted
	rn.ConfirmedBy, rn.ConfirmedAt = "", time.Time{}
	rn.UnaccountedReason = v.UnaccountedReason + " (weighed against this termination's workload; the earlier record " + rn.InnerRecordID + " said confirmed)"
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
// stopped or exited — under another termination, or by its own claim —
// or that a stop covers before its mark reaches it (tree.CoveringStopIn:
// requested on it or an ancestor, or marked down to an ancestor). Only
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
			n, err := tree.GetNodeIn(tx, nodeID)
			in = err != nil || n.State != tree.NodeStateRunning || tree.ExitConfirmed(n)
			if !in {
				cover, err := tree.CoveringStopIn(tx, n)
				in = err != nil || cover != nil
			}
			seen[nodeID] = in
		}
		return in
	}
}

// putRecordHeader makes a record written in parts visible: its header
// (the number of parts, then the number of the first part of the header,
// where the entries end: "parts head") and its termination's index.
func putRecordHeader(tx store.Txn, recordID, terminationID string, parts, head int) error {
	if err := tx.Put(recordKey(recordID), []byte(strconv.Itoa(parts)+" "+strconv.Itoa(head))); err != nil {
		return err
	}
	return tx.Put(recordByTermKey(terminationID), []byte(recordID))
}

func getRecord(tx store.ReadTxn, recordID string) (*ReconciliationRecord, error) {
	v, err := tx.Get(recordKey(recordID))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: record_id %s", ErrRecordNotFound, recordID)
	}
	if err != nil {
		return nil, err
	}
	parts, _, err := parseRecordHeader(recordID, v)
	if err != nil {
		return nil, err
	}
	var b []byte
	for i := range parts {
		part, err := tx.Get(recordPartKey(recordID, i))
		if err != nil {
			return nil, fmt.Errorf("supervisor: record %s part %d: %w", recordID, i, err)
		}
		b = append(b, part...)
	}
	rec := &ReconciliationRecord{}
	if err := decodeRecord(b, rec); err != nil {
		return nil, fmt.Errorf("supervisor: decode record %s: %w", recordID, err)
	}
	return rec, nil
}

// parseRecordHeader reads a record's header value: its number of parts
// and the first part of its header (where its entries end). A record
// written before the header's part was kept ("parts" alone) answers head
// = parts: its header is read with the whole record.
func parseRecordHeader(recordID string, v []byte) (parts, head int, err error) {
	f := strings.Fields(string(v))
	if len(f) == 0 || len(f) > 2 {
		return 0, 0, fmt.Errorf("supervisor: record %s header %q", recordID, v)
	}
	if parts, err = strconv.Atoi(f[0]); err != nil {
		return 0, 0, fmt.Errorf("supervisor: record %s header: %w", recordID, err)
	}
	head = parts
	if len(f) == 2 {
		if head, err = strconv.Atoi(f[1]); err != nil || head < 0 || head > parts {
			return 0, 0, fmt.Errorf("supervisor: record %s header %q", recordID, v)
		}
	}
	return parts, head, nil
}

// Record returns a record by its id or its termination's id.
func (s *Supervisor) Record(ctx context.Context, recordID, terminationID string) (*ReconciliationRecord, error) {
	if err := checkRecordRef(recordID, terminationID, true); err != nil {
		return nil, err
	}
	var rec *ReconciliationRecord
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		rid, err := recordIDIn(tx, recordID, terminationID)
		if err != nil {
			return err
		}
		rec, err = getRecord(tx, rid)
		return err
	})
	return rec, err
}

// checkRecordRef checks how a record is asked for: by its id or, without
// one, by its termination's id; neither is an error when required.
func checkRecordRef(recordID, terminationID string, required bool) error {
	switch {
	case recordID != "":
		if err := id.Check(id.Record, "record_id", recordID); err != nil {
			return fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
		}
	case terminationID != "":
		if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
			return fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
		}
	case required:
		return fmt.Errorf("%w: record_id or termination_id is required", tree.ErrInvalidArgument)
	}
	return nil
}

// recordIDIn is recordID, or, when it is empty, the id of the record
// terminationID wrote ("" when both are empty).
func recordIDIn(tx store.ReadTxn, recordID, terminationID string) (string, error) {
	if recordID != "" || terminationID == "" {
		return recordID, nil
	}
	v, err := tx.Get(recordByTermKey(terminationID))
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: termination_id %s has no record yet", ErrRecordNotFound, terminationID)
	}
	if err != nil {
		return "", err
	}
	return string(v), nil
}

// Records lists records in id order after pageToken, within
// RecordPageBytes: the page ends before a record that would pass it, and a
// record that alone passes it is listed with its header and first entries
// only (its id in partial), as GetRecord's first page.
func (s *Supervisor) Records(ctx context.Context, pageToken string, pageSize int) (out []*ReconciliationRecord, next string, partial []string, err error) {
	return s.RecordsOf(ctx, RecordFilter{}, pageToken, pageSize)
}

// RecordsOf is Records, of the records the filter passes only, read from
// the index of records by tree or by requester (recordIDsOf).
func (s *Supervisor) RecordsOf(ctx context.Context, f RecordFilter, pageToken string, pageSize int) (out []*ReconciliationRecord, next string, partial []string, err error) {
	err = s.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next, partial = nil, "", nil
		ids, more, err := recordIDsOf(tx, f, pageToken, pageSize)
		if err != nil {
			return err
		}
		next = more
		size := 0
		for i, rid := range ids {
			rec, more, err := recordPage(tx, rid, nil, MaxRecordPageSize, RecordPageBytes-size)
			if err != nil {
				return err
			}
			if more != "" && i > 0 {
				next = ids[i-1] // the next page starts with this record
				return nil
			}
			if more != "" {
				partial = append(partial, rid)
			}
			out = append(out, rec)
			n, err := recordSize(rec)
			if err != nil {
				return err
			}
			size += n
		}
		return nil
	})
	return out, next, partial, err
}

// recordedMode is a mode as a record or a proposal states it: an abort,
// or else a drain.
func recordedMode(m Mode) Mode {
	if m == ModeAbort {
		return ModeAbort
	}
	return ModeDrain
}
