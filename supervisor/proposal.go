package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Proposal errors.
var (
	ErrProposalNotFound = fault.New(fault.NotFound, "supervisor: proposal not found")
	ErrProposalDecided  = fault.New(fault.Precondition, "supervisor: proposal already decided")
)

// MaxPendingProposals bounds the stop proposals of one node waiting for a
// decision: an agent that proposes in a loop cannot bury the operators'
// list (each further one is refused until one is decided).
const MaxPendingProposals = 8

// MaxPendingProposalsPerTree bounds the agents' stop proposals of one tree
// (a root and every descendant) waiting for a decision: a rogue that
// spawns children and has each file its few cannot bury the operators'
// list either. The proposals of the rules agents set count too (they carry
// an agent's authority; a rogue that removes its rules and sets them again
// would file without end); an operator's rule's proposal is not counted
// (it carries the operator's authority, and a rogue must not crowd it
// out).
const MaxPendingProposalsPerTree = 128

// ErrTreeProposalsFull refuses to file the proposal of an agent's stop
// rule while its tree's agents have MaxPendingProposalsPerTree pending:
// the rule files once there is room.
var ErrTreeProposalsFull = fault.New(fault.Exhausted, "supervisor: the tree's stop proposals are at their bound")

// countedInTree reports whether p holds a place in its tree's bound: an
// agent's own proposal, or one of a rule an agent set.
func countedInTree(p *StopProposal) bool {
	return p.Rule == nil || strings.HasPrefix(p.Rule.SetBy, "agent:")
}

// pendingInTree counts the tree's pending proposals that hold a place in
// its bound, up to the bound.
func pendingInTree(tx store.ReadTxn, root string) (int, error) {
	inTree := 0
	err := tx.Scan(pendingTreePrefix(root), nil, func(_, _ []byte) error {
		inTree++
		if inTree >= MaxPendingProposalsPerTree {
			return store.ErrStopScan
		}
		return nil
	})
	return inTree, err
}

// closeStopped closes, inside tx, the pending proposals holding a place in
// root's tree bound whose node is terminated: each asked to stop a node
// that is stopped, and would otherwise hold its place until an operator
// rejected it (approving it fails), so that a rogue that filled its tree's
// bound and was then stopped kept its tree's other agents from proposing.
// Each is rejected, decided by "termination:<id>", the termination that
// stopped its node. Called only at the bound (it reads every proposal of
// the tree's bound and its node); it returns how many it closed.
func closeStopped(tx store.Txn, root string, now time.Time) (int, error) {
	prefix := pendingTreePrefix(root)
	var ids []string
	if err := tx.Scan(prefix, nil, func(k, _ []byte) error {
		ids = append(ids, string(k[len(prefix):]))
		return nil
	}); err != nil {
		return 0, err
	}
	closed := 0
	for _, pid := range ids {
		p := &StopProposal{}
		if err := getProposal(tx, pid, p); err != nil {
			if errors.Is(err, ErrProposalNotFound) {
				continue
			}
			return closed, err
		}
		if p.State != ProposalStatePending {
			continue
		}
		n, err := tree.GetNodeIn(tx, p.NodeID)
		switch {
		case errors.Is(err, tree.ErrNodeNotFound):
			continue
		case err != nil:
			return closed, err
		case n.State != tree.NodeStateTerminated:
			continue
		}
		p.State, p.DecidedBy, p.DecidedAt = ProposalStateRejected, "termination:"+n.TerminationID, now
		if err := tx.Delete(pendingPropKey(p.NodeID, pid)); err != nil {
			return closed, err
		}
		if err := tx.Delete(pendingTreeKey(root, pid)); err != nil {
			return closed, err
		}
		if err := putProposal(tx, p); err != nil {
			return closed, err
		}
		closed++
	}
	return closed, nil
}

// pendingInTreeClosing is pendingInTree, having closed the proposals of
// terminated nodes (closeStopped) when the count reaches the bound.
func pendingInTreeClosing(tx store.Txn, root string, now time.Time) (int, error) {
	inTree, err := pendingInTree(tx, root)
	if err != nil || inTree < MaxPendingProposalsPerTree {
		return inTree, err
	}
	closed, err := closeStopped(tx, root, now)
	if err != nil || closed == 0 {
		return inTree, err
	}
	return pendingInTree(tx, root)
}

// PolicyDecider prefixes the decider of a proposal the control plane's
// policy approved on its own (no operator weighed it).
const PolicyDecider = "policy:"

