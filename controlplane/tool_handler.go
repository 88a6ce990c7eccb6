package controlplane

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// toolService is the tool-call ledger's edge. Only the tool layer feeds it:
// a tool server authenticated with its own token (auth.KindToolServer),
// whose name is its gate id. A call's end and its cancel acknowledgement are
// evidence in the termination record, so they must come from a credential
// the agent does not hold: an agent that learnt its call ids (they are in
// the cancel orders) could otherwise acknowledge a cancellation while its
// handler runs on. A tool server reports, ends, acknowledges and watches
// only the calls of its own gate.
type toolService struct {
	tetherv1connect.UnimplementedToolServiceHandler
	s *Server
}

// gateOf returns the caller's gate id: its tool-server name. A request's
// gate_id must be empty or that name.
func gateOf(ctx context.Context, requested string) (auth.Principal, string, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsToolServer() {
		return p, "", denied("only a tool server (a tool-server token) may report tool calls")
	}
	if requested != "" && requested != p.ToolServer() {
		return p, "", denied("tool server %s reports as gate_id %q only, not %q", p.ToolServer(), p.ToolServer(), requested)
	}
	return p, p.ToolServer(), nil
}

func (t *toolService) ledger() (*ledger.Ledger, error) {
	if t.s.ledger.Tokens == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("capability tokens are not configured on this server"))
	}
	return t.s.ledger, nil
}

func (t *toolService) BeginCall(ctx context.Context, req *connect.Request[tetherv1.BeginCallRequest]) (*connect.Response[tetherv1.BeginCallResponse], error) {
	p, gate, err := gateOf(ctx, req.Msg.GateId)
	if err != nil {
		return nil, err
	}
	l, err := t.ledger()
	if err != nil {
		return nil, err
	}
	// Once the gate's refusals are spent, a token that could not verify is
	// refused before any signature work; one that might is still checked,
	// as another lineage's valid token must still begin.
	if err := auth.RefusalsSpent(ctx); err != nil && !t.s.grants.Plausible(req.Msg.Token) {
		return nil, err
	}
	// The holder as charge read it (a node not remembered as active), and
	// the generation it was read after (activeNodes).
	var holder *tree.Node
	var gen uint64
	var holderRefused bool // the charge refused the holder's lineage
	call, err := l.Begin(ctx, req.Msg.Token, req.Msg.Tool, gate, req.Msg.RequiredScope, p.ID(), func(ctx context.Context, nodeID string) error {
		n, g, err := t.chargeHolder(ctx, nodeID)
		if nodeID != "" {
			holder, gen, holderRefused = n, g, err != nil
		}
		return err
	})
	// A call begun, or a request the gate served (a seen report), with
	// the token of a node that never had a session is weighed against
	// its ancestors' claims of exit as its own requests are (agentActAs).
	// So is one refused for its lineage's spent budget of a running such
	// node (its token at work, as a refusal for budget after a session's
	// end is: chargeHolder), not a call of one a stop covers, which the
	// ledger would refuse anyway: until the fortieth pass a rogue parent
	// that spent its lineage's budget, claimed its exit and called on
	// with its never-sessioned child's token, every call refused unnoted,
	// read confirmed by the control plane. A seen report refused so is
	// weighed whatever the holder's state: the gate served the request
	// already, and the ledger notes a draining or aborting holder's
	// report as a running one's; until the forty-first pass a rogue
	// parent under its operator's drain, its child's grant still live,
	// claimed its exit and was served with that child's token, each
	// report refused for the budget it had spent, and read confirmed. A
	// holder that may act is then remembered as its own requests
	// remember it: a flood of refusals costs one read of its ancestors
	// until one of them changes.
	refusedAtWork := holderRefused && holder != nil && holder.State != tree.NodeStateTerminated &&
		(holder.State == tree.NodeStateRunning || req.Msg.Tool == ledger.SeenTool)
	// A seen report of a known holder whose grant is dead by the time it
	// lands (sent again after its first try failed, or kept on disk
	// across the gate's restart) is still a request the gate served while
	// the grant was live: the ledger notes it on the holder (life after
	// its session's end, a contradiction after its claim), and so is it
	// weighed against the holder's ancestors' claims as the same report
	// landing earlier is. Until the forty-first pass a rogue parent whose
	// report of its never-sessioned child's token landed after its stop
	// revoked the child's grant read confirmed by the control plane.
	deadSeen := req.Msg.Tool == ledger.SeenTool && errors.Is(err, ledger.ErrTokenRejected)
	if (err == nil || errors.Is(err, ledger.ErrSeenNoted) || refusedAtWork || deadSeen) && holder != nil {
		if nerr := t.s.tree.NoteAtWorkAfterClaims(ctx, holder, tree.ActivityToolCall); nerr != nil {
			return nil, toConnect(nerr)
		}
		if (err == nil || refusedAtWork) && holder.State != tree.NodeStateTerminated && !tree.ExitConfirmed(holder) && !tree.SessionEndIsLastSeen(holder) {
			t.s.active.remember(holder, gen)
		}
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.BeginCallResponse{Call: wire.ToolCall(call)}), nil
}

