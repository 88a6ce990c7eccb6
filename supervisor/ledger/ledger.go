package ledger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Ledger errors.
var (
	ErrCallNotFound  = fault.New(fault.NotFound, "supervisor: tool call not found")
	ErrWrongGate     = fault.New(fault.Denied, "supervisor: call was reported by another gate")
	ErrTokenRejected = fault.New(fault.Denied, "supervisor: capability token rejected")
	ErrNoCancelOrder = fault.New(fault.Precondition, "supervisor: no cancel order to acknowledge")
	ErrCallClosed    = fault.New(fault.Precondition, "supervisor: call already closed")
	ErrAckTooLate    = fault.New(fault.Precondition, "supervisor: the termination no longer waits for word of this call")
	// ErrSeenNoted answers a tool server's report of a token seen at work
	// (SeenTool): noted on its holder, nothing begun.
	ErrSeenNoted = fault.New(fault.Precondition, "supervisor: a tool server's report that it served the token's holder, not a tool call: noted as the holder seen at work, nothing begun")
)

// SeenTool is the tool of a tool server's report that it served a request
// of a token's holder that is not a tool call (an MCP gateway's ping,
// initialize, listing or stream): Begin with it begins nothing, needs no
// scope, and weighs the holder's credential at work as a refused call's
// is (after its session's end, the node seen alive; after its exit was
// confirmed, a contradiction), answering ErrSeenNoted. A gate serves such
// requests offline, and a rogue that claimed its exit and went on pinging
// its gateway had the record read its exit confirmed by the control plane.
const SeenTool = "tether:seen"

// TokenChecker verifies a capability token for a tool call: signature,
// expiry, the revocation chain and the required scope. It returns the
// holder's node id and the grant id, and both with the error for a token
// that verifies but whose grant is revoked (the ledger keeps that use of a
// dead credential as the holder's activity when its exit was confirmed).
type TokenChecker interface {
	CheckToken(ctx context.Context, token, requiredScope string) (nodeID, grantID string, err error)
	// HolderOf is CheckToken without a scope: the holder of a token seen
	// at work (SeenTool). A token past its expiry that verifies but for
	// it names its holder too, with the expiry as the error.
	HolderOf(ctx context.Context, token string) (nodeID, grantID string, err error)
	// GrantUsableIn checks the grant CheckToken named again, with its
	// chain, inside the transaction that begins the call, so that a
	// revocation acknowledged in between refuses the call.
	GrantUsableIn(tx store.ReadTxn, grantID string, now time.Time) error
}

// Ledger is the tool-call ledger: every call a gate begins, ends, is asked
// to cancel and acknowledges, with the gate that reported it.
type Ledger struct {
	Store  store.Store
	Clock  clock.Clock
	Tokens TokenChecker
	// Observer, when set, is told of every call written (stop rules).
	Observer Observer
	// AckWindow, when set, says whether the termination that ordered a
	// call's cancel (terminationID) still waits for its acknowledgement at
	// now, or returns the error that refuses a late one (the supervisor's
	// CancelAckWindow): an acknowledgement after the termination's
	// timeout would otherwise turn a call the record must call
	// cancel_unacknowledged into a cancelled one.
	// It also returns the termination's acknowledgement deadline when it
	// has one (zero otherwise): a deadline, once set, never changes, so the
	// ledger keeps it (ackDeadlines) and judges the next acknowledgements
	// of that termination's calls in their own transaction, without reading
	// the termination again.
	AckWindow func(tx store.ReadTxn, terminationID string, now time.Time) (deadline time.Time, err error)
	// Fault, when set, is called at "token-checked": Begin checked the
	// call's token, and has not begun its transaction. Tests only.
	Fault func(point string)

	nodes     callNodes    // the node of calls begun or ordered cancelled here (batch.go)
	deadlines ackDeadlines // terminations' acknowledgement deadlines seen here (batch.go)
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
	ObserveCall(tx store.Txn, before, after *ToolCall) error
}

// MaxOpenCallsPerNode bounds the calls one node may have in flight (begun
// and neither ended nor closed by a termination) through one gate. Each is
// work for the termination that stops the node (a cancel order, an
// acknowledgement to wait for, a line in the record), and a drain waits for
// all of them: a tool server that begins calls and never ends them, or an
// agent that keeps a shared gate's upstream busy, would otherwise inflate
// or stall its own termination without bound. The bound is per gate, so a
// rogue tool server holding an agent's token (every token a gate sees) can
// fill the agent's room at its own gate only, not at the others. The next
// begin is refused (tree.ErrLimit) and writes nothing.
const MaxOpenCallsPerNode = 256

// MaxRefusedCallsListedPerNode bounds the calls of one node refused while
// it was stopping that a termination lists in its record (rejected_draining).
// Later refusals of the node in the same termination are refused alike and
// only counted (one key per termination and node, countRefusal; the record's
// RefusedCallsNotListed): a rogue calling in a loop while it drains would
// otherwise grow the record, and every reconciler pass that reads the
// termination's calls, by the gate's rate times the window.
const MaxRefusedCallsListedPerNode = 16

var (
	gatePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
	toolPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
)