// ProposalPolicy decides which stop proposals the control plane approves on
// its own. The agent proposes; the control plane decides, always against
// what it observes (the ledger, the clock), never the agent's claims.
type ProposalPolicy struct {
	// AutoApprove approves a proposal whose node carries every label of
	// the selector and whose condition holds. Empty: operators decide.
	AutoApprove map[string]string
	// RuleActions start a termination at once for proposals filed by stop
	// rules that match (the first match wins); a proposal no action
	// matches waits for an operator.
	RuleActions []RuleAction
}

// RuleAction is the policy for the proposals of matching stop rules: a
// rule matches when it carries every label of Labels and, when Severity
// is set, has that severity. Mode is how the termination stops the node.
type RuleAction struct {
	Labels   map[string]string
	Severity string
	Mode     Mode
}

// Matches reports whether the firing rule is one the action is for.
func (a RuleAction) Matches(f *StopRuleFiring) bool {
	if len(a.Labels) == 0 && a.Severity == "" {
		return true
	}
	return tree.MatchLabels(f.Labels, a.Labels) && (a.Severity == "" || a.Severity == f.Severity)
}

// ParseRuleAction parses the serve flag form "abort:severity=critical",
// "drain:label:team=research,tier=batch" or "abort:*".
func ParseRuleAction(s string) (RuleAction, error) {
	modeName, match, ok := strings.Cut(s, ":")
	var a RuleAction
	switch modeName {
	case "drain":
		a.Mode = ModeDrain
	case "abort":
		a.Mode = ModeAbort
	default:
		return a, fmt.Errorf("%w: stop rule action %q: want drain:<match> or abort:<match>", tree.ErrInvalidArgument, kv.Clip(s))
	}
	switch {
	case !ok || match == "":
		return a, fmt.Errorf("%w: stop rule action %q: want severity=<s>, label:<k=v,...> or * after the mode", tree.ErrInvalidArgument, kv.Clip(s))
	case match == "*":
	case strings.HasPrefix(match, "severity="):
		a.Severity = strings.TrimPrefix(match, "severity=")
	case strings.HasPrefix(match, "label:"):
		sel, err := tree.ParseSelector(strings.TrimPrefix(match, "label:"))
		if err != nil || len(sel) == 0 {
			return a, fmt.Errorf("%w: stop rule action %q: label:<k=v,...> wants at least one label", tree.ErrInvalidArgument, kv.Clip(s))
		}
		a.Labels = sel
	default:
		return a, fmt.Errorf("%w: stop rule action %q: want severity=<s>, label:<k=v,...> or *", tree.ErrInvalidArgument, kv.Clip(s))
	}
	return a, nil
}