// charge charges a relayed BeginCall to whoever it belongs to: the lineage
// of the token's holder, or (nodeID "", or a holder the tree does not know)
// the gate's refusal budget. A gate asks about every token it is shown, so
// one rogue caller must not spend what every caller of the gate shares.
func (t *toolService) charge(ctx context.Context, nodeID string) error {
	_, _, err := t.chargeHolder(ctx, nodeID)
	return err
}

// chargeHolder is charge, answering also the holder's node when it read
// it (a node not remembered as active), else nil, and the generation it
// read it after (activeNodes.lookup).
func (t *toolService) chargeHolder(ctx context.Context, nodeID string) (*tree.Node, uint64, error) {
	if nodeID == "" {
		return nil, 0, auth.ChargeRefused(ctx)
	}
	lineage, ok, gen := t.s.active.lookup(nodeID)
	var n *tree.Node
	if !ok {
		var err error
		n, err = t.s.tree.Get(ctx, nodeID)
		if err != nil {
			return nil, gen, auth.ChargeRefused(ctx)
		}
		lineage = lineageOf(n)
	}
	refused := auth.ChargeRelayed(ctx, lineage, "agent:"+nodeID)
	// A call refused for its lineage's spent budget is still the node's
	// credential at work: after its session's end, it is the control plane
	// seeing the node alive (tree.SeenAlive), or a rogue that spent its own
	// budget first would have its calls after the end refused unnoted and
	// its claim of exit corroborated by the end it outlived. Only while the
	// end is the last seen (one write per end; a node remembered as active
	// was read with it not so, and is forgotten at its next end), on the
	// read the charge already made: a flood costs no write.
	if refused == nil || n == nil || n.State == tree.NodeStateTerminated {
		return n, gen, refused
	}
	switch {
	case tree.ExitConfirmed(n):
		// After its exit was confirmed, its token at work is a
		// contradiction, as the ledger keeps one of a call it refuses: a
		// refusal for budget came first and kept none, and a launcher's
		// attestation stood (twenty-ninth pass). Bounded as every
		// contradiction is: past the bound, on the read already made.
		if len(n.Contradictions) < tree.MaxContradictions {
			if _, err := t.s.tree.Act(ctx, nodeID, tree.ActivityToolCall, "a tool call refused for its lineage's spent rate budget"); err != nil && !errors.Is(err, tree.ErrNodeExited) {
				return n, gen, err
			}
		}
	case tree.SessionEndIsLastSeen(n):
		if err := t.s.tree.SeenAlive(ctx, nodeID); err != nil {
			return n, gen, err
		}
	}
	return n, gen, refused
}

func (t *toolService) EndCall(ctx context.Context, req *connect.Request[tetherv1.EndCallRequest]) (*connect.Response[tetherv1.EndCallResponse], error) {
	p, gate, err := gateOf(ctx, req.Msg.GateId)
	if err != nil {
		return nil, err
	}
	call, err := t.s.ledger.End(ctx, req.Msg.CallId, gate, p.ID(), req.Msg.Failed, req.Msg.Error)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.EndCallResponse{Call: wire.ToolCall(call)}), nil
}

func (t *toolService) CancelAck(ctx context.Context, req *connect.Request[tetherv1.CancelAckRequest]) (*connect.Response[tetherv1.CancelAckResponse], error) {
	p, gate, err := gateOf(ctx, req.Msg.GateId)
	if err != nil {
		return nil, err
	}
	call, err := t.s.ledger.CancelAck(ctx, req.Msg.CallId, gate, p.ID())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.CancelAckResponse{Call: wire.ToolCall(call)}), nil
}

func (t *toolService) WatchCancels(ctx context.Context, req *connect.Request[tetherv1.WatchCancelsRequest], stream *connect.ServerStream[tetherv1.WatchCancelsResponse]) error {
	_, gate, err := gateOf(ctx, req.Msg.GateId)
	if err != nil {
		return err
	}
	// Flush the response headers now: the gate's client returns from the
	// call only when they arrive, and the first order may be far off.
	if err := stream.Send(nil); err != nil {
		return err
	}
	err = t.s.ledger.WatchCancels(ctx, gate, func(c *ledger.ToolCall) error {
		return stream.Send(&tetherv1.WatchCancelsResponse{
			CallId: c.CallID, NodeId: c.NodeID, TerminationId: c.TerminationID,
			Reason: fmt.Sprintf("termination %s cancelled the call", c.TerminationID),
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
	calls, err := store.Read(ctx, t.s.store, func(tx store.ReadTxn) ([]*ledger.ToolCall, error) {
		return ledger.OpenCallsIn(tx, req.Msg.NodeId)
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ListCallsResponse{Calls: wire.ToolCalls(calls)}), nil
}