// Begin verifies the token and the node's state and records the call as in
// flight, begun by the tool server by (a principal id). A node that is
// draining or aborting, or that a termination covers before its mark
// reaches it (requested on it or an ancestor, or marked down to an
// ancestor: tree.CoveringStopIn), gets
// tree.ErrNodeStopping, and the refused call is recorded
// (rejected_draining) for that termination's record, up to
// MaxRefusedCallsListedPerNode of the node's. A node whose exit was
// confirmed gets ErrNodeExited, and the attempt is kept on the node as
// contradicting evidence. A running node with MaxOpenCallsPerNode calls in
// flight through the gate gets tree.ErrLimit, and nothing is written.
//
// charge, when set, is told whose request this is before Begin writes
// anything: the token's holder node once the token's signature checks out
// and names a grant (valid, or revoked or expired in the store: a dead
// credential's use is its holder's activity), or "" for a request refused
// before that (a bad argument, a token that does not verify, has expired or
// lacks the scope). An error from it refuses the request as it stands,
// writing nothing: the server charges a call to its holder's rate budget
// and the rest to the gate's.
func (l *Ledger) Begin(ctx context.Context, token, tool, gateID, requiredScope, by string, charge func(ctx context.Context, nodeID string) error) (*ToolCall, error) {
	if charge == nil {
		charge = func(context.Context, string) error { return nil }
	}
	refuse := func(err error) error {
		if cerr := charge(ctx, ""); cerr != nil {
			return cerr
		}
		return err
	}
	if !toolPattern.MatchString(tool) {
		return nil, refuse(fmt.Errorf("%w: tool must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument))
	}
	if !gatePattern.MatchString(gateID) {
		return nil, refuse(fmt.Errorf("%w: gate_id must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument))
	}
	if token == "" {
		return nil, refuse(fmt.Errorf("%w: token is required", tree.ErrInvalidArgument))
	}
	if tool == SeenTool {
		return nil, l.seen(ctx, token, gateID, charge)
	}
	if requiredScope == "" {
		requiredScope = "tool:" + tool
	}
	nodeID, grantID, err := l.Tokens.CheckToken(ctx, token, requiredScope)
	// Charged before anything is written: to the holder when the token is
	// its (valid, or a dead credential of a known node, whose use is the
	// holder's activity), else to the gate. A refusal writes nothing.
	if cerr := charge(ctx, nodeID); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		if nodeID != "" {
			// A dead credential of a known node, still in use.
			if nerr := l.noteDeadCredential(ctx, nodeID, tree.ActivityToolCall, fmt.Sprintf("tool %s via gate %s with revoked grant %s", tool, gateID, grantID)); nerr != nil {
				return nil, nerr
			}
		}
		return nil, fmt.Errorf("%w: %w", ErrTokenRejected, err)
	}
	if l.Fault != nil {
		l.Fault("token-checked")
	}
	now := l.Clock.Now()
	call := &ToolCall{
		CallID: id.New(id.Call), NodeID: nodeID, GrantID: grantID, Tool: tool, GateID: gateID,
		State: CallStateInFlight, BegunAt: now, BegunBy: by,
	}
	var stopping error
	var ancestors []string
	unlisted := false // refused, and not kept: the record lists enough of the node's refusals
	err = l.Store.Update(ctx, func(tx store.Txn) error {
		stopping, unlisted = nil, false
		// The node and its count of open calls, fetched together (etcd).
		if err := store.Prefetch(tx, [][]byte{tree.NodeKey(nodeID), openCountKey(nodeID)}, nil); err != nil {
			return err
		}
		node, err := tree.GetNodeIn(tx, nodeID)
		if err != nil {
			return err
		}
		ancestors = node.Ancestors
		// The node's credential at work after its session's end (a call
		// begun, or refused below) is the control plane seeing it alive
		// after that end: a bare claim of its exit is not corroborated by
		// the end (tree.JudgeExit). Written for the first such call only.
		if node.State != tree.NodeStateTerminated && tree.NoteSeenAfterSessionEnd(node, now) {
			if err := tree.PutNodeIn(tx, node); err != nil {
				return err
			}
		}
		if tree.ExitConfirmed(node) && node.State != tree.NodeStateTerminated {
			stopping = tree.ExitedError(node, tree.ActivityToolCall)
			if tree.NoteContradiction(node, tree.ActivityToolCall, fmt.Sprintf("tool %s via gate %s", tool, gateID), now) {
				if err := tree.PutNodeIn(tx, node); err != nil {
					return err
				}
			}
			if node.State == tree.NodeStateExited {
				return nil // no termination to account for a refused call
			}
		}
		// A running node a termination covers before its mark reaches it
		// (requested on the node or an ancestor, or marking top down, in
		// chunks, and past an ancestor: tree.CoveringStopIn) is refused
		// as the marked node would be, from the request on, and the
		// refusal listed in that termination's record.
		terminationID := node.TerminationID
		if node.State == tree.NodeStateRunning && stopping == nil {
			cover, err := tree.CoveringStopIn(tx, node)
			if err != nil {
				return err
			}
			if cover != nil {
				stopping = fmt.Errorf("%w: %s: new tool calls are refused", tree.ErrNodeStopping, cover.Describe(nodeID))
				terminationID = ""
				if cover.State != tree.StateName(tree.NodeStateTerminated) {
					terminationID = cover.TerminationID
				}
			}
		}
		if node.State != tree.NodeStateRunning || stopping != nil {
			// Refuse, and keep the refusal as evidence for the record.
			if stopping == nil { // (an exited node's refusal names its confirmation)
				stopping = fmt.Errorf("%w: node %s is %s: new tool calls are refused", tree.ErrNodeStopping, nodeID, tree.StateName(node.State))
			}
			if terminationID != "" {
				full, err := refusalsListed(tx, terminationID, nodeID)
				if err != nil {
					return err
				}
				if full {
					stopping = fmt.Errorf("%w (not listed: the termination's record already lists the node's first %d refused calls, and counts the rest)", stopping, MaxRefusedCallsListedPerNode)
					unlisted = true
					return countRefusal(tx, terminationID, node)
				}
			}
			call.State = CallStateEnded
			call.Resolution = CallResolutionRejectedDraining
			call.EndedAt = now
			call.TerminationID = terminationID
			if err := putCall(tx, call); err != nil {
				return err
			}
			if err := l.observe(tx, nil, call); err != nil {
				return err
			}
			if terminationID != "" {
				if err := tx.Put(refusedKey(terminationID, nodeID, call.CallID), nil); err != nil {
					return err
				}
				return tx.Put(termCallKey(terminationID, call.CallID), nil)
			}
			return nil
		}
		// The grant again, in this transaction: a revocation acknowledged
		// since CheckToken read it must not see the call begin.
		if err := l.Tokens.GrantUsableIn(tx, grantID, now); err != nil {
			return fmt.Errorf("%w: %w", ErrTokenRejected, err)
		}
		// The bound, the node's count of open calls and the open key.
		if err := OpenIn(tx, call); err != nil {
			return err
		}
		if err := putCall(tx, call); err != nil {
			return err
		}
		if err := l.observe(tx, nil, call); err != nil {
			return err
		}
		// The first call of a node notes it on the node, which a
		// termination's mark reads: it lists the open calls only of the
		// nodes that may have some.
		if err := tree.NoteHoldingIn(tx, node, tree.HoldsCalls); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if call.State != CallStateEnded && !unlisted {
		l.nodes.rememberIn(call, ancestors)
	}
	if stopping != nil {
		if call.State != CallStateEnded {
			return nil, stopping
		}
		return call, stopping
	}
	return call, nil
}

// refusalsListed reports whether the termination already lists
// MaxRefusedCallsListedPerNode refused calls of the node (it reads at most
// that many keys).
func refusalsListed(tx store.ReadTxn, terminationID, nodeID string) (bool, error) {
	listed := 0
	err := tx.Scan(refusedPrefix(terminationID, nodeID), nil, func(_, _ []byte) error {
		listed++
		if listed >= MaxRefusedCallsListedPerNode {
			return store.ErrStopScan
		}
		return nil
	})
	return listed >= MaxRefusedCallsListedPerNode, err
}

// countRefusal counts a refused call of node that the termination does not
// list, in the refusal's transaction: the record shows how many more were
// refused (RecordNode.RefusedCallsNotListed), so a rogue calling in a loop
// while it is stopped cannot hide the volume of its attempts behind the
// bound on the list. One key per termination and node, whatever the
// count; the node notes it once (tree.HoldsRefusalCount), so a record
// reads counts only of the nodes that may have one.
func countRefusal(tx store.Txn, terminationID string, node *tree.Node) error {
	n, err := refusedNotListedIn(tx, terminationID, node.NodeID)
	if err != nil {
		return err
	}
	if err := tx.Put(refusedMoreKey(terminationID, node.NodeID), strconv.AppendUint(nil, n+1, 10)); err != nil {
		return err
	}
	return tree.NoteHoldingIn(tx, node, tree.HoldsRefusalCount)
}

// refusedNotListedIn reads the count of the node's refused calls the
// termination counted past those it lists (0: none).
func refusedNotListedIn(tx store.ReadTxn, terminationID, nodeID string) (uint64, error) {
	v, err := tx.Get(refusedMoreKey(terminationID, nodeID))
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ledger: count of refused calls of %s in termination %s: %w", nodeID, terminationID, err)
	}
	return n, nil
}

// RefusedNotListedOf reads, for each of nodes that may have one
// (tree.HoldsRefusalCount), how many of its refused calls the termination
// counted past those it lists; a node with none has no entry. The keys
// are fetched together (one round trip on etcd).
func RefusedNotListedOf(tx store.ReadTxn, terminationID string, nodes []*tree.Node) (map[string]uint64, error) {
	var keys [][]byte
	for _, n := range nodes {
		if n.Holds.May(tree.HoldsRefusalCount) {
			keys = append(keys, refusedMoreKey(terminationID, n.NodeID))
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if err := store.Prefetch(tx, keys, nil); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, n := range nodes {
		if !n.Holds.May(tree.HoldsRefusalCount) {
			continue
		}
		c, err := refusedNotListedIn(tx, terminationID, n.NodeID)
		if err != nil {
			return nil, err
		}
		if c > 0 {
			out[n.NodeID] = c
		}
	}
	return out, nil
}

// OpenIn counts c, a call of its node about to begin, among the node's
// calls in flight, and puts its open key (Begin, in its transaction): it
// refuses it when the node already has MaxOpenCallsPerNode calls in flight
// through c's gate (openBelowLimit).
func OpenIn(tx store.Txn, c *ToolCall) error {
	if err := openBelowLimit(tx, c.NodeID, c.GateID, c.BegunAt); err != nil {
		return err
	}
	// The open key holds the gate (openBelowLimit counts by it).
	return tx.Put(openCallKey(c.NodeID, c.CallID), []byte(c.GateID))
}

// openBelowLimit refuses a new call of a node through gateID when the node
// already has MaxOpenCallsPerNode calls in flight through that gate, and
// otherwise counts the call about to begin, begun at begunAt, in the
// node's count of open calls (openCountKey: how many open-call keys the
// node has, whatever their gate, and their begin times added up; see
// OpenCount). Below the bound that count answers alone: the node's calls
// through one gate are never more than all of them. At the bound, or for
// a node with no count (its calls were begun by an earlier version), it
// reads the node's open-call keys (their values name the gate; a key
// written before they did names none and is not counted against the
// gate) and writes the count from them.
//
// The count is what keeps a node's begin from reading its open-call
// keys: each ended call leaves its key's deletion in the store until a
// compaction drops it, and a scan of the prefix steps over every one, so
// a node that churned calls made each of its later begins step over all
// its ended ones since, in the store's one writer (thirty-sixth pass).
// The stop rules read it too, for the node's own open calls (OpenCount).
func openBelowLimit(tx store.Txn, nodeID, gateID string, begunAt time.Time) error {
	n, counted, err := OpenCountIn(tx, nodeID)
	if err != nil {
		return err
	}
	ms := BeginMillis(begunAt)
	if counted && n.Calls < MaxOpenCallsPerNode {
		next := OpenCount{Calls: n.Calls + 1, BegunMs: n.BegunMs + ms, Summed: n.Summed}
		if n.Calls == 0 {
			next.BegunMs, next.Summed = ms, true // none open: the sum starts again
		}
		return putOpenCount(tx, nodeID, next)
	}
	open, all := 0, uint64(0)
	err = tx.Scan(openCallPrefix(nodeID), nil, func(_, v []byte) error {
		all++
		if string(v) == gateID {
			open++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if open >= MaxOpenCallsPerNode {
		return fmt.Errorf("%w: node %s already has %d tool calls in flight through gate %s, the maximum per node and gate; a new call is refused until one of them ends (EndCall)", tree.ErrLimit, nodeID, open, gateID)
	}
	// The sum is kept when the count was right, and starts again with a
	// node that has no call open; else it is unknown (the keys hold no
	// begin times) until the node has none open again (CloseOpenIn).
	next := OpenCount{Calls: all + 1, BegunMs: ms, Summed: all == 0}
	if counted && n.Summed && n.Calls == all {
		next.BegunMs, next.Summed = n.BegunMs+ms, true
	}
	return putOpenCount(tx, nodeID, next)
}

// OpenCount is a node's count of open calls (calls/opencount/<node>):
// how many open-call keys it has, and, when Summed, their calls' begin
// times added up (BeginMillis, modulo 2^64). It is stored as a uvarint,
// followed by a uvarint of the sum when the sum is known: the count
// alone is what the thirty-sixth pass's first version wrote, and what a
// node whose calls an earlier version began gets when its keys are
// counted (their begin times are in the calls, not the keys), until it
// has no call open again.
type OpenCount struct {
	Calls   uint64
	BegunMs uint64
	Summed  bool
}

// BeginMillis is a call's begin time as the count adds it up: Unix
// milliseconds, 0 before 1970 (as the stop rules' records add theirs).
func BeginMillis(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(max(t.UnixMilli(), 0))
}

// OpenCountIn reads the node's count of open calls, and whether it has
// one (a node whose calls an earlier version began has none, or one that
// does not count them: its open-call keys are what counts).
func OpenCountIn(tx store.ReadTxn, nodeID string) (OpenCount, bool, error) {
	v, err := tx.Get(openCountKey(nodeID))
	if errors.Is(err, store.ErrNotFound) {
		return OpenCount{}, false, nil
	}
	if err != nil {
		return OpenCount{}, false, err
	}
	n, size := binary.Uvarint(v)
	if size <= 0 {
		return OpenCount{}, false, nil // not readable: counted again from the keys
	}
	if size == len(v) {
		return OpenCount{Calls: n}, true, nil
	}
	sum, more := binary.Uvarint(v[size:])
	if more <= 0 || size+more != len(v) {
		return OpenCount{}, false, nil
	}
	return OpenCount{Calls: n, BegunMs: sum, Summed: true}, true, nil
}

func putOpenCount(tx store.Txn, nodeID string, n OpenCount) error {
	v := binary.AppendUvarint(nil, n.Calls)
	if n.Summed {
		v = binary.AppendUvarint(v, n.BegunMs)
	}
	return tx.Put(openCountKey(nodeID), v)
}

// CloseOpenIn takes c, a call of its node, out of the node's calls in
// flight: its open-call key is deleted and, when it was there, the node's
// count of open calls lowered and c's begin time taken out of their sum
// (openBelowLimit). Every path that closes a call goes through it (the
// ledger's end, the termination's close of a call never acknowledged),
// so the count never reads fewer calls than the node has.
func CloseOpenIn(tx store.Txn, c *ToolCall) error {
	key := openCallKey(c.NodeID, c.CallID)
	if _, err := tx.Get(key); errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if err := tx.Delete(key); err != nil {
		return err
	}
	n, counted, err := OpenCountIn(tx, c.NodeID)
	if err != nil || !counted {
		return err
	}
	next := OpenCount{Calls: n.Calls - min(n.Calls, 1), BegunMs: n.BegunMs - BeginMillis(c.BegunAt), Summed: n.Summed}
	if next.Calls == 0 {
		next.BegunMs, next.Summed = 0, true
	}
	return putOpenCount(tx, c.NodeID, next)
}

// End records the end of a call (completed or failed), reported by the
// tool server by through its gate gateID (the gate that began it). An end
// is not an acknowledgement, even of a call a termination had asked to
// cancel: the gate says how the call ended (a gate that never saw the
// order, or let the tool finish, reports completed, and the side effect
// happened), and the record says so; only CancelAck acknowledges a cancel.
func (l *Ledger) End(ctx context.Context, callID, gateID, by string, failed bool, message string) (*ToolCall, error) {
	// An end of a call with a cancel order is judged in the transaction
	// (finish's lateness check): rare, and not worth a read before every
	// EndCall, the hot path of every tool call.
	return l.finish(ctx, callID, gateID, by, true, func(c *ToolCall, now time.Time) error {
		c.EndedAt = now
		c.EndedBy = by
		switch {
		case failed:
			c.Resolution = CallResolutionFailed
		default:
			c.Resolution = CallResolutionCompleted
		}
		c.Error = kv.ClipUTF8(message, 512)
		return nil
	})
}

// noteDeadCredential keeps a refused call with a revoked grant of a node
// whose exit was confirmed as contradicting evidence on the node: the
// node's credential is dead, but something still holds and uses it, so its
// exit is not confirmed by the control plane's observation (tree.JudgeExit
// sees the contradiction). A node whose session's end is the last the
// control plane saw of it is noted as seen (its credential is at work
// after that end, so a bare claim of its exit is not corroborated by it).
// A node otherwise not claimed to have exited, or already terminated (its
// record written), is left alone.
//
// Most refusals of a revoked credential concern no such node, and a rogue
// may send them as fast as its gate's budget allows: they are judged on a
// read, and only one that may add evidence takes a write transaction.
func (l *Ledger) noteDeadCredential(ctx context.Context, nodeID, kind, detail string) error {
	now := l.Clock.Now()
	// kept reports whether the node changed: it takes the contradiction
	// (and adds it), or the use is the first sign of its life after its
	// session's end (tree.NoteSeenAfterSessionEnd, as in Begin).
	kept := func(tx store.ReadTxn) (*tree.Node, bool, error) {
		node, err := tree.GetNodeIn(tx, nodeID)
		if errors.Is(err, tree.ErrNodeNotFound) {
			return nil, false, nil
		}
		if err != nil || node.State == tree.NodeStateTerminated {
			return nil, false, err
		}
		changed := tree.NoteSeenAfterSessionEnd(node, now)
		if tree.ExitConfirmed(node) && tree.NoteContradiction(node, kind, detail, now) {
			changed = true
		}
		return node, changed, nil
	}
	may, err := store.Read(ctx, l.Store, func(tx store.ReadTxn) (bool, error) {
		_, ok, err := kept(tx)
		return ok, err
	})
	if err != nil || !may {
		return err
	}
	return l.Store.Update(ctx, func(tx store.Txn) error {
		node, ok, err := kept(tx)
		if err != nil || !ok {
			return err
		}
		return tree.PutNodeIn(tx, node)
	})
}

// seen is Begin's answer to a report of a token seen at work (SeenTool):
// charged as a call is (to the holder's lineage, or the gate's refusals
// for a token that does not verify), and kept on the holder as a dead
// credential's use is (noteDeadCredential), on a read unless it adds
// evidence. It begins nothing and answers ErrSeenNoted, or the token's
// refusal.
func (l *Ledger) seen(ctx context.Context, token, gateID string, charge func(ctx context.Context, nodeID string) error) error {
	nodeID, grantID, err := l.Tokens.HolderOf(ctx, token)
	if cerr := charge(ctx, nodeID); cerr != nil {
		return cerr
	}
	if nodeID == "" {
		return fmt.Errorf("%w: %w", ErrTokenRejected, err)
	}
	detail := "a request served by gate " + gateID
	if err != nil {
		detail += " with dead grant " + grantID
	}
	if nerr := l.noteDeadCredential(ctx, nodeID, tree.ActivityRequest, detail); nerr != nil {
		return nerr
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTokenRejected, err)
	}
	return ErrSeenNoted
}

// CancelAck records that the gate cancelled the call and its handler
// returned, reported by the tool server by through gateID. It answers a
// cancel order: a call nobody asked to cancel (a drain orders none) is
// refused (ErrNoCancelOrder) and stays in flight, so the record never says
// a call was cancelled when no termination cancelled it.
func (l *Ledger) CancelAck(ctx context.Context, callID, gateID, by string) (*ToolCall, error) {
	// Most acknowledgements are of a termination whose deadline this
	// process already knows: judged in the acknowledgement's transaction
	// (one read and a commit). The first of a termination here reads the
	// call and its termination together (ackInTime), which keeps the
	// deadline, and tries again; a take-over may move the call to another
	// termination meanwhile, hence a few tries. A termination with no
	// deadline yet (still marking its subtree) is judged by that read,
	// and the acknowledgement committed without another.
	//
	// While a termination read here had no deadline yet (a large subtree
	// whose mark is still under way: its cancel orders go out chunk by
	// chunk, and their acknowledgements arrive before its last chunk sets
	// the deadline), the acknowledgements read their call and its
	// termination first: a first attempt would only stop on finding no
	// deadline, and the call be read a third time.
	if l.AckWindow != nil && l.deadlines.anyMarking(l.Clock.Now()) {
		if err := l.ackInTime(ctx, callID, gateID); err != nil {
			return nil, err
		}
		return l.finish(ctx, callID, gateID, by, false, l.acknowledge(callID, by, false))
	}
	for range 3 {
		out, err := l.finish(ctx, callID, gateID, by, false, l.acknowledge(callID, by, true))
		var unknown deadlineUnknown
		if !errors.As(err, &unknown) {
			return out, err
		}
		if err := l.ackInTime(ctx, callID, gateID); err != nil {
			return nil, err
		}
		if _, kept := l.deadlines.of(string(unknown)); !kept {
			return l.finish(ctx, callID, gateID, by, false, l.acknowledge(callID, by, false))
		}
	}
	if err := l.ackInTime(ctx, callID, gateID); err != nil {
		return nil, err
	}
	return l.finish(ctx, callID, gateID, by, false, l.acknowledge(callID, by, false))
}

// KeepAckDeadline tells the ledger the acknowledgement deadline a
// termination committed as it entered aborting (the supervisor, after the
// commit): a deadline never changes once set, so the acknowledgements of
// its calls are judged on it in their own transaction from the first one
// on, without reading the termination (as after ackInTime's read), and a
// read-first path taken while the termination had no deadline ends.
func (l *Ledger) KeepAckDeadline(terminationID string, deadline time.Time) {
	if deadline.IsZero() {
		return
	}
	l.deadlines.keep(terminationID, deadline)
	l.deadlines.unmark(terminationID)
}

// deadlineUnknown: the acknowledgement deadline of the call's termination
// (this id) is not known here yet (ackInTime reads it).
type deadlineUnknown string

func (d deadlineUnknown) Error() string {
	return "ledger: the acknowledgement deadline of termination " + string(d) + " is not known here"
}

// acknowledge is CancelAck's change to the call. known: judge the
// acknowledgement against the deadline this process keeps for the call's
// termination, and return deadlineUnknown when it keeps none.
//
// A known deadline answers what ackInTime's read of the termination would:
// an acknowledgement at or after it is refused (the termination is past
// aborting, or goes on at its next pass); one before it is in time, since a
// termination leaves aborting before its deadline only once every cancel
// it ordered was acknowledged or ended, and then this call is ended and the
// transaction refuses the acknowledgement in its own words. (A take-over
// moves the call to the other termination, whose deadline is then judged.)
func (l *Ledger) acknowledge(callID, by string, known bool) func(*ToolCall, time.Time) error {
	return func(c *ToolCall, now time.Time) error {
		if c.State != CallStateCancelRequested {
			return fmt.Errorf("%w: call_id %s was not asked to cancel (no termination ordered it); report how it ended with EndCall", ErrNoCancelOrder, callID)
		}
		if known && l.AckWindow != nil && c.TerminationID != "" {
			deadline, ok := l.deadlines.of(c.TerminationID)
			if !ok {
				return deadlineUnknown(c.TerminationID)
			}
			if !now.Before(deadline) {
				return fmt.Errorf("%w: call_id %s: %v", ErrAckTooLate, callID, AckDeadlinePassed(deadline))
			}
		}
		c.EndedAt = now
		c.EndedBy = by
		c.CancelAckedAt = now
		c.AcknowledgedBy = by
		c.Resolution = CallResolutionCancelledAcked
		return nil
	}
}

// AckDeadlinePassed is the refusal of an acknowledgement at or after its
// termination's acknowledgement deadline.
func AckDeadlinePassed(deadline time.Time) error {
	return fmt.Errorf("the termination's acknowledgement deadline %s has passed; the record lists the call cancel_unacknowledged", deadline.UTC().Format(time.RFC3339Nano))
}

// ackInTime refuses an acknowledgement the call's termination no longer
// waits for (AckWindow): past the deadline the record says
// cancel_unacknowledged. It reads before the acknowledgement's own
// transaction, so the termination, rewritten by each reconciler pass, is
// not part of the commit's conflicts: the acknowledgement's time is taken
// first, and a termination leaves aborting before its deadline only once
// every cancel it ordered was acknowledged or ended, so what this read
// allowed was in time. Whatever this read cannot judge (an unknown call,
// another gate's, one with no order) finish refuses in its own words.
// It keeps the termination's deadline, once it has one, for the next
// acknowledgements (acknowledge).
func (l *Ledger) ackInTime(ctx context.Context, callID, gateID string) error {
	if l.AckWindow == nil || id.Check(id.Call, "call_id", callID) != nil {
		return nil
	}
	now := l.Clock.Now()
	return l.Store.View(ctx, func(tx store.ReadTxn) error {
		c, err := getCall(tx, callID)
		if err != nil || c.GateID != gateID || c.State != CallStateCancelRequested || c.TerminationID == "" {
			return nil
		}
		deadline, err := l.AckWindow(tx, c.TerminationID, now)
		if deadline.IsZero() && err == nil {
			l.deadlines.noteMarking(c.TerminationID, now)
		} else {
			l.deadlines.unmark(c.TerminationID)
		}
		if !deadline.IsZero() {
			l.deadlines.keep(c.TerminationID, deadline)
		}
		if err != nil {
			return fmt.Errorf("%w: call_id %s: %v", ErrAckTooLate, callID, err)
		}
		return nil
	})
}

// finish ends a call with apply. lateEnd: an end reported after the
// call's termination stopped waiting for word of it (AckWindow) is refused
// — it would dodge the cancel_unacknowledged mark as a late CancelAck
// would; read in the transaction, for the few calls with a cancel order.
func (l *Ledger) finish(ctx context.Context, callID, gateID, by string, lateEnd bool, apply func(*ToolCall, time.Time) error) (*ToolCall, error) {
	if err := id.Check(id.Call, "call_id", callID); err != nil {
		return nil, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	now := l.Clock.Now()
	var out *ToolCall
	err := l.Store.Update(ctx, func(tx store.Txn) error {
		if err := l.prefetchFinish(tx, callID, lateEnd); err != nil {
			return err
		}
		c, err := getCall(tx, callID)
		if err != nil {
			return err
		}
		if c.GateID != gateID {
			return fmt.Errorf("%w: call_id %s was begun by another gate, not gate_id %q", ErrWrongGate, callID, gateID)
		}
		if c.State == CallStateEnded {
			// The gate's retry changes nothing; a report of a call a
			// termination closed is refused (reportOnEnded).
			if err := reportOnEnded(c, by); err != nil {
				return err
			}
			out = c
			return nil
		}
		if lateEnd && l.AckWindow != nil && c.State == CallStateCancelRequested && c.TerminationID != "" {
			if _, err := l.AckWindow(tx, c.TerminationID, now); err != nil {
				return fmt.Errorf("%w: call_id %s: %v", ErrAckTooLate, callID, err)
			}
		}
		var before *ToolCall
		if l.Observer != nil {
			copied := *c // (no slice or map: a copy is a deep copy)
			before = &copied
		}
		if err := apply(c, now); err != nil {
			return err
		}
		if c.State == CallStateInFlight && c.TerminationID == "" {
			if err := accountToCoveringStop(tx, c); err != nil {
				return err
			}
		}
		if c.TerminationID != "" {
			// Noted by node until the termination's record lists it: a
			// stop requested before the call ended that marks the node
			// (or takes it over) first accounts for it (MoveEndedIn).
			if err := tx.Put(endedOnKey(c.NodeID, c.CallID), []byte(c.TerminationID)); err != nil {
				return err
			}
		}
		c.State = CallStateEnded
		out = c
		if err := l.observe(tx, before, c); err != nil {
			return err
		}
		if err := CloseOpenIn(tx, c); err != nil {
			return err
		}
		if err := tx.Delete(cancelKey(c.GateID, c.CallID)); err != nil {
			return err
		}
		return putCall(tx, c)
	})
	if err == nil {
		l.nodes.forget(callID)
	}
	return out, err
}

// accountToCoveringStop puts a call that ends while a termination covers
// its node before its mark reaches it (requested on the node or an
// ancestor, or marked down to an ancestor: tree.CoveringStopIn) on that
// termination's account, as the mark does with the calls it finds open:
// the call was in flight when the stop was requested, and the record lists
// every such call and how it ended, whether it ended before the mark or
// after. A node a termination has marked had its open calls put on its
// account by the mark.
func accountToCoveringStop(tx store.Txn, c *ToolCall) error {
	node, err := tree.GetNodeIn(tx, c.NodeID)
	if errors.Is(err, tree.ErrNodeNotFound) {
		return nil
	}
	if err != nil || node.TerminationID != "" {
		return err
	}
	cover, err := tree.CoveringStopIn(tx, node)
	if err != nil || cover == nil || cover.TerminationID == "" || cover.State == tree.StateName(tree.NodeStateTerminated) {
		return err
	}
	c.TerminationID = cover.TerminationID
	// The call's end is noted by node (finish): the node says it may
	// have such notes, for the mark that reads them.
	if err := tree.NoteHoldingIn(tx, node, tree.HoldsEndedCalls); err != nil {
		return err
	}
	return tx.Put(termCallKey(cover.TerminationID, c.CallID), nil)
}

// ObserveIn tells the ledger's Observer, in tx, of a call written outside
// the ledger: a termination closing a call it waited for in vain
// (cancel_unacknowledged). The stop rules' counters count the call open
// until its end; one the Observer never heard end would count at its
// node's ancestors forever. A nil ledger, or one without an Observer,
// does nothing.
func (l *Ledger) ObserveIn(tx store.Txn, before, after *ToolCall) error {
	if l == nil {
		return nil
	}
	return l.observe(tx, before, after)
}

func (l *Ledger) observe(tx store.Txn, before, after *ToolCall) error {
	if l.Observer == nil {
		return nil
	}
	return l.Observer.ObserveCall(tx, before, after)
}

// OpenCallsIn lists the calls in flight (or awaiting a cancel ack) on a node.
func OpenCallsIn(tx store.ReadTxn, nodeID string) ([]*ToolCall, error) {
	ids, err := kv.AppendIDs(tx, nil, openCallPrefix(nodeID))
	if err != nil {
		return nil, err
	}
	out := make([]*ToolCall, 0, len(ids))
	for _, cid := range ids {
		c, err := getCall(tx, cid)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// FirstOpenCallIn returns the first call in flight (or awaiting a cancel
// ack) on a node, or nil: one scan, stopped at the first.
func FirstOpenCallIn(tx store.ReadTxn, nodeID string) (*ToolCall, error) {
	ids, _, err := store.IDsAfter(tx, openCallPrefix(nodeID), "", 1)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	return getCall(tx, ids[0])
}

// MoveEndedIn puts c, a call of the node that ended on another
// termination's account and is in no record yet (OpenAndEndedCallsOf), on
// termination to's account, in the transaction in which to marks the node
// or takes it over. The mark calls it for each such call that ended at or
// after to's request: the call was in flight when to was requested, and to
// is the stop that accounts for the node (the other, which was requested
// and had not marked the node, or that to takes the node over from, leaves
// it to to). A call that ended before to's request stays where it is: it
// ended under the other stop alone.
func MoveEndedIn(tx store.Txn, c *ToolCall, to string) error {
	if c.State != CallStateEnded || c.TerminationID == "" || c.TerminationID == to {
		return nil
	}
	if err := tx.Delete(termCallKey(c.TerminationID, c.CallID)); err != nil {
		return err
	}
	c.TerminationID = to
	if err := putCall(tx, c); err != nil {
		return err
	}
	if err := tx.Put(termCallKey(to, c.CallID), nil); err != nil {
		return err
	}
	return tx.Put(endedOnKey(c.NodeID, c.CallID), []byte(to))
}

// ForgetEndedIn drops the note that call c ended on a termination's
// account, in the transaction in which that termination's record lists it:
// no mark moves it after that.
func ForgetEndedIn(tx store.Txn, c *ToolCall) error {
	if c.State != CallStateEnded || c.Resolution == CallResolutionRejectedDraining {
		return nil // never noted
	}
	return tx.Delete(endedOnKey(c.NodeID, c.CallID))
}

// RequestCancelIn writes a cancel order for an in-flight call, for the
// termination that orders it.
func RequestCancelIn(tx store.Txn, c *ToolCall, terminationID string, now time.Time) error {
	if c.State != CallStateInFlight {
		return nil
	}
	c.State = CallStateCancelRequested
	c.CancelRequestedAt = now
	c.TerminationID = terminationID
	if err := putCall(tx, c); err != nil {
		return err
	}
	return tx.Put(cancelKey(c.GateID, c.CallID), nil)
}

// PendingCancels lists the cancel orders a gate has not acknowledged.
func (l *Ledger) PendingCancels(ctx context.Context, gateID string) ([]*ToolCall, error) {
	var out []*ToolCall
	err := l.Store.View(ctx, func(tx store.ReadTxn) error {
		out = nil
		ids, err := kv.AppendIDs(tx, nil, cancelPrefix(gateID))
		if err != nil {
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
func (l *Ledger) WatchCancels(ctx context.Context, gateID string, send func(*ToolCall) error) error {
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
	// scanned holds the orders the scan sent that the watch may deliver
	// again (written between the watch's start and the scan); each leaves
	// it when its key's put or delete arrives, so it never outgrows the
	// orders pending at the scan (bounded by the gate's calls in flight),
	// however long the stream lives.
	scanned := make(map[string]bool, len(pending))
	for _, c := range pending {
		scanned[c.CallID] = true
		if err := send(c); err != nil {
			return err
		}
	}
	for batch := range w.Events() {
		// A termination orders a chunk's calls cancelled in one
		// transaction: their calls are read together.
		var ids []string
		for _, ev := range batch {
			cid := string(ev.Key[len(cancelPrefix(gateID)):])
			if scanned[cid] {
				delete(scanned, cid)
				continue
			}
			if ev.Type == store.EventPut {
				ids = append(ids, cid)
			}
		}
		if len(ids) == 0 {
			continue
		}
		calls, err := store.Read(ctx, l.Store, func(tx store.ReadTxn) (map[string]*ToolCall, error) { return callsIn(tx, ids) })
		if err != nil {
			return err
		}
		for _, cid := range ids {
			c := calls[cid]
			// A call that ended before its order was read needs none: its
			// gate no longer holds it, and would keep the order of a
			// call it will never see again.
			if c.State != CallStateCancelRequested {
				continue
			}
			l.nodes.remember(c)
			if err := send(c); err != nil {
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
func (l *Ledger) GetCall(ctx context.Context, callID string) (*ToolCall, error) {
	return store.Read(ctx, l.Store, func(tx store.ReadTxn) (*ToolCall, error) { return getCall(tx, callID) })
}

func getCall(tx store.ReadTxn, callID string) (*ToolCall, error) {
	c := &ToolCall{}
	if err := kv.GetOf(tx, callKey(callID), func(b []byte) error { return UnmarshalCall(b, c) }, ErrCallNotFound, "call_id ", "call", callID); err != nil {
		return nil, err
	}
	return c, nil
}

func putCall(tx store.Txn, c *ToolCall) error {
	v, err := encodeCall(c)
	if err != nil {
		return err
	}
	return tx.Put(callKey(c.CallID), v)
}

// GetCallIn reads a call inside a transaction.
func GetCallIn(tx store.ReadTxn, callID string) (*ToolCall, error) {
	return getCall(tx, callID)
}

// PutCallIn writes a call inside a transaction (the termination marks its
// calls and closes the unacknowledged ones in its record).
func PutCallIn(tx store.Txn, c *ToolCall) error { return putCall(tx, c) }