// FileRuleProposal files, inside the caller's transaction, the stop
// proposal of a stop rule that became true for nodeID, and applies the
// policy in the same transaction: an action that matches the rule
// approves it and writes the termination (term; its ID empty when none:
// the caller KickRequested it once the transaction has committed). mode is
// the mode the rule's action hint suggests, for an operator who approves
// later.
func (s *Supervisor) FileRuleProposal(tx store.Txn, nodeID string, firing *StopRuleFiring, mode Mode, policy ProposalPolicy) (p *StopProposal, term Termination, err error) {
	n, err := tree.GetNodeIn(tx, nodeID)
	if err != nil {
		return nil, Termination{}, err
	}
	// An exited node's rule still files (stoprule's judged): the node's
	// exit is weighed by the record of the termination that stops it.
	if n.State == tree.NodeStateTerminated {
		return nil, Termination{}, fmt.Errorf("%w: node_id %s is %s", ErrAlreadyStopping, nodeID, tree.StateName(n.State))
	}
	if mode == 0 {
		mode = ModeDrain
	}
	var values []string
	for _, v := range firing.Values {
		tag := ""
		if v.SelfReported {
			tag = " (self-reported)"
		}
		values = append(values, v.Name+"="+v.Value+tag)
	}
	reason := fmt.Sprintf("stop rule %q (%s, set by %s) is true: %s", firing.Name, firing.RuleID, firing.SetBy, strings.Join(values, ", "))
	if len(reason) > 1024 {
		reason = kv.ClipUTF8(reason, 1021) + "..."
	}
	now := s.Clock.Now()
	p = &StopProposal{
		ProposalID: id.New(id.Proposal), NodeID: nodeID, Condition: "rule:" + firing.Name, Reason: reason,
		State: ProposalStatePending, ProposedBy: "stop-rule:" + firing.RuleID,
		CreatedAt: now, Mode: recordedMode(mode), Rule: firing,
	}
	decidedBy := ""
	for _, a := range policy.RuleActions {
		if a.Matches(firing) {
			p.Mode, decidedBy = recordedMode(a.Mode), "policy:stop-rule-action"
			break
		}
	}
	if decidedBy == "" && len(policy.AutoApprove) > 0 && tree.MatchLabels(n.Labels, policy.AutoApprove) {
		decidedBy = "policy:auto-approve"
	}
	if decidedBy != "" && n.State != tree.NodeStateRunning {
		// Another termination stops the node. The policy's stop takes it
		// over only from a termination it outranks (an operator's rule
		// over an agent's drain), or from an agent's own stop proposal it
		// supersedes, whose windows are the agent's (PolicyTakesOver); one
		// of the same authority (the operator's own drain, say) keeps the
		// node on its own windows, or a rule a rogue can make true would
		// stretch them to the policy's, and the proposal waits for the
		// operator.
		outranks, err := policyOutranks(tx, p, n, decidedBy)
		if err != nil {
			return nil, Termination{}, err
		}
		if !outranks {
			decidedBy = ""
		}
	}
	if decidedBy == "" {
		if countedInTree(p) {
			root := treeOf(n)
			inTree, err := pendingInTreeClosing(tx, root, now)
			if err != nil {
				return nil, Termination{}, err
			}
			if inTree >= MaxPendingProposalsPerTree {
				return nil, Termination{}, fmt.Errorf("%w: the tree of node_id %s (root %s) already has %d stop proposals of its agents waiting for a decision", ErrTreeProposalsFull, nodeID, root, inTree)
			}
			if err := tx.Put(pendingTreeKey(root, p.ProposalID), nil); err != nil {
				return nil, Termination{}, err
			}
		}
		// The node's pending list (`tether proposal ls --node N --pending`)
		// reads this index only: the rule's proposal is in it.
		if err := tx.Put(pendingPropKey(nodeID, p.ProposalID), []byte(pendingRuleMark)); err != nil {
			return nil, Termination{}, err
		}
		return p, Termination{}, putProposal(tx, p)
	}
	term, err = s.decideIn(tx, p, true, "auto-approved by the stop rule policy", decidedBy, now)
	if err != nil {
		return nil, Termination{}, err
	}
	return p, term, nil
}

// Conditions an agent may attach to a stop proposal:
//
//	now              — stop as soon as approved
//	after:<RFC 3339> — the control plane's clock has passed the time
//	calls>=<N>       — the ledger holds at least N tool calls begun by the node
//
// Unknown conditions are refused when proposed. count is the node's call
// counter (Supervisor.CallCount); nil, calls>=N is never true.
func parseCondition(c string, count func(tx store.ReadTxn, nodeID string) (int64, error)) (func(tx store.ReadTxn, nodeID string, now time.Time) (bool, error), error) {
	switch {
	case c == "" || c == "now":
		return func(store.ReadTxn, string, time.Time) (bool, error) { return true, nil }, nil
	case strings.HasPrefix(c, "after:"):
		at, err := time.Parse(time.RFC3339, strings.TrimPrefix(c, "after:"))
		if err != nil {
			return nil, fmt.Errorf("%w: condition: after: wants an RFC 3339 time", tree.ErrInvalidArgument)
		}
		return func(_ store.ReadTxn, _ string, now time.Time) (bool, error) { return !now.Before(at), nil }, nil
	case strings.HasPrefix(c, "calls>="):
		n, err := strconv.Atoi(strings.TrimPrefix(c, "calls>="))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: condition: calls>= wants a non-negative integer", tree.ErrInvalidArgument)
		}
		return func(tx store.ReadTxn, nodeID string, _ time.Time) (bool, error) {
			// Counted by the node's own counter: counting the ledger's
			// calls read every call of every tree, for each proposal.
			if count == nil {
				return false, nil
			}
			calls, err := count(tx, nodeID)
			return calls >= int64(n), err
		}, nil
	}
	return nil, fmt.Errorf("%w: condition %q: want now, after:<time> or calls>=<n>", tree.ErrInvalidArgument, kv.Clip(c))
}

