package tree

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TEMPORARY until internal/storecodec lands: the stored form through the
// generated message.

func encodeNode(n *Node) ([]byte, error) {
	m := &tetherv1.Node{
		NodeId: n.NodeID, ParentNodeId: n.ParentNodeID, Ancestors: n.Ancestors, Name: n.Name, Labels: n.Labels,
		State: tetherv1.NodeState(n.State), CreatedAt: ts(n.CreatedAt), CreatedBy: n.CreatedBy, LastSeenAt: ts(n.LastSeenAt),
		ExitedAt: ts(n.ExitedAt), ExitConfirmedBy: n.ExitConfirmedBy, TerminationId: n.TerminationID, ReadyAt: ts(n.ReadyAt),
		SessionOpenedAt: ts(n.SessionOpenedAt), SessionClosedAt: ts(n.SessionClosedAt),
	}
	for _, c := range n.ExitConfirmations {
		m.ExitConfirmations = append(m.ExitConfirmations, &tetherv1.ExitConfirmation{By: c.By, Kind: c.Kind, At: ts(c.At), Reason: c.Reason})
	}
	for _, c := range n.Contradictions {
		m.Contradictions = append(m.Contradictions, &tetherv1.Contradiction{Kind: c.Kind, At: ts(c.At), Detail: c.Detail})
	}
	for _, s := range n.OpenSessions {
		m.OpenSessions = append(m.OpenSessions, &tetherv1.OpenSession{SessionId: s.SessionID, OpenedAt: ts(s.OpenedAt), Instance: s.Instance})
	}
	return proto.Marshal(m)
}

// UnmarshalNode decodes a node from its stored form (a value under
// NodePrefix), for the readers that follow the nodes with a watch or a
// scan of their own.
func UnmarshalNode(b []byte, n *Node) error {
	m := &tetherv1.Node{}
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	*n = Node{
		NodeID: m.NodeId, ParentNodeID: m.ParentNodeId, Ancestors: m.Ancestors, Name: m.Name, Labels: m.Labels,
		State: NodeState(m.State), CreatedAt: tm(m.CreatedAt), CreatedBy: m.CreatedBy, LastSeenAt: tm(m.LastSeenAt),
		ExitedAt: tm(m.ExitedAt), ExitConfirmedBy: m.ExitConfirmedBy, TerminationID: m.TerminationId, ReadyAt: tm(m.ReadyAt),
		SessionOpenedAt: tm(m.SessionOpenedAt), SessionClosedAt: tm(m.SessionClosedAt),
	}
	for _, c := range m.ExitConfirmations {
		n.ExitConfirmations = append(n.ExitConfirmations, ExitConfirmation{By: c.By, Kind: c.Kind, At: tm(c.At), Reason: c.Reason})
	}
	for _, c := range m.Contradictions {
		n.Contradictions = append(n.Contradictions, Contradiction{Kind: c.Kind, At: tm(c.At), Detail: c.Detail})
	}
	for _, s := range m.OpenSessions {
		n.OpenSessions = append(n.OpenSessions, OpenSession{SessionID: s.SessionId, OpenedAt: tm(s.OpenedAt), Instance: s.Instance})
	}
	return nil
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tm(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
