package ledger

import (
	"context"
	"fmt"
	"regexp"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Ledger errors.
var (
	ErrCallNotFound  = fault.New(fault.NotFound, "supervisor: tool call not found")
	ErrWrongGate     = fault.New(fault.Denied, "supervisor: call was reported by another gate")
	ErrTokenRejected = fault.New(fault.Denied, "supervisor: capability token rejected")
)

// TokenChecker verifies a capability token for a tool call: signature,
// expiry, the revocation chain and the required scope. It returns the
// holder's node id and the grant id.
type TokenChecker interface {
	CheckToken(ctx context.Context, token, requiredScope string) (nodeID, grantID string, err error)
}

// Ledger is the tool-call ledger: every call a gate begins, ends, is asked
// to cancel and acknowledges, with the gate that reported it.
type Ledger struct {
	Store  store.Store
	Clock  clock.Clock
	Tokens TokenChecker
	// Observer, when set, is told of every call written (stop rules).
	Observer Observer

	nodes callNodes // the node of calls begun or ordered cancelled here (batch.go)
}

// Observer is told, inside the writing transaction, of each call written,
// which stop rules observe (supervisor/stoprule keeps per-node counters
// with them). Being in the writer's transaction, the counters are exactly
// what the ledger holds: no event can be lost or counted twice across a
// crash. An Observer must be cheap (it runs on the commit path) and must
// not call Update.
type Observer interface {
	// ObserveCall: a call was written; before is the stored call before
	// the change (nil for a new call).
	ObserveCall(tx store.Txn, before, after *tetherv1.ToolCall) error
}

var (
	gatePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
	toolPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
)

// Begin verifies the token and the node's state and records the call as in
// flight, begun by the tool server by (a principal id). A node that is
// draining or aborting gets tree.ErrNodeStopping, and the refused call is
// recorded (rejected_draining) for the termination's record. A node whose
// exit was confirmed gets ErrNodeExited, and the attempt is kept on the node
// as contradicting evidence.
func (l *Ledger) Begin(ctx context.Context, token, tool, gateID, requiredScope, by string) (*tetherv1.ToolCall, error) {
	if !toolPattern.MatchString(tool) {
		return nil, fmt.Errorf("%w: tool must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument)
	}
	if !gatePattern.MatchString(gateID) {
		return nil, fmt.Errorf("%w: gate_id must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument)
	}
	if token == "" {
		return nil, fmt.Errorf("%w: token is required", tree.ErrInvalidArgument)
	}
	if requiredScope == "" {
		requiredScope = "tool:" + tool
	}
	nodeID, grantID, err := l.Tokens.CheckToken(ctx, token, requiredScope)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenRejected, err)
	}
	clockNow := l.Clock.Now()
	now := timestamppb.New(clockNow)
	call := &tetherv1.ToolCall{
		CallId: id.New(id.Call), NodeId: nodeID, GrantId: grantID, Tool: tool, GateId: gateID,
		State: tetherv1.CallState_CALL_STATE_IN_FLIGHT, BegunAt: now, BegunBy: by,
	}
	var stopping error
	err = l.Store.Update(ctx, func(tx store.Txn) error {
		stopping = nil
		node, err := tree.GetNodeIn(tx, nodeID)
		if err != nil {
			return err
		}
		if tree.ExitConfirmed(node) && node.State != tetherv1.NodeState_NODE_STATE_TERMINATED {
			stopping = tree.ExitedError(node, tree.ActivityToolCall)
			if tree.NoteContradiction(node, tree.ActivityToolCall, fmt.Sprintf("tool %s via gate %s", tool, gateID), clockNow) {
				if err := tree.PutNodeIn(tx, node); err != nil {
					return err
				}
			}
			if node.State == tetherv1.NodeState_NODE_STATE_EXITED {
				return nil // no termination to account for a refused call
			}
		}
		if node.State != tetherv1.NodeState_NODE_STATE_RUNNING {
			// Refuse, and keep the refusal as evidence for the record.
			if stopping == nil { // (an exited node's refusal names its confirmation)
				stopping = fmt.Errorf("%w: node %s is %s: new tool calls are refused", tree.ErrNodeStopping, nodeID, tree.StateName(node.State))
			}
			call.State = tetherv1.CallState_CALL_STATE_ENDED
			call.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING
			call.EndedAt = now
			call.TerminationId = node.TerminationId
			if err := putCall(tx, call); err != nil {
				return err
			}
			if err := l.observe(tx, nil, call); err != nil {
				return err
			}
			if node.TerminationId != "" {
				return tx.Put(termCallKey(node.TerminationId, call.CallId), nil)
			}
			return nil
		}
		if err := putCall(tx, call); err != nil {
			return err
		}
		if err := l.observe(tx, nil, call); err != nil {
			return err
		}
		return tx.Put(openCallKey(nodeID, call.CallId), nil)
	})
	if err != nil {
		return nil, err
	}
	if call.State != tetherv1.CallState_CALL_STATE_ENDED {
		l.nodes.remember(call)
	}
	if stopping != nil {
		if call.State != tetherv1.CallState_CALL_STATE_ENDED {
			return nil, stopping
		}
		return call, stopping
	}
	return call, nil
}

// End records the end of a call (completed or failed), reported by the
// tool server by through its gate gateID (the gate that began it). A call
// that had a cancel order and ends is resolved cancelled_acked: the handler
// returned.
func (l *Ledger) End(ctx context.Context, callID, gateID, by string, failed bool, message string) (*tetherv1.ToolCall, error) {
	return l.finish(ctx, callID, gateID, func(c *tetherv1.ToolCall, now *timestamppb.Timestamp) {
		c.EndedAt = now
		c.EndedBy = by
		switch {
		case c.State == tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED:
			c.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED
			c.CancelAckedAt = now
			c.AcknowledgedBy = by
		case failed:
			c.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_FAILED
		default:
			c.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED
		}
		c.Error = kv.ClipUTF8(message, 512)
	})
}

// CancelAck records that the gate cancelled the call and its handler
// returned, reported by the tool server by through gateID.
func (l *Ledger) CancelAck(ctx context.Context, callID, gateID, by string) (*tetherv1.ToolCall, error) {
	return l.finish(ctx, callID, gateID, func(c *tetherv1.ToolCall, now *timestamppb.Timestamp) {
		c.EndedAt = now
		c.EndedBy = by
		c.CancelAckedAt = now
		c.AcknowledgedBy = by
		c.Resolution = tetherv1.CallResolution_CALL_RESOLUTION_CANCELLED_ACKED
	})
}

func (l *Ledger) finish(ctx context.Context, callID, gateID string, apply func(*tetherv1.ToolCall, *timestamppb.Timestamp)) (*tetherv1.ToolCall, error) {
	if err := id.Check(id.Call, "call_id", callID); err != nil {
		return nil, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	now := timestamppb.New(l.Clock.Now())
	var out *tetherv1.ToolCall
	err := l.Store.Update(ctx, func(tx store.Txn) error {
		if err := l.prefetchFinish(tx, callID); err != nil {
			return err
		}
		c, err := getCall(tx, callID)
		if err != nil {
			return err
		}
		if c.GateId != gateID {
			return fmt.Errorf("%w: call_id %s was begun by another gate, not gate_id %q", ErrWrongGate, callID, gateID)
		}
		if c.State == tetherv1.CallState_CALL_STATE_ENDED {
			out = c // idempotent: a retried end changes nothing
			return nil
		}
		var before *tetherv1.ToolCall
		if l.Observer != nil {
			before = proto.CloneOf(c)
		}
		apply(c, now)
		c.State = tetherv1.CallState_CALL_STATE_ENDED
		out = c
		if err := l.observe(tx, before, c); err != nil {
			return err
		}
		if err := tx.Delete(openCallKey(c.NodeId, c.CallId)); err != nil {
			return err
		}
		if err := tx.Delete(cancelKey(c.GateId, c.CallId)); err != nil {
			return err
		}
		return putCall(tx, c)
	})
	if err == nil {
		l.nodes.forget(callID)
	}
	return out, err
}

func (l *Ledger) observe(tx store.Txn, before, after *tetherv1.ToolCall) error {
	if l.Observer == nil {
		return nil
	}
	return l.Observer.ObserveCall(tx, before, after)
}

// OpenCallsIn lists the calls in flight (or awaiting a cancel ack) on a node.
func OpenCallsIn(tx store.ReadTxn, nodeID string) ([]*tetherv1.ToolCall, error) {
	var ids []string
	p := openCallPrefix(nodeID)
	if err := tx.Scan(p, nil, func(k, _ []byte) error {
		ids = append(ids, string(k[len(p):]))
		return nil
	}); err != nil {
		return nil, err
	}
	out := make([]*tetherv1.ToolCall, 0, len(ids))
	for _, cid := range ids {
		c, err := getCall(tx, cid)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// RequestCancelIn writes a cancel order for an in-flight call, for the
// termination that orders it.
func RequestCancelIn(tx store.Txn, c *tetherv1.ToolCall, terminationID string, now *timestamppb.Timestamp) error {
	if c.State != tetherv1.CallState_CALL_STATE_IN_FLIGHT {
		return nil
	}
	c.State = tetherv1.CallState_CALL_STATE_CANCEL_REQUESTED
	c.CancelRequestedAt = now
	c.TerminationId = terminationID
	if err := putCall(tx, c); err != nil {
		return err
	}
	return tx.Put(cancelKey(c.GateId, c.CallId), nil)
}

// PendingCancels lists the cancel orders a gate has not acknowledged.
func (l *Ledger) PendingCancels(ctx context.Context, gateID string) ([]*tetherv1.ToolCall, error) {
	var out []*tetherv1.ToolCall
	err := l.Store.View(ctx, func(tx store.ReadTxn) error {
		out = nil
		var ids []string
		p := cancelPrefix(gateID)
		if err := tx.Scan(p, nil, func(k, _ []byte) error {
			ids = append(ids, string(k[len(p):]))
			return nil
		}); err != nil {
			return err
		}
		calls, err := callsIn(tx, ids)
		for _, cid := range ids {
			out = append(out, calls[cid])
		}
		return err
	})
	for _, c := range out {
		l.nodes.remember(c)
	}
	return out, err
}

// WatchCancels sends every unacknowledged cancel order for gateID, then
// each new one as it is written, until ctx ends. Orders may repeat (after a
// reconnect); gates treat them idempotently.
func (l *Ledger) WatchCancels(ctx context.Context, gateID string, send func(*tetherv1.ToolCall) error) error {
	if !gatePattern.MatchString(gateID) {
		return fmt.Errorf("%w: gate_id must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument)
	}
	// Watch first, then scan: nothing written between the two is missed.
	w, err := l.Store.Watch(ctx, cancelPrefix(gateID))
	if err != nil {
		return err
	}
	pending, err := l.PendingCancels(ctx, gateID)
	if err != nil {
		return err
	}
	sent := map[string]bool{}
	for _, c := range pending {
		sent[c.CallId] = true
		if err := send(c); err != nil {
			return err
		}
	}
	for batch := range w.Events() {
		// A termination orders a chunk's calls cancelled in one
		// transaction: their calls are read together.
		var ids []string
		for _, ev := range batch {
			if ev.Type != store.EventPut {
				continue
			}
			cid := string(ev.Key[len(cancelPrefix(gateID)):])
			if sent[cid] {
				continue
			}
			sent[cid] = true
			ids = append(ids, cid)
		}
		if len(ids) == 0 {
			continue
		}
		var calls map[string]*tetherv1.ToolCall
		if err := l.Store.View(ctx, func(tx store.ReadTxn) error {
			var err error
			calls, err = callsIn(tx, ids)
			return err
		}); err != nil {
			return err
		}
		for _, cid := range ids {
			l.nodes.remember(calls[cid])
			if err := send(calls[cid]); err != nil {
				return err
			}
		}
	}
	if err := w.Err(); err != nil && ctx.Err() == nil {
		return err
	}
	return ctx.Err()
}

// GetCall returns one call.
func (l *Ledger) GetCall(ctx context.Context, callID string) (*tetherv1.ToolCall, error) {
	var c *tetherv1.ToolCall
	err := l.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		c, err = getCall(tx, callID)
		return err
	})
	return c, err
}

func getCall(tx store.ReadTxn, callID string) (*tetherv1.ToolCall, error) {
	c := &tetherv1.ToolCall{}
	if err := kv.GetProtoOf(tx, callKey(callID), c, ErrCallNotFound, "call_id ", "call", callID); err != nil {
		return nil, err
	}
	return c, nil
}

func putCall(tx store.Txn, c *tetherv1.ToolCall) error {
	v, err := proto.Marshal(c)
	if err != nil {
		return err
	}
	return tx.Put(callKey(c.CallId), v)
}

// GetCallIn reads a call inside a transaction.
func GetCallIn(tx store.ReadTxn, callID string) (*tetherv1.ToolCall, error) {
	return getCall(tx, callID)
}

// PutCallIn writes a call inside a transaction (the termination marks its
// calls and closes the unacknowledged ones in its record).
func PutCallIn(tx store.Txn, c *tetherv1.ToolCall) error { return putCall(tx, c) }

// CountCallsIn counts the node's calls in the ledger (a call refused
// because the node was stopping does not count), stopping at limit.
func CountCallsIn(tx store.ReadTxn, nodeID string, limit int) (int, error) {
	count := 0
	err := tx.Scan([]byte(prefixCall), nil, func(_, v []byte) error {
		c := &tetherv1.ToolCall{}
		if err := proto.Unmarshal(v, c); err != nil {
			return err
		}
		if c.NodeId == nodeID && c.Resolution != tetherv1.CallResolution_CALL_RESOLUTION_REJECTED_DRAINING {
			count++
			if count >= limit {
				return store.ErrStopScan
			}
		}
		return nil
	})
	return count, err
}
