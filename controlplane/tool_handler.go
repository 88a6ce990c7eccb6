package controlplane

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor"
)

// toolService is the tool-call ledger's edge. Tool gates call it with an
// operator token (a tool server's own identity) or an agent credential;
// every entry records the gate that reported it.
//
// An agent credential makes the agent the gate of its own in-process
// tools, nothing more: it begins calls only with capability tokens held by
// its own node, and ends or acknowledges only its own node's calls. (Gate
// ids are names, not secrets: without this, any agent that learnt a call
// id could end another agent's call, or acknowledge its cancellation, and
// falsify the termination record.)
type toolService struct {
	tetherv1connect.UnimplementedToolServiceHandler
	s *Server
}

// ownToken refuses, for an agent caller, a token held by another node.
func ownToken(p auth.Principal) func(nodeID string) error {
	if !p.IsAgent() {
		return nil
	}
	return func(nodeID string) error {
		if nodeID != p.NodeID() {
			return fmt.Errorf("%w: agent %s may report tool calls only for its own capability tokens, and this token is held by node %s", auth.ErrDenied, p.NodeID(), nodeID)
		}
		return nil
	}
}

// ownCall refuses, for an agent caller, another node's call.
func ownCall(p auth.Principal) func(*tetherv1.ToolCall) error {
	if !p.IsAgent() {
		return nil
	}
	return func(c *tetherv1.ToolCall) error {
		if c.NodeId != p.NodeID() {
			return fmt.Errorf("%w: agent %s may report only its own node's tool calls, not call_id %s", auth.ErrDenied, p.NodeID(), c.CallId)
		}
		return nil
	}
}

func (t *toolService) ledger() (*supervisor.Ledger, error) {
	if t.s.ledger.Tokens == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("capability tokens are not configured on this server"))
	}
	return t.s.ledger, nil
}

func (t *toolService) BeginCall(ctx context.Context, req *connect.Request[tetherv1.BeginCallRequest]) (*connect.Response[tetherv1.BeginCallResponse], error) {
	l, err := t.ledger()
	if err != nil {
		return nil, err
	}
	p, _ := auth.FromContext(ctx)
	call, err := l.Begin(ctx, req.Msg.Token, req.Msg.Tool, req.Msg.GateId, req.Msg.RequiredScope, ownToken(p))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.BeginCallResponse{Call: call}), nil
}

func (t *toolService) EndCall(ctx context.Context, req *connect.Request[tetherv1.EndCallRequest]) (*connect.Response[tetherv1.EndCallResponse], error) {
	p, _ := auth.FromContext(ctx)
	call, err := t.s.ledger.End(ctx, req.Msg.CallId, req.Msg.GateId, req.Msg.Failed, req.Msg.Error, ownCall(p))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.EndCallResponse{Call: call}), nil
}

func (t *toolService) CancelAck(ctx context.Context, req *connect.Request[tetherv1.CancelAckRequest]) (*connect.Response[tetherv1.CancelAckResponse], error) {
	p, _ := auth.FromContext(ctx)
	call, err := t.s.ledger.CancelAck(ctx, req.Msg.CallId, req.Msg.GateId, ownCall(p))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.CancelAckResponse{Call: call}), nil
}

func (t *toolService) WatchCancels(ctx context.Context, req *connect.Request[tetherv1.WatchCancelsRequest], stream *connect.ServerStream[tetherv1.WatchCancelsResponse]) error {
	p, _ := auth.FromContext(ctx)
	// Flush the response headers now: the gate's client returns from the
	// call only when they arrive, and the first order may be far off.
	if err := stream.Send(nil); err != nil {
		return err
	}
	err := t.s.ledger.WatchCancels(ctx, req.Msg.GateId, func(c *tetherv1.ToolCall) error {
		// An agent acting as its own gate sees only its own calls' orders.
		if p.IsAgent() && c.NodeId != p.NodeID() {
			return nil
		}
		return stream.Send(&tetherv1.WatchCancelsResponse{
			CallId: c.CallId, NodeId: c.NodeId, TerminationId: c.TerminationId,
			Reason: fmt.Sprintf("termination %s cancelled the call", c.TerminationId),
		})
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return toConnect(err)
}

// ListCalls lists a node's open calls (operators only: the policy's rule).
func (t *toolService) ListCalls(ctx context.Context, req *connect.Request[tetherv1.ListCallsRequest]) (*connect.Response[tetherv1.ListCallsResponse], error) {
	if _, err := t.s.tree.Get(ctx, req.Msg.NodeId); err != nil {
		return nil, toConnect(err)
	}
	var calls []*tetherv1.ToolCall
	err := t.s.store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		calls, err = supervisor.OpenCallsIn(tx, req.Msg.NodeId)
		return err
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ListCallsResponse{Calls: calls}), nil
}
