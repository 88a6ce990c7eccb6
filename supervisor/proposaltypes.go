package supervisor

import (
	"time"

	"github.com/tetherhq/tether/internal/enumname"
)

// StopProposal is a request that a node be stopped: by the agent itself,
// or filed by a stop rule that became true for it. Only a decision (an
// operator's, or the policy's) starts a termination. Its stored form is the
// protobuf encoding of tether.v1.StopProposal (the pb tags are that
// message's field numbers), so a proposal written by any version reads
// back; controlplane/wire converts it to the message the API carries.
type StopProposal struct {
	ProposalID    string        `pb:"1"`
	NodeID        string        `pb:"2"`
	Condition     string        `pb:"3"`
	Reason        string        `pb:"4"`
	State         ProposalState `pb:"5"`
	ProposedBy    string        `pb:"6"`
	DecidedBy     string        `pb:"7"`
	TerminationID string        `pb:"8"`
	CreatedAt     time.Time     `pb:"9"`
	DecidedAt     time.Time     `pb:"10"`
	Mode          Mode          `pb:"11"`
	DrainWindow   time.Duration `pb:"12"`
	// The stop rule that filed the proposal, and the values that made it
	// true (nil for a proposal an agent made itself).
	Rule *StopRuleFiring `pb:"13"`
}

// ProposalState is where a stop proposal stands; the values are
// tether.v1's.
type ProposalState int32

// Proposal states.
const (
	ProposalStateUnspecified ProposalState = 0
	ProposalStatePending     ProposalState = 1
	ProposalStateApproved    ProposalState = 2
	ProposalStateRejected    ProposalState = 3
)

var proposalStateNames = [...]string{
	ProposalStateUnspecified: "PROPOSAL_STATE_UNSPECIFIED",
	ProposalStatePending:     "PROPOSAL_STATE_PENDING",
	ProposalStateApproved:    "PROPOSAL_STATE_APPROVED",
	ProposalStateRejected:    "PROPOSAL_STATE_REJECTED",
}

// String is the state's tether.v1 name ("PROPOSAL_STATE_PENDING").
func (s ProposalState) String() string { return enumname.Of(proposalStateNames[:], s, "") }

// StopRuleFiring is a stop rule that became true for a node: carried by
// the stop proposal it filed and by the record of the resulting
// termination. Package supervisor/stoprule builds it.
type StopRuleFiring struct {
	RuleID     string            `pb:"1"`
	Name       string            `pb:"2"`
	Expression string            `pb:"3"`
	SetBy      string            `pb:"4"`
	Severity   string            `pb:"5"`
	Labels     map[string]string `pb:"6"`
	// Where the rule is attached (empty for a selector rule).
	RuleNodeID string `pb:"7"`
	// The node whose observations made the rule true.
	NodeID string          `pb:"8"`
	Values []StopRuleValue `pb:"9"`
	// At least one value the rule read was self-reported.
	SelfReported bool      `pb:"10"`
	FiredAt      time.Time `pb:"11"`
	Action       string    `pb:"12"`
}

// StopRuleValue is one value a stop rule read when it fired.
type StopRuleValue struct {
	// e.g. observed.calls_by_tool["shell"] or self_reported.cost_usd.
	Name  string `pb:"1"`
	Value string `pb:"2"`
	// The value came from the agent's own report, not the control plane's
	// observation.
	SelfReported bool `pb:"3"`
}