// Propose records a stop proposal by an agent for its own node. It changes
// nothing else: only a decision (an operator's, or the policy's) starts a
// termination.
func (s *Supervisor) Propose(ctx context.Context, nodeID, condition, reason, proposedBy string, mode Mode, drain time.Duration, policy ProposalPolicy) (*StopProposal, *Termination, error) {
	if _, err := parseCondition(condition, nil); err != nil {
		return nil, nil, err
	}
	if len(reason) > 1024 {
		return nil, nil, fmt.Errorf("%w: reason is longer than 1024 bytes", tree.ErrInvalidArgument)
	}
	if mode == 0 {
		mode = ModeDrain
	}
	if drain < 0 || drain > MaxTerminationWindow {
		return nil, nil, fmt.Errorf("%w: drain_window must be between 0 and %s", tree.ErrInvalidArgument, MaxTerminationWindow)
	}
	p := &StopProposal{
		ProposalID: id.New(id.Proposal), NodeID: nodeID, Condition: condition, Reason: reason,
		State: ProposalStatePending, ProposedBy: proposedBy,
		CreatedAt: s.Clock.Now(), Mode: recordedMode(mode), DrainWindow: drain,
	}
	auto := false
	err := s.Store.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, nodeID)
		if err != nil {
			return err
		}
		if n.State != tree.NodeStateRunning {
			return fmt.Errorf("%w: node_id %s is %s", ErrAlreadyStopping, nodeID, tree.StateName(n.State))
		}
		// A termination that covers it (requested, or its mark not yet
		// down to it) stops it already.
		cover, err := tree.CoveringStopIn(tx, n)
		if err != nil {
			return err
		}
		if cover != nil {
			return fmt.Errorf("%w: %s", ErrAlreadyStopping, cover.Describe(nodeID))
		}
		pending := 0
		if err := tx.Scan(pendingPropPrefix(nodeID), nil, func(_, v []byte) error {
			if string(v) == pendingRuleMark {
				return nil // a stop rule's: not the agent's to bound
			}
			pending++
			if pending >= MaxPendingProposals {
				return store.ErrStopScan
			}
			return nil
		}); err != nil {
			return err
		}
		if pending >= MaxPendingProposals {
			return fmt.Errorf("%w: node_id %s already has %d stop proposals waiting for a decision, the maximum per node", tree.ErrLimit, nodeID, pending)
		}
		root := treeOf(n)
		inTree, err := pendingInTreeClosing(tx, root, p.CreatedAt)
		if err != nil {
			return err
		}
		if inTree >= MaxPendingProposalsPerTree {
			return fmt.Errorf("%w: the tree of node_id %s (root %s) already has %d stop proposals waiting for a decision, the maximum per tree; an operator must decide some first", tree.ErrLimit, nodeID, root, inTree)
		}
		auto = false
		if len(policy.AutoApprove) > 0 && tree.MatchLabels(n.Labels, policy.AutoApprove) {
			cond, _ := parseCondition(condition, s.CallCount)
			if auto, err = cond(tx, nodeID, s.Clock.Now()); err != nil {
				return err
			}
		}
		if err := tx.Put(pendingPropKey(nodeID, p.ProposalID), nil); err != nil {
			return err
		}
		if err := tx.Put(pendingTreeKey(root, p.ProposalID), nil); err != nil {
			return err
		}
		return putProposal(tx, p)
	})
	if err != nil || !auto {
		return p, nil, err
	}
	return s.Decide(ctx, p.ProposalID, true, "auto-approved by the label policy", PolicyDecider+"auto-approve")
}

