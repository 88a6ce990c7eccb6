package stoprule

import (
	"maps"
	"time"
)

// The package's own types. Their stored form is the protobuf encoding of
// the tether.v1 messages of the same name (StopRule, StopRuleObservations,
// ReportCountersResponse): the pb tags are those messages' field numbers,
// written by internal/storecodec, so what any version stored reads back.
// controlplane/wire converts them to the messages the API carries.

// Rule is a stop rule: a named condition, in CEL, on a subtree or a label
// selector.
type Rule struct {
	RuleID string `pb:"1"`
	Name   string `pb:"2"`
	// A CEL expression of type bool over `observed` (Observations) and
	// `self_reported` (map of string to double).
	Expression string `pb:"3"`
	// A hint from the setter: ActionPropose (the default; a person
	// decides), ActionDrain or ActionAbort (the mode the proposal
	// suggests). The operator's policy decides; the hint never does.
	Action string `pb:"4"`
	// Who set the rule (principal id: agent:<node id> or operator:<name>).
	SetBy string `pb:"5"`
	// The subtree the rule is attached to (empty for a selector rule).
	NodeID string `pb:"6"`
	// Operators only: the rule applies to every node carrying these labels.
	Selector map[string]string `pb:"7"`
	// Free-form severity ("info", "warning", "critical", ...) that the
	// proposal policy can match.
	Severity string `pb:"8"`
	// Labels of the rule that the proposal policy can match.
	Labels      map[string]string `pb:"9"`
	CreatedAt   time.Time         `pb:"10"`
	Description string            `pb:"11"`
	// In List answers: the rule is not attached to the node asked about
	// but inherited (from an ancestor or a selector).
	Inherited bool `pb:"12"`
}

// Observations is what the control plane observed about one node itself:
// the variable `observed` of every rule, in CEL the type
// tether.v1.StopRuleObservations with these fields under their proto names
// (cel.go). Nothing here comes from the agent's own word.
type Observations struct {
	// Tool calls begun by the node (refused calls excluded).
	Calls       int64            `pb:"1"`
	CallsByTool map[string]int64 `pb:"2"`
	// Ended calls by outcome: completed, failed, cancelled_acked,
	// rejected_draining (calls refused while the node was stopping).
	CallsByOutcome map[string]int64 `pb:"3"`
	// Calls that ended failed, in total and by tool.
	Failures       int64            `pb:"4"`
	FailuresByTool map[string]int64 `pb:"5"`
	// Calls begun and not ended.
	CallsInFlight int64 `pb:"6"`
	// Durations of ended calls, in seconds.
	CallSecondsTotal float64 `pb:"7"`
	CallSecondsMax   float64 `pb:"8"`
	// Children the node spawned.
	Spawns int64 `pb:"9"`
	// Nodes ever registered in the node's subtree (itself included,
	// stopped ones too), and how many levels below it the subtree reaches.
	SubtreeSize  int64 `pb:"10"`
	SubtreeDepth int64 `pb:"11"`
	// The node's own depth (a root is 0).
	Depth int64 `pb:"12"`
	// Seconds since the node was registered, on the control plane's clock.
	AgeSeconds float64 `pb:"13"`
	// Job leases held by the node, and its leases by state (offered,
	// active, expired, terminal).
	LeasesHeld    int64            `pb:"14"`
	LeasesByState map[string]int64 `pb:"15"`
	// Grants held by the node that were revoked.
	Revocations int64             `pb:"16"`
	NodeName    string            `pb:"17"`
	NodeLabels  map[string]string `pb:"18"`
	// The most calls the node ever had in flight at once: a level's
	// high-water mark, so a burst begun and ended between two
	// evaluations is seen at its peak.
	CallsInFlightMax int64 `pb:"19"`
	// Tool calls begun by the node and every descendant it ever had
	// (refused calls excluded), and those that ended failed: what the
	// subtree did however its calls are split among its children. Not
	// stored in the node's own counters: each call counts itself into
	// its ancestors' subtree records (prefixSub) in its own transaction,
	// and readers add the node's own calls and those records up.
	SubtreeCalls    int64 `pb:"20"`
	SubtreeFailures int64 `pb:"21"`
	// SubtreeCalls and SubtreeFailures by tool, kept in the same records
	// (each tracking at most MaxTools tools and counting further ones
	// under OtherTool). Where a record counted a tool under OtherTool,
	// OtherTool holds the records' others added up, and a lookup of a tool
	// the map does not hold reads it (subtreeToolCounts).
	SubtreeCallsByTool    map[string]int64 `pb:"22"`
	SubtreeFailuresByTool map[string]int64 `pb:"23"`
	// CallsByOutcome, CallSecondsTotal and CallSecondsMax over the node
	// and every descendant it ever had, kept in the same records as
	// SubtreeCalls (each ended call adds its outcome and duration to its
	// ancestors' records in its own transaction): how the subtree's calls
	// ended and how long they took, however they are split among its
	// descendants.
	SubtreeCallsByOutcome   map[string]int64 `pb:"24"`
	SubtreeCallSecondsTotal float64          `pb:"25"`
	SubtreeCallSecondsMax   float64          `pb:"26"`
	// CallsInFlight over the node and every descendant: the calls begun
	// and not ended, however they are split among its children. Not
	// stored in the node's own counters: readers add the node's own
	// CallsInFlight and the open calls its ancestor records count (each
	// call's begin and end, a termination's closing it too, count it in
	// and out of them in its own transaction), at no read more.
	SubtreeCallsInFlight int64 `pb:"27"`
	// The most calls SubtreeCallsInFlight was seen at: its high-water
	// mark. Never stored (a reader sets it to the level); the evaluator
	// raises it to the peak it counted from each change of the subtree's
	// totals, in commit order, since it started (subtreePeak).
	SubtreeCallsInFlightMax int64 `pb:"28"`

	// open is what the calls still open amounted to when the node was
	// read (never stored: readNodeTools and readOwnOpenCalls set it), for
	// Snapshot to count at the instant the node is judged.
	open openCalls
}

// Clone returns a copy of o sharing nothing with it.
func (o *Observations) Clone() *Observations {
	c := *o
	c.CallsByTool = maps.Clone(o.CallsByTool)
	c.CallsByOutcome = maps.Clone(o.CallsByOutcome)
	c.FailuresByTool = maps.Clone(o.FailuresByTool)
	c.SubtreeCallsByTool = maps.Clone(o.SubtreeCallsByTool)
	c.SubtreeFailuresByTool = maps.Clone(o.SubtreeFailuresByTool)
	c.SubtreeCallsByOutcome = maps.Clone(o.SubtreeCallsByOutcome)
	c.LeasesByState = maps.Clone(o.LeasesByState)
	c.NodeLabels = maps.Clone(o.NodeLabels)
	return &c
}

// reported is a node's stored self-reported counters (stored as
// tether.v1.ReportCountersResponse).
type reported struct {
	Counters map[string]float64 `pb:"1"`
}

// clone returns a copy of r sharing nothing with it.
func (r *Rule) clone() *Rule {
	c := *r
	c.Selector = maps.Clone(r.Selector)
	c.Labels = maps.Clone(r.Labels)
	return &c
}
