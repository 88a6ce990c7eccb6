package supervisor

import (
	"time"

	"github.com/tetherhq/tether/internal/enumname"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The reconciliation record, as the termination writes it. Its stored form
// is the protobuf encoding of tether.v1.ReconciliationRecord (the pb tags
// are that message's field numbers, written by internal/storecodec), so a
// record written by any version reads back; controlplane/wire converts it
// to the message the API and the published JSON (docs/record.schema.json)
// carry.

// ReconciliationRecord is what a termination accounts for: every node of
// its subtree exactly once, every tool call, privilege and lease with its
// outcome, and the duration of each phase. Nodes, ToolCalls, Privileges
// and Leases are its entries (a page of the record carries a slice of
// them); every other field is its header.
type ReconciliationRecord struct {
	RecordID      string            `pb:"1"`
	TerminationID string            `pb:"2"`
	SchemaVersion uint32            `pb:"3"`
	NodeID        string            `pb:"4"`
	Mode          Mode              `pb:"5"`
	RequestedBy   string            `pb:"6"`
	Reason        string            `pb:"7"`
	Escalated     bool              `pb:"8"`
	Nodes         []RecordNode      `pb:"9"`
	ToolCalls     []RecordToolCall  `pb:"10"`
	Privileges    []RecordPrivilege `pb:"11"`
	Leases        []RecordLease     `pb:"12"`
	Phases        []RecordPhase     `pb:"13"`
	WrittenAt     time.Time         `pb:"14"`
	// Every subtree root when the termination had several (a rollout batch).
	RootNodeIDs []string `pb:"15"`
	// The rollout the termination was a batch of, if any.
	RolloutID string `pb:"16"`
	// The stop rule whose proposal started the termination, with the values
	// that made it true.
	StopRule *StopRuleFiring `pb:"17"`
}

// RecordNode is one node's entry: its exit weighed against the control
// plane's evidence (tree.JudgeExit), the claim and the contradictions shown.
type RecordNode struct {
	NodeID       string      `pb:"1"`
	Name         string      `pb:"2"`
	ParentNodeID string      `pb:"3"`
	Outcome      NodeOutcome `pb:"4"`
	// The party whose word counts as evidence.
	ConfirmedBy string    `pb:"5"`
	ConfirmedAt time.Time `pb:"6"`
	LastSeenAt  time.Time `pb:"7"`
	// What an unaccounted node still held when the record was written.
	HeldGrantIDs []string `pb:"8"`
	HeldJobIDs   []string `pb:"9"`
	// A claim: the node's own word, or an ancestor's inside the stopped
	// subtree. Shown, never counted as evidence by itself.
	ClaimedBy string    `pb:"10"`
	ClaimedAt time.Time `pb:"11"`
	// Activity the control plane saw after the confirmation.
	Contradictions []tree.Contradiction `pb:"12"`
	// The control plane's observation of the node's session.
	SessionClosedAt time.Time `pb:"13"`
	SessionOpen     bool      `pb:"14"`
	// Why the node is unaccounted, in words.
	UnaccountedReason string `pb:"15"`
	// Set when another termination had the node before this one reached it.
	InnerTerminationID string       `pb:"20"`
	InnerOutcome       InnerOutcome `pb:"21"`
	InnerRecordID      string       `pb:"22"`
	// Set with NodeOutcomeSuperseded: the termination that accounts for
	// the node instead of this one.
	SupersededByTerminationID string `pb:"23"`
	// How many of the node's calls this termination refused past the
	// ledger.MaxRefusedCallsListedPerNode it lists (rejected_draining).
	RefusedCallsNotListed uint64 `pb:"24"`
}

// RecordToolCall is a call the termination accounted for.
type RecordToolCall struct {
	CallID     string                `pb:"1"`
	NodeID     string                `pb:"2"`
	Tool       string                `pb:"3"`
	GateID     string                `pb:"4"`
	Resolution ledger.CallResolution `pb:"5"`
	// Who reported each step (see ledger.ToolCall).
	BegunBy        string `pb:"6"`
	EndedBy        string `pb:"7"`
	AcknowledgedBy string `pb:"8"`
	// When each step happened, on the control plane's clock (the
	// ledger's times): a post-mortem places each call against the
	// phases. EndedAt is the gate's report or the termination's close.
	BegunAt           time.Time `pb:"9"`
	EndedAt           time.Time `pb:"10"`
	CancelRequestedAt time.Time `pb:"11"`
	AcknowledgedAt    time.Time `pb:"12"`
	// Error is the gate's error of a failed call.
	Error string `pb:"13"`
}

// RecordPrivilege is a grant or a registered privilege and what its
// revocation came to.
type RecordPrivilege struct {
	PrivilegeID string `pb:"1"`
	// "grant", "file_lock", "queue_reservation", ...
	Kind       string           `pb:"2"`
	ExternalID string           `pb:"3"`
	NodeID     string           `pb:"4"`
	Outcome    PrivilegeOutcome `pb:"5"`
	Error      string           `pb:"6"`
	// DecidedAt is when it ended: revoked (the hook's answer, the grant's
	// tombstone), expired (its expiry), or when its revocation failed.
	DecidedAt time.Time `pb:"7"`
	// ExpiresAt is the expiry its registrant or issuer declared.
	ExpiresAt time.Time `pb:"8"`
	// RevokedBy: a grant's revoking principal, a registered privilege's
	// revoker ("webhook", "handler").
	RevokedBy string `pb:"9"`
	// RegisteredBy: the registrant's principal, or a grant's issuer.
	RegisteredBy string `pb:"10"`
}

// RecordLease is a job lease a member held and how it ended.
type RecordLease struct {
	JobID           string       `pb:"1"`
	LeaseID         string       `pb:"2"`
	LeaseGeneration uint64       `pb:"3"`
	HolderIdentity  string       `pb:"4"`
	Outcome         LeaseOutcome `pb:"5"`
	// TerminalResult is the job's result as its lease states it when the
	// record is written (unspecified for a lease handed over).
	TerminalResult LeaseResult `pb:"6"`
	// EndedBy is on whose word the job's end rests, read from the lease's
	// evidence (the message that gave it its terminal result).
	EndedBy LeaseEndedBy `pb:"7"`
	// EndedByNodeID is the agent whose message ended the job (the holder,
	// or a coordinating agent), empty otherwise.
	EndedByNodeID string `pb:"8"`
	// EndedAt is when the ending message was judged (the lease machine's
	// clock, the control plane's).
	EndedAt time.Time `pb:"9"`
	// ClaimedUnderStop: the holder's word decided the job's end at or
	// after the termination was requested — the stopping holder's claim,
	// not confirmed: its report ended the job, or the termination ended
	// it CANCELLED on the holder's acknowledgement of the cancel request.
	ClaimedUnderStop bool `pb:"10"`

	// CancelAckedAt is when the holder acknowledged the cancel request
	// (the lease machine's clock), zero when it did not: what the
	// termination's CANCELLED rests on. Not stored nor shown; the record
	// shows it as ClaimedUnderStop.
	CancelAckedAt time.Time
	// CancelRequestedBy is the principal that asked for the cancel the
	// holder acknowledged before the termination's request ("agent:n_…"),
	// empty when unknown or not read. Not stored nor shown: an agent of
	// the stopped subtree makes the acknowledgement ClaimedUnderStop.
	CancelRequestedBy string
}

// RecordPhase is one phase of the termination and how long it took.
type RecordPhase struct {
	Name      string        `pb:"1"`
	StartedAt time.Time     `pb:"2"`
	Duration  time.Duration `pb:"3"`
}

// NodeOutcome is what the record concludes about a node; the values are
// tether.v1's.
type NodeOutcome int32

// Node outcomes.
const (
	NodeOutcomeUnspecified NodeOutcome = 0
	NodeOutcomeConfirmed   NodeOutcome = 1
	NodeOutcomeUnaccounted NodeOutcome = 2
	// Another termination accounts for the node.
	NodeOutcomeSuperseded NodeOutcome = 10
)

var nodeOutcomeNames = [...]string{
	NodeOutcomeUnspecified: "NODE_OUTCOME_UNSPECIFIED",
	NodeOutcomeConfirmed:   "NODE_OUTCOME_CONFIRMED",
	NodeOutcomeUnaccounted: "NODE_OUTCOME_UNACCOUNTED",
	NodeOutcomeSuperseded:  "NODE_OUTCOME_SUPERSEDED",
}

// String is the outcome's tether.v1 name ("NODE_OUTCOME_CONFIRMED").
func (o NodeOutcome) String() string { return enumname.Of(nodeOutcomeNames[:], o, "") }

// InnerOutcome is how another termination stood with a node when this one
// reached it; the values are tether.v1's.
type InnerOutcome int32

// Inner outcomes.
const (
	InnerOutcomeUnspecified       InnerOutcome = 0
	InnerOutcomeTakenOverDraining InnerOutcome = 1
	InnerOutcomeTakenOverAborting InnerOutcome = 2
	InnerOutcomeTerminated        InnerOutcome = 3
)

var innerOutcomeNames = [...]string{
	InnerOutcomeUnspecified:       "INNER_OUTCOME_UNSPECIFIED",
	InnerOutcomeTakenOverDraining: "INNER_OUTCOME_TAKEN_OVER_DRAINING",
	InnerOutcomeTakenOverAborting: "INNER_OUTCOME_TAKEN_OVER_ABORTING",
	InnerOutcomeTerminated:        "INNER_OUTCOME_TERMINATED",
}

// String is the outcome's tether.v1 name ("INNER_OUTCOME_TERMINATED").
func (o InnerOutcome) String() string { return enumname.Of(innerOutcomeNames[:], o, "") }

// PrivilegeOutcome is what a privilege's revocation came to; the values
// are tether.v1's.
type PrivilegeOutcome int32

// Privilege outcomes.
const (
	PrivilegeOutcomeUnspecified  PrivilegeOutcome = 0
	PrivilegeOutcomeRevoked      PrivilegeOutcome = 1
	PrivilegeOutcomeExpired      PrivilegeOutcome = 2
	PrivilegeOutcomeRevokeFailed PrivilegeOutcome = 3
)

var privilegeOutcomeNames = [...]string{
	PrivilegeOutcomeUnspecified:  "PRIVILEGE_OUTCOME_UNSPECIFIED",
	PrivilegeOutcomeRevoked:      "PRIVILEGE_OUTCOME_REVOKED",
	PrivilegeOutcomeExpired:      "PRIVILEGE_OUTCOME_EXPIRED",
	PrivilegeOutcomeRevokeFailed: "PRIVILEGE_OUTCOME_REVOKE_FAILED",
}

// String is the outcome's tether.v1 name ("PRIVILEGE_OUTCOME_REVOKED").
func (o PrivilegeOutcome) String() string { return enumname.Of(privilegeOutcomeNames[:], o, "") }

// LeaseOutcome is how a job lease ended for the record; the values are
// tether.v1's.
type LeaseOutcome int32

// Lease outcomes.
const (
	LeaseOutcomeUnspecified LeaseOutcome = 0
	LeaseOutcomeCancelled   LeaseOutcome = 1
	LeaseOutcomeExpired     LeaseOutcome = 2
	LeaseOutcomeUnresolved  LeaseOutcome = 3
	LeaseOutcomeCompleted   LeaseOutcome = 4
	// Left open for a rollout to reassign (generation + 1) to a replacement.
	LeaseOutcomeHandedOver LeaseOutcome = 5
)

var leaseOutcomeNames = [...]string{
	LeaseOutcomeUnspecified: "LEASE_OUTCOME_UNSPECIFIED",
	LeaseOutcomeCancelled:   "LEASE_OUTCOME_CANCELLED",
	LeaseOutcomeExpired:     "LEASE_OUTCOME_EXPIRED",
	LeaseOutcomeUnresolved:  "LEASE_OUTCOME_UNRESOLVED",
	LeaseOutcomeCompleted:   "LEASE_OUTCOME_COMPLETED",
	LeaseOutcomeHandedOver:  "LEASE_OUTCOME_HANDED_OVER",
}

// String is the outcome's tether.v1 name ("LEASE_OUTCOME_CANCELLED").
func (o LeaseOutcome) String() string { return enumname.Of(leaseOutcomeNames[:], o, "") }

// LeaseEndedBy is on whose word a lease's end rests in the record; the
// values are tether.v1's.
type LeaseEndedBy int32

// Whose word ended a lease.
const (
	LeaseEndedByUnspecified LeaseEndedBy = 0
	// The holder reported the result (Complete).
	LeaseEndedByHolderReport LeaseEndedBy = 1
	// The job's coordinator (an operator or a coordinating agent)
	// resolved it.
	LeaseEndedByCoordinatorResolution LeaseEndedBy = 2
	// The termination reconciled it.
	LeaseEndedByTermination LeaseEndedBy = 3
	// An UNRESOLVED result's bound elapsed (the lease's own deadline).
	LeaseEndedByLeaseDeadline LeaseEndedBy = 4
)

var leaseEndedByNames = [...]string{
	LeaseEndedByUnspecified:           "LEASE_ENDED_BY_UNSPECIFIED",
	LeaseEndedByHolderReport:          "LEASE_ENDED_BY_HOLDER_REPORT",
	LeaseEndedByCoordinatorResolution: "LEASE_ENDED_BY_COORDINATOR_RESOLUTION",
	LeaseEndedByTermination:           "LEASE_ENDED_BY_TERMINATION",
	LeaseEndedByLeaseDeadline:         "LEASE_ENDED_BY_LEASE_DEADLINE",
}

// String is the value's tether.v1 name ("LEASE_ENDED_BY_HOLDER_REPORT").
func (e LeaseEndedBy) String() string { return enumname.Of(leaseEndedByNames[:], e, "") }

// LeaseResult is a job's terminal result as the record states it; the
// values are tether.v1's TerminalResult.
type LeaseResult int32

// Lease results.
const (
	LeaseResultUnspecified LeaseResult = 0
	LeaseResultSuccess     LeaseResult = 1
	LeaseResultFailed      LeaseResult = 2
	LeaseResultCancelled   LeaseResult = 3
	LeaseResultUnresolved  LeaseResult = 4
)

var leaseResultNames = [...]string{
	LeaseResultUnspecified: "TERMINAL_RESULT_UNSPECIFIED",
	LeaseResultSuccess:     "TERMINAL_RESULT_SUCCESS",
	LeaseResultFailed:      "TERMINAL_RESULT_FAILED",
	LeaseResultCancelled:   "TERMINAL_RESULT_CANCELLED",
	LeaseResultUnresolved:  "TERMINAL_RESULT_UNRESOLVED",
}

// String is the result's tether.v1 name ("TERMINAL_RESULT_FAILED").
func (r LeaseResult) String() string { return enumname.Of(leaseResultNames[:], r, "") }