// Decide approves or rejects a pending proposal. Approval starts a
// termination of the proposing node, requested by the decider.
func (s *Supervisor) Decide(ctx context.Context, proposalID string, approve bool, reason, decidedBy string) (*StopProposal, *Termination, error) {
	if err := id.Check(id.Proposal, "proposal_id", proposalID); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	var p *StopProposal
	termID := ""
	var term Termination
	err := s.Store.Update(ctx, func(tx store.Txn) error {
		p = &StopProposal{}
		if err := getProposal(tx, proposalID, p); err != nil {
			return err
		}
		if p.State != ProposalStatePending {
			return fmt.Errorf("%w: proposal_id %s is %s", ErrProposalDecided, proposalID, strings.ToLower(strings.TrimPrefix(p.State.String(), "PROPOSAL_STATE_")))
		}
		var err error
		term, err = s.decideIn(tx, p, approve, reason, decidedBy, s.Clock.Now())
		termID = term.ID
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if termID == "" {
		return p, nil, nil
	}
	s.KickRequested(term)
	return p, &term, nil
}

// decideIn approves or rejects the pending proposal p inside tx and writes
// it; approval writes the termination of its node (returned; the caller
// Kicks it after the commit).
func (s *Supervisor) decideIn(tx store.Txn, p *StopProposal, approve bool, reason, decidedBy string, now time.Time) (Termination, error) {
	p.DecidedBy, p.DecidedAt = decidedBy, now
	if err := tx.Delete(pendingPropKey(p.NodeID, p.ProposalID)); err != nil {
		return Termination{}, err
	}
	if countedInTree(p) {
		// An agent's own proposal, or its rule's, also held a place in its
		// tree's bound.
		n, err := tree.GetNodeIn(tx, p.NodeID)
		switch {
		case err == nil:
			if err := tx.Delete(pendingTreeKey(treeOf(n), p.ProposalID)); err != nil {
				return Termination{}, err
			}
		case !errors.Is(err, tree.ErrNodeNotFound):
			return Termination{}, err
		}
	}
	if !approve {
		p.State = ProposalStateRejected
		return Termination{}, putProposal(tx, p)
	}
	n, err := tree.GetNodeIn(tx, p.NodeID)
	if err != nil {
		return Termination{}, err
	}
	mode := ModeDrain
	if p.Mode == ModeAbort {
		mode = ModeAbort
	}
	drain := p.DrainWindow
	if drain == 0 {
		drain = DefaultDrainWindow
	}
	term, err := NewTermination(id.New(id.Termination), p.NodeID, mode, drain, DefaultCancelAckTimeout, DefaultConfirmTimeout,
		proposalReason(p), decidedBy, now)
	if err != nil {
		return Termination{}, err
	}
	term.ProposalID = p.ProposalID
	// Its tree, as TerminateIn keeps it: the loop's turn (an operator's
	// decision the tree's operators' turn, beside its agents'), and the
	// record outbox's. Without it the loop placed the stop by its root's
	// ancestors, in the tree's agents' turn: an operator's approval, or
	// its rule's policy action, waited there behind each of a rogue's
	// terminations that moved at once (rogue41c).
	term.Tree = treeOf(n)
	term.AgentWindows = p.Rule == nil
	if term.AgentWindows {
		term.ProposerLineage = append(append([]string(nil), n.Ancestors...), n.NodeID)
	}
	term.HookTimeout = s.hookTimeout()
	if strings.HasPrefix(decidedBy, PolicyDecider) {
		// No one outside the workload weighed this stop but whoever set
		// the rule that filed it. A node's own proposal carries the
		// proposing agent's authority, so that it never shields the node
		// from its ancestors (nor from a rollout) with a window of its
		// choosing; a rule's carries its setter's (an operator's rule, the
		// operator's), so that the node's ancestors cannot take over the
		// stop an operator's rule started.
		term.RequesterLineage = policyLineage(p, n)
	}
	// A node another termination is stopping is taken over only by a
	// termination that supersedes it (an operator's over an agent's, an
	// abort over a drain), as Terminate does.
	if err := mayStop(tx, term, n); err != nil {
		return Termination{}, err
	}
	p.State = ProposalStateApproved
	p.TerminationID = term.ID
	if err := putRequested(tx, term); err != nil {
		return Termination{}, err
	}
	return term, putProposal(tx, p)
}

// treeOf is the root of n's tree: the bound on its agents' pending
// proposals is the tree's.
func treeOf(n *tree.Node) string {
	if len(n.Ancestors) > 0 {
		return n.Ancestors[0]
	}
	return n.NodeID
}

// policyLineage is the requester lineage of the termination a policy
// approved for proposal p of node n (see Termination.Rank): none for a
// stop rule an operator set (an operator's authority); the lineage down to
// the agent that set the rule (n or an ancestor), for an agent's rule;
// n's own lineage for n's own proposal.
func policyLineage(p *StopProposal, n *tree.Node) []string {
	own := append(append([]string(nil), n.Ancestors...), n.NodeID)
	if p.Rule == nil {
		return own
	}
	setter, agent := strings.CutPrefix(p.Rule.SetBy, "agent:")
	if !agent {
		return nil
	}
	if i := slices.Index(own, setter); i >= 0 {
		return own[:i+1]
	}
	return own
}

// policyOutranks reports whether the stop a policy would start for
// proposal p (decided by decidedBy) takes n over from the termination now
// stopping it (PolicyTakesOver).
func policyOutranks(tx store.ReadTxn, p *StopProposal, n *tree.Node, decidedBy string) (bool, error) {
	if n.TerminationID == "" {
		return true, nil
	}
	var owner Termination
	if err := getTermination(tx, n.TerminationID, &owner); err != nil {
		return false, err
	}
	// The policy's stop as decideIn writes it, as far as the decision
	// reads it: its authority and its mode.
	stop := Termination{RequestedBy: decidedBy, RequesterLineage: policyLineage(p, n), Mode: ModeDrain}
	if p.Mode == ModeAbort {
		stop.Mode = ModeAbort
	}
	return PolicyTakesOver(stop, owner), nil
}

// proposalReason is the reason of the termination a proposal starts: the
// proposal's label and its reason, cut to a termination reason's bound on
// a character boundary. The proposer's reason may be as long as that bound
// itself; a decision must not fail on its words (the proposal keeps them
// whole).
func proposalReason(p *StopProposal) string {
	return kv.ClipUTF8("stop proposal "+p.ProposalID+": "+p.Reason, MaxReasonBytes)
}

// MaxProposalPage is the most proposals one page of Proposals reads.
const MaxProposalPage = 1000

var errBadProposalToken = fmt.Errorf("%w: page_token is not a token from an earlier ListProposals answer", tree.ErrInvalidArgument)

// checkProposalToken accepts what Proposals hands out as a page token: a
// proposal id, or a node id and a proposal id ("<node>/<proposal>", the
// key of the pending index of every node).
func checkProposalToken(token string) error {
	node, prop, two := strings.Cut(token, "/")
	if !two {
		node, prop = "", token
	}
	if id.Check(id.Proposal, "page_token", prop) != nil || (two && id.Check(id.Node, "page_token", node) != nil) {
		return errBadProposalToken
	}
	return nil
}

// Proposals lists a page of proposals, optionally in one state and of one
// node: the proposals among the next pageSize (0 or more than
// MaxProposalPage: MaxProposalPage) entries read after pageToken ("" for
// the first page), in key order, and the token of the next page, "" after
// the last. A page reads at most pageSize proposals, so one whose state
// filter the index read does not answer (a node's decided ones) may list
// fewer, even none, before its end: a caller reads on while a token is
// returned. A node's decided proposals are never pruned, so its listing is
// read a page at a time, not in one answer.
func (s *Supervisor) Proposals(ctx context.Context, state ProposalState, nodeID, pageToken string, pageSize int) ([]*StopProposal, string, error) {
	if pageSize <= 0 || pageSize > MaxProposalPage {
		pageSize = MaxProposalPage
	}
	if pageToken != "" {
		if err := checkProposalToken(pageToken); err != nil {
			return nil, "", err
		}
	}
	keep := func(p *StopProposal) bool {
		return (state == ProposalStateUnspecified || p.State == state) && (nodeID == "" || p.NodeID == nodeID)
	}
	// A node's proposals have an index of their own, and the pending ones
	// another (a node's at most MaxPendingProposals of the agent's own,
	// and its rules'): an operator's page of a node, or of what waits for
	// a decision, does not read every proposal ever filed (a rogue tree's
	// rejected ones among them, never pruned) to find its.
	index := []byte(prefixProposal)
	indexed := true
	switch {
	case state == ProposalStatePending && nodeID != "":
		index = pendingPropPrefix(nodeID)
	case state == ProposalStatePending:
		index = []byte(prefixPendingProp)
	case nodeID != "":
		index = propByNodePrefix(nodeID)
	default:
		indexed = false
	}
	var (
		out  []*StopProposal
		next string
	)
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next = nil, ""
		var start []byte
		if pageToken != "" {
			start = append(append(slices.Clone(index), pageToken...), 0)
		}
		// The page's keys: <index>[<node id>/]<proposal id>, or the
		// proposals themselves when no index is read.
		var rests []string
		var values [][]byte
		if err := tx.Scan(index, start, func(k, v []byte) error {
			if len(rests) == pageSize {
				next = rests[len(rests)-1]
				return store.ErrStopScan
			}
			rests = append(rests, string(k[len(index):]))
			if !indexed {
				values = append(values, slices.Clone(v))
			}
			return nil
		}); err != nil {
			return err
		}
		for i, rest := range rests {
			p := &StopProposal{}
			var err error
			if indexed {
				err = getProposal(tx, rest[strings.LastIndexByte(rest, '/')+1:], p)
			} else {
				err = decodeProposal(values[i], p)
			}
			if err != nil {
				return err
			}
			if keep(p) {
				out = append(out, p)
			}
		}
		return nil
	})
	return out, next, err
}
