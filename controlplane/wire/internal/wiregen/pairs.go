package main

import (
	"reflect"

	"github.com/tetherhq/tether/capability"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// pairs is every domain type the RPC edge converts field by field, with
// the tether.v1 message it converts to and from. The order is the order
// of the generated file.
var pairs = []pair{
	// The agent tree (node.go holds nothing by hand).
	{domain: reflect.TypeFor[tree.Node](), msg: reflect.TypeFor[tetherv1.Node](), to: "Node", list: "Nodes",
		handDomain: map[string]string{
			"Holds":            "the store's own bookkeeping (what the node may hold, for terminations), never shown",
			"LastSeenSeq":      "the store's own bookkeeping (the order of the node's observations, for its exit), never shown",
			"SessionClosedSeq": "the store's own bookkeeping (the order of the node's observations, for its exit), never shown",
			"BelowAfterClaim":  "the store's own bookkeeping (a never-sessioned descendant served after the node's claimed exit, for its exit), never shown",
			"StopSince":        "the store's own bookkeeping (when the node first came under a stop, for the record's claims under stop), never shown",
		},
		doc: "is an agent-tree node as the API shows it"},
	{domain: reflect.TypeFor[tree.ExitConfirmation](), msg: reflect.TypeFor[tetherv1.ExitConfirmation](), to: "exitConfirmation", value: true,
		doc: "is one confirmation of a node's exit as the API shows it"},
	{domain: reflect.TypeFor[tree.Contradiction](), msg: reflect.TypeFor[tetherv1.Contradiction](), to: "Contradiction", value: true,
		doc: "is one piece of activity after a node's confirmed exit as the API (and the record) shows it"},
	{domain: reflect.TypeFor[tree.OpenSession](), msg: reflect.TypeFor[tetherv1.OpenSession](), to: "openSession", value: true,
		doc: "is one open session of a node as the API shows it"},
	{domain: reflect.TypeFor[tree.SessionSignal](), msg: reflect.TypeFor[tetherv1.SessionSignal](), to: "SessionSignal",
		doc: "is a drain or abort signal as a session receives it"},

	// The ledger.
	{domain: reflect.TypeFor[ledger.ToolCall](), msg: reflect.TypeFor[tetherv1.ToolCall](), to: "ToolCall", list: "ToolCalls",
		doc: "is a ledger call as the API shows it"},

	// Stop proposals and the stop rule firings they and records carry.
	{domain: reflect.TypeFor[supervisor.StopProposal](), msg: reflect.TypeFor[tetherv1.StopProposal](), to: "Proposal", list: "Proposals",
		always: []string{"DrainWindow"},
		doc:    "is a stop proposal as the API carries it; it always states its drain window, \"0s\" included"},
	{domain: reflect.TypeFor[supervisor.StopRuleFiring](), msg: reflect.TypeFor[tetherv1.StopRuleFiring](), to: "StopRuleFiring",
		doc: "is a stop rule's firing as a proposal and a record carry it"},
	{domain: reflect.TypeFor[supervisor.StopRuleValue](), msg: reflect.TypeFor[tetherv1.StopRuleValue](), to: "stopRuleValue", value: true, list: "StopRuleValues",
		doc: "is one value a stop rule read, as the API carries it"},

	// The reconciliation record and its entries.
	{domain: reflect.TypeFor[supervisor.ReconciliationRecord](), msg: reflect.TypeFor[tetherv1.ReconciliationRecord](), to: "Record", list: "Records",
		doc: "is a reconciliation record as the API carries it (GetRecord, ListRecords) and as it is published (RecordJSON)"},
	{domain: reflect.TypeFor[supervisor.RecordNode](), msg: reflect.TypeFor[tetherv1.RecordNode](), to: "RecordNode",
		doc: "is a record's node entry as the API carries it"},
	{domain: reflect.TypeFor[supervisor.RecordToolCall](), msg: reflect.TypeFor[tetherv1.RecordToolCall](), to: "RecordToolCall",
		doc: "is a record's tool call entry as the API carries it"},
	{domain: reflect.TypeFor[supervisor.RecordPrivilege](), msg: reflect.TypeFor[tetherv1.RecordPrivilege](), to: "RecordPrivilege",
		doc: "is a record's privilege entry as the API carries it"},
	{domain: reflect.TypeFor[supervisor.RecordLease](), msg: reflect.TypeFor[tetherv1.RecordLease](), to: "RecordLease",
		handDomain: map[string]string{
			"CancelAckedAt":     "what the record's claimed_under_stop is judged from (the holder's acknowledgement), never stored nor shown",
			"CancelRequestedBy": "who asked for the cancel acknowledged before the stop, from which claimed_under_stop is judged, never stored nor shown",
		},
		doc: "is a record's lease entry as the API carries it"},
	{domain: reflect.TypeFor[supervisor.RecordPhase](), msg: reflect.TypeFor[tetherv1.RecordPhase](), to: "recordPhase", value: true,
		always: []string{"Duration"},
		doc:    "is a record's phase as the API carries it: it always states its duration, \"0s\" included"},

	// Stop rules and what they read.
	{domain: reflect.TypeFor[stoprule.Rule](), msg: reflect.TypeFor[tetherv1.StopRule](), to: "StopRule", from: "StopRuleFromProto", list: "StopRules",
		doc: "is a stop rule as the API carries it"},
	{domain: reflect.TypeFor[stoprule.Observations](), msg: reflect.TypeFor[tetherv1.StopRuleObservations](), to: "StopRuleObservations", from: "StopRuleObservationsFromProto",
		doc: "is what a stop rule reads of a node (TestStopRule's observed)"},

	// The capability layer.
	{domain: reflect.TypeFor[capability.Grant](), msg: reflect.TypeFor[tetherv1.Grant](), to: "Grant", from: "GrantFromProto", value: true,
		doc: "is a grant as tether.v1 shows it"},
	{domain: reflect.TypeFor[capability.Tombstone](), msg: reflect.TypeFor[tetherv1.Tombstone](), to: "Tombstone", value: true,
		doc: "is a tombstone as the revocation feed sends it"},

	// Job leases (lease.go wraps the ones with a rule of their own). The
	// lease package's types carry no pb tags: their fields match the
	// message's by name, or through names.
	{domain: reflect.TypeFor[lease.Lease](), msg: reflect.TypeFor[tetherv1.Lease](), to: "leaseProto", value: true,
		names: map[string]string{"Generation": "LeaseGeneration", "Transitions": "LeaseTransitions"},
		handDomain: map[string]string{
			"Owner":         "the coordinator's own bookkeeping (who may coordinate the job), not shown",
			"FormerHolders": "the coordinator's own bookkeeping (whose late traffic is evidence), not shown",
		},
		doc: "is every field of a lease as tether.v1 shows it; Lease adds that a job without one has none"},
	{domain: reflect.TypeFor[lease.Decision](), msg: reflect.TypeFor[tetherv1.Decision](), to: "Decision", from: "decisionFromProto", value: true,
		names: map[string]string{"Event": "AuditEvent"},
		doc:   "is a lease decision as tether.v1 shows it"},
	{domain: reflect.TypeFor[coordinator.Row](), msg: reflect.TypeFor[tetherv1.EvidenceRow](), to: "evidenceRowProto", value: true,
		names: map[string]string{"Number": "Row"},
		handDomain: map[string]string{
			"Message": "a lease.Kind, sent by its name (EvidenceRow)",
			"Names":   "whom the row's reason may name, which the handler uses to show a reader only its own tree's part, not shown",
		},
		handMsg: map[string]string{"Message": "the name of the judged message's kind (EvidenceRow)"},
		doc:     "is an evidence row as tether.v1 shows it, but for its message kind"},
	{domain: reflect.TypeFor[coordinator.StaleCount](), msg: reflect.TypeFor[tetherv1.StaleCount](), to: "StaleCount", value: true, list: "StaleCounts",
		names: map[string]string{"Holder": "HolderIdentity"},
		doc:   "is a former holder's count of late messages about a job as tether.v1 shows it"},
	{domain: reflect.TypeFor[lease.EvidenceRow](), msg: reflect.TypeFor[tetherv1.EvidenceRow](), from: "evidenceRowFromProto", value: true,
		handDomain: map[string]string{"Message": "read back from its name (EvidenceRowFromProto)"},
		handMsg: map[string]string{
			"Message": "the name of the judged message's kind (EvidenceRowFromProto)",
			"Row":     "the row's number in the job's evidence, which a lease.EvidenceRow does not hold",
		},
		doc: "reads an evidence row message as the lease package holds it, but for its message kind"},
	{domain: reflect.TypeFor[lease.Policy](), msg: reflect.TypeFor[tetherv1.LeasePolicy](), to: "leasePolicyProto", value: true,
		always: []string{"SkewAllowance", "DefaultLeaseDuration", "MaxLeaseDuration", "DefaultAckTimeout", "MaxUnresolvedBound"},
		handDomain: map[string]string{
			"AckMiss":       "published as a sentence (LeasePolicy's AckMissPolicy)",
			"Restart":       "published as a sentence (LeasePolicy's RestartBehavior)",
			"RestartGrace":  "part of the restart sentence",
			"RestartSpread": "part of the restart sentence",
		},
		handMsg: map[string]string{
			"RestartBehavior": "a sentence the policy writes (LeasePolicy)",
			"AckMissPolicy":   "a sentence the policy writes (LeasePolicy)",
		},
		doc: "is the declared time policy's durations and clock; LeasePolicy adds its sentences"},
}
