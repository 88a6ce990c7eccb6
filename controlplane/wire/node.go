package wire

import (
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Node is an agent-tree node as the API shows it.
func Node(n *tree.Node) *tetherv1.Node {
	if n == nil {
		return nil
	}
	return &tetherv1.Node{
		NodeId:            n.NodeID,
		ParentNodeId:      n.ParentNodeID,
		Ancestors:         n.Ancestors,
		Name:              n.Name,
		Labels:            n.Labels,
		State:             tetherv1.NodeState(n.State),
		CreatedAt:         timestamp(n.CreatedAt),
		CreatedBy:         n.CreatedBy,
		LastSeenAt:        timestamp(n.LastSeenAt),
		ExitedAt:          timestamp(n.ExitedAt),
		ExitConfirmedBy:   n.ExitConfirmedBy,
		TerminationId:     n.TerminationID,
		ReadyAt:           timestamp(n.ReadyAt),
		SessionOpenedAt:   timestamp(n.SessionOpenedAt),
		SessionClosedAt:   timestamp(n.SessionClosedAt),
		ExitConfirmations: each(n.ExitConfirmations, exitConfirmation),
		Contradictions:    each(n.Contradictions, Contradiction),
		OpenSessions:      each(n.OpenSessions, openSession),
	}
}

func exitConfirmation(c tree.ExitConfirmation) *tetherv1.ExitConfirmation {
	return &tetherv1.ExitConfirmation{By: c.By, Kind: c.Kind, At: timestamp(c.At), Reason: c.Reason}
}

func openSession(s tree.OpenSession) *tetherv1.OpenSession {
	return &tetherv1.OpenSession{SessionId: s.SessionID, OpenedAt: timestamp(s.OpenedAt), Instance: s.Instance}
}

// Nodes are nodes as the API shows them.
func Nodes(ns []*tree.Node) []*tetherv1.Node { return each(ns, Node) }

// Contradiction is one piece of activity after a node's confirmed exit as
// the API (and the record) shows it.
func Contradiction(c tree.Contradiction) *tetherv1.Contradiction {
	return &tetherv1.Contradiction{Kind: c.Kind, At: timestamp(c.At), Detail: c.Detail}
}

// SessionSignal is a drain or abort signal as a session receives it.
func SessionSignal(s *tree.SessionSignal) *tetherv1.SessionSignal {
	if s == nil {
		return nil
	}
	return &tetherv1.SessionSignal{
		Kind:          tetherv1.SignalKind(s.Kind),
		TerminationId: s.TerminationID,
		Deadline:      timestamp(s.Deadline),
		Reason:        s.Reason,
	}
}
