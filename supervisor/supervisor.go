package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Termination errors.
var (
	ErrTerminationNotFound = fault.New(fault.NotFound, "supervisor: termination not found")
	ErrAlreadyStopping     = fault.New(fault.Precondition, "supervisor: node is already stopping")
	ErrRecordNotFound      = fault.New(fault.NotFound, "supervisor: record not found")
)

// GrantRevoker is the capability tree as the supervisor needs it.
type GrantRevoker interface {
	// RevokeHeldBy revokes every active grant held by the nodes, one
	// tombstone per top grant (a grant whose parent is not itself being
	// revoked), and returns every grant they hold (no outcomes), in node
	// order. Idempotent.
	RevokeHeldBy(ctx context.Context, nodeIDs []string, by, reason string) ([]HeldGrant, error)
	// HeldBy reports every grant held by the nodes and its outcome
	// (OutcomeRevoked, OutcomeExpired, or "" while active).
	HeldBy(ctx context.Context, nodeIDs []string) ([]HeldGrant, error)
	// Outcomes reports the outcome of each grant of held (as RevokeHeldBy
	// listed them), as HeldBy would.
	Outcomes(ctx context.Context, held []HeldGrant) ([]HeldGrant, error)
}

// HeldGrant is a grant as the record lists it. The capability layer owns
// the type, so that grantstore reports it without importing the supervisor.
type HeldGrant = capability.HeldGrant

// LeaseCanceller is the lease module as the supervisor needs it.
type LeaseCanceller interface {
	// CancelHeldBy requests cancellation of every open lease held by the
	// holders. Idempotent.
	CancelHeldBy(ctx context.Context, holders []string, reason string) error
	// FinalizeHeldBy reconciles those leases explicitly (cancelled when the
	// worker acknowledged, expired when the lease ran out, otherwise a
	// bounded unresolved) and reports each, those of page only (more:
	// leases of jobs after them remain). Idempotent.
	FinalizeHeldBy(ctx context.Context, holders []string, reason string, page LeasePage) (leases []RecordLease, more bool, err error)
}

// LeasePage asks for part of the leases some holders hold, in order of
// job id: those of the jobs after After, at most Limit of them (0: all).
// A record lists a chunk's leases page by page, each page read after the
// last lease the record wrote, so that the work of a chunk whose members
// hold many leases grows with the leases, not with leases times pages.
type LeasePage struct {
	After string
	Limit int
	// StopRequestedAt is the termination's request: a lease whose holder
	// acknowledged a cancel before it has the cancel's requester read
	// (RecordLease.CancelRequestedBy).
	StopRequestedAt time.Time
}

// Supervisor terminates subtrees and writes reconciliation records.
type Supervisor struct {
	Store      store.Store
	Clock      clock.Clock
	Tree       *tree.Tree
	Ledger     *ledger.Ledger
	Privileges *privilege.Privileges
	Grants     GrantRevoker   // nil: no grants to revoke
	Leases     LeaseCanceller // nil: no leases to cancel
	// Handover lists the leases a rollout batch leaves open for its
	// replacements (see batch.go); nil: rollout batches list none.
	Handover LeaseHandover
	Sink     RecordSink // nil: records stay in the store only
	// CallCount returns the number of tool calls the ledger holds begun by
	// a node (refusals while it stopped not counted), from a counter kept
	// in the ledger's transactions (the stop rules'), for a proposal's
	// calls>=N condition. nil: such a condition is never auto-approved (it
	// waits for an operator), since counting without it reads the whole
	// ledger.
	CallCount func(tx store.ReadTxn, nodeID string) (int64, error)
	// HookTimeout bounds, in total, a termination's privilege revocations
	// (revoke webhooks and handlers); zero means DefaultHookTimeout.
	HookTimeout time.Duration
	// ChunkSize bounds the nodes (or tool calls) one transaction of a
	// termination handles (chunks.go); zero means DefaultChunkSize.
	ChunkSize int
	// LeasePageBytes bounds the encoded leases one part of a record
	// carries, and so the grants, and the held index one transaction of
	// the revocation writes (chunks.go); zero means DefaultLeasePageBytes.
	LeasePageBytes int
	// ChunkFault, when set, is called after each chunk of a termination
	// commits, with the step ("mark", "escalate", "cancel", "revoke",
	// "record") and how many chunks of it this process has committed.
	// Tests only (the kill -9 tests stop the process there).
	ChunkFault func(step string, n int)
	// Reconciled, when set, is called as each reconcile of a termination
	// begins, with its id. Tests only (they count the reconciles a change
	// costs).
	Reconciled func(terminationID string)
	Log        *slog.Logger

	chunks chunkCounter
	// ended remembers the calls the reconciler has seen ended, which it
	// need not read again (reconciler.go).
	ended endedCalls
	// calls keeps the open calls of the terminations waiting for them,
	// while the reconcile loop's watches run (callcache.go).
	calls callCache
	// nodes keeps the nodes the marks wrote until their records
	// terminate them, while the reconcile loop's watches run
	// (nodecache.go).
	nodes nodeCache
	// childNotesDistrusted: a mark found a node that may have children
	// whose entry in its parent's list said it had none (written beside
	// a binary without the child notes); from then on the marks' walks
	// read the child list of every node they list (planMark).
	childNotesDistrusted atomic.Bool
	// watches follows the terminations for the streams that watch them
	// (Watch, watch.go): one store watch for all of them.
	watches terminationWatches

	loopOnce   sync.Once
	reconciler *reconcile.Loop
	// kicks decides which terminations a committed change kicks
	// (reconciler.go).
	kicks terminationKicks
}

// Defaults for a termination's windows when the request leaves them empty.
const (
	DefaultDrainWindow      = 30 * time.Second
	DefaultCancelAckTimeout = 10 * time.Second
	DefaultConfirmTimeout   = 30 * time.Second
	// MinAgentCancelAckTimeout is the least acknowledgement window of an
	// agent's stop of its subtree (TerminateIn): the time the gates, not
	// the workload, have to answer its cancel orders. An agent's own stop
	// proposal takes DefaultCancelAckTimeout whatever it asks.
	MinAgentCancelAckTimeout = DefaultCancelAckTimeout
	// DefaultHookTimeout bounds a termination's privilege revocations.
	DefaultHookTimeout = 10 * time.Second
)

func (s *Supervisor) hookTimeout() time.Duration {
	if s.HookTimeout > 0 {
		return s.HookTimeout
	}
	return DefaultHookTimeout
}

// TerminateRequest is an authenticated request to terminate a subtree.
type TerminateRequest struct {
	NodeID                                        string
	Mode                                          Mode
	DrainWindow, CancelAckTimeout, ConfirmTimeout time.Duration
	Reason                                        string
	RequestedBy                                   string
	// Authorize is called inside the transaction with the target node
	// (with each root, when there are several); a root that does not
	// exist is put to it as a bare stand-in first (tree.GetAuthorizedIn),
	// so a caller it refuses is refused alike whether the node exists.
	Authorize func(target *tree.Node) error
	// RequesterNodeID is the requesting agent's node ("" for operators).
	// An agent that is itself being stopped may not start a termination:
	// inside a stopping subtree it is the workload, not an authority.
	RequesterNodeID string
	// Roots, when set, are several subtree roots stopped by this one
	// termination (one record): a rollout batch. NodeID is then ignored.
	Roots []string
	// RolloutID names the rollout the termination is a batch of.
	RolloutID string
	// LeaseHandover leaves the job leases of the subtrees open for the
	// rollout to reassign to replacements, instead of cancelling them.
	LeaseHandover bool
}

// Terminate persists a termination request; the reconciler does the rest.
// The request is durable when Terminate returns.
func (s *Supervisor) Terminate(ctx context.Context, req TerminateRequest) (Termination, error) {
	var t Termination
	err := s.Store.Update(ctx, func(tx store.Txn) error {
		var err error
		t, err = s.TerminateIn(tx, req)
		return err
	})
	if err != nil {
		return Termination{}, err
	}
	s.KickRequested(t)
	return t, nil
}

// TerminateIn writes a termination request inside the caller's
// transaction, so that the caller can persist its own state with it (a
// rollout writes its batch and the batch's termination together). The
// caller must KickRequested the termination once the transaction has
// committed.
func (s *Supervisor) TerminateIn(tx store.Txn, req TerminateRequest) (Termination, error) {
	roots := req.Roots
	if len(roots) == 0 {
		roots = []string{req.NodeID}
	}
	if len(roots) > MaxTerminationRoots {
		return Termination{}, fmt.Errorf("%w: at most %d subtree roots per termination", tree.ErrInvalidArgument, MaxTerminationRoots)
	}
	for _, r := range roots {
		if err := id.Check(id.Node, "node_id", r); err != nil {
			return Termination{}, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
		}
	}
	t, err := NewTermination(id.New(id.Termination), roots[0], req.Mode, req.DrainWindow, req.CancelAckTimeout, req.ConfirmTimeout, req.Reason, req.RequestedBy, s.Clock.Now())
	if err != nil {
		return Termination{}, err
	}
	if len(roots) > 1 {
		t.Roots = append([]string(nil), roots...)
	}
	t.RolloutID, t.LeaseHandover = req.RolloutID, req.LeaseHandover
	t.HookTimeout = s.hookTimeout()
	if req.RequesterNodeID != "" {
		requester, err := tree.GetNodeIn(tx, req.RequesterNodeID)
		if err != nil {
			return Termination{}, err
		}
		if requester.State != tree.NodeStateRunning {
			return Termination{}, fmt.Errorf("%w: the requesting agent %s is %s itself (termination %s); it cannot start a termination", ErrAlreadyStopping, requester.NodeID, tree.StateName(requester.State), requester.TerminationID)
		}
		// Nor may one a stop covers before its mark reaches it: it is
		// that stop's workload already, not an authority over part of it.
		cover, err := tree.CoveringStopIn(tx, requester)
		if err != nil {
			return Termination{}, err
		}
		if cover != nil {
			return Termination{}, fmt.Errorf("%w: the requesting agent is being stopped: %s; it cannot start a termination", ErrAlreadyStopping, cover.Describe(requester.NodeID))
		}
		t.RequesterLineage = append(append([]string(nil), requester.Ancestors...), requester.NodeID)
		// The agent orders the cancels; the gate's time to answer them is
		// not the agent's to take away. With no acknowledgement window
		// its abort's deadline was the order's own instant: every
		// acknowledgement, and every report that a call completed, was
		// refused however soon the gate sent it, and the record closed the
		// calls cancel_unacknowledged, the gate's silence where it had
		// answered at once (a payment that went through read as a cancel
		// nobody confirmed, ahead of the operator's stop, which then found
		// the node terminated by that record: rogue46h test
		// TestRogue46HAnOwnZeroWindowAbortDoesNotSilenceTheGate). Its
		// stop now waits for them at least as long as its own stop
		// proposal would (the termination shows the window it waits).
		t.CancelAckTimeout = max(t.CancelAckTimeout, MinAgentCancelAckTimeout)
	}
	seen := make(map[string]bool, len(roots))
	for _, r := range roots {
		if seen[r] {
			return Termination{}, fmt.Errorf("%w: node_id %s is named twice", tree.ErrInvalidArgument, r)
		}
		seen[r] = true
		target, err := tree.GetAuthorizedIn(tx, r, req.Authorize)
		if err != nil {
			return Termination{}, err
		}
		if err := mayStop(tx, t, target); err != nil {
			return Termination{}, err
		}
		if t.Tree == "" {
			t.Tree = target.NodeID
			if len(target.Ancestors) > 0 {
				t.Tree = target.Ancestors[0]
			}
		}
	}
	return t, putRequested(tx, t)
}

// putRequested writes a requested termination and, on each of its roots,
// the note that it is requested (tree.NoteStopRequestedIn): from this
// transaction on, each root's subtree is covered by it, however long the
// reconciler takes to begin the mark, whose first chunk removes the
// notes as it marks the roots.
func putRequested(tx store.Txn, t Termination) error {
	for _, r := range t.RootIDs() {
		if err := tree.NoteStopRequestedIn(tx, r, t.ID); err != nil {
			return err
		}
	}
	return kv.PutJSON(tx, terminationKey(t.ID), t)
}

// mayStop refuses a target that is terminated, or that another termination
// is stopping and t would not supersede (Supersedes): an abort, or a
// termination by a higher authority, is accepted and takes the node over.
func mayStop(tx store.ReadTxn, t Termination, target *tree.Node) error {
	switch target.State {
	case tree.NodeStateRunning:
		return ownCoverIn(tx, t, target)
	case tree.NodeStateTerminated:
		return fmt.Errorf("%w: node_id %s is terminated (termination %s)", ErrAlreadyStopping, target.NodeID, target.TerminationID)
	}
	if target.TerminationID == "" {
		return ownCoverIn(tx, t, target)
	}
	var owner Termination
	if err := getTermination(tx, target.TerminationID, &owner); err != nil {
		return err
	}
	if repeatsOwnStop(t, owner) {
		return fmt.Errorf("%w: node_id %s is already %s under your own termination %s; stopping it again would stop nothing more (an abort still escalates your drain)", ErrAlreadyStopping, target.NodeID, tree.StateName(target.State), owner.ID)
	}
	if ReachNode(t, target.State, owner) == ReachTakeOver {
		return nil
	}
	return fmt.Errorf("%w: node_id %s is %s (termination %s); only an abort, or a termination by a higher authority (an operator over an agent), supersedes it", ErrAlreadyStopping, target.NodeID, tree.StateName(target.State), owner.ID)
}

// ownCoverIn refuses t, an agent's own stop request, on a target its mark
// has not reached (running, or exited outside every termination) that the
// same agent's unfinished stop already covers — requested on the target or
// on a node between the agent and it, or marked down to one of them —
// when t would repeat that stop without escalating it (repeatsOwnStop):
// what mayStop refuses on a node the mark has reached. Until the fortieth
// pass the refusal read only the target's own state, so between the
// request and the mark's arrival (the reconciler's queue, a large
// subtree's chunks) each repeat, and each drain of a node inside the
// subtree, was accepted: a new termination marking the subtree again for
// one request (rogue40d tests). The lineage read is the part of the
// target's below its requester (an agent's target is below it, and the
// requester itself is not covered: TerminateIn), each termination read
// once.
func ownCoverIn(tx store.ReadTxn, t Termination, target *tree.Node) error {
	if !strings.HasPrefix(t.RequestedBy, "agent:") || t.ProposalID != "" || len(t.RequesterLineage) == 0 {
		return nil
	}
	requester := t.RequesterLineage[len(t.RequesterLineage)-1]
	at := slices.Index(target.Ancestors, requester)
	if at < 0 {
		return nil
	}
	between := target.Ancestors[at+1:]
	lineage := append(append([]string(nil), between...), target.NodeID)
	if err := store.Prefetch(tx, append(store.KeysOf(between, tree.NodeKey), store.KeysOf(lineage, tree.StopRequestedKey)...), nil); err != nil {
		return err
	}
	seen := make(map[string]bool, 2)
	check := func(node, owner, how string) error {
		if owner == "" || seen[owner] {
			return nil
		}
		seen[owner] = true
		var o Termination
		if err := getTermination(tx, owner, &o); err != nil {
			if errors.Is(err, ErrTerminationNotFound) {
				return nil
			}
			return err
		}
		if o.Phase == PhaseTerminated || !repeatsOwnStop(t, o) {
			return nil
		}
		where := "node_id " + target.NodeID
		if node != target.NodeID {
			where += " is below " + node + ", which"
		}
		return fmt.Errorf("%w: %s %s under your own termination %s; stopping it again would stop nothing more (an abort still escalates your drain)", ErrAlreadyStopping, where, how, o.ID)
	}
	for _, id := range lineage {
		if id != target.NodeID {
			n, err := tree.GetNodeIn(tx, id)
			if err != nil {
				return err
			}
			if tree.StopsBelow(n.State, n.TerminationID) {
				if err := check(id, n.TerminationID, "is "+tree.StateName(n.State)); err != nil {
					return err
				}
			}
		}
		v, err := tx.Get(tree.StopRequestedKey(id))
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		default:
			if err := check(id, string(v), "is requested to stop"); err != nil {
				return err
			}
		}
	}
	return nil
}

// repeatsOwnStop reports whether t, an agent's own stop request, would
// take a node over from the same agent's earlier request without
// escalating it (a drain over its drain or abort, an abort over its
// abort). Such a repeat stops nothing more, and keeps the deadlines the
// first set (Inherit), but it marked the whole subtree again for one
// request of the agent's budget: a rogue repeating the drain of a large
// subtree spent the server's CPU and store a subtree at a time. An
// operator's repeat (a client's retry) is still taken.
func repeatsOwnStop(t, owner Termination) bool {
	return strings.HasPrefix(t.RequestedBy, "agent:") && t.ProposalID == "" &&
		owner.RequestedBy == t.RequestedBy && owner.ProposalID == "" &&
		(t.Mode != ModeAbort || owner.Aborts())
}

// MaxTerminationRoots bounds the subtree roots of one termination.
const MaxTerminationRoots = 1000

// Get returns a termination.
func (s *Supervisor) Get(ctx context.Context, terminationID string) (Termination, error) {
	if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
		return Termination{}, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	var t Termination
	err := s.Store.View(ctx, func(tx store.ReadTxn) error { return getTermination(tx, terminationID, &t) })
	return t, err
}

// Watch sends the termination now and each time it changes, until it is
// terminated or ctx ends. Every Watch shares one store watch of the
// terminations (watch.go): a stream costs a commit nothing unless the
// commit changes its termination.
func (s *Supervisor) Watch(ctx context.Context, terminationID string, send func(Termination) error) error {
	if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
		return fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	sub, err := s.watches.subscribe(ctx, s.Store, terminationID)
	if err != nil {
		return err
	}
	defer s.watches.unsubscribe(sub)
	t, err := s.Get(ctx, terminationID)
	if err != nil {
		return err
	}
	if err := send(t); err != nil || t.Phase == PhaseTerminated {
		return err
	}
	last := t.UpdatedAt
	// consider sends next if it is news; done once it was the end.
	consider := func(next Termination) (done bool, err error) {
		// A progress change at the same instant is news too (on a clock
		// that has not moved, the cancel orders follow the mark).
		if !next.UpdatedAt.After(last) && next.Phase == t.Phase && next.Progress == t.Progress {
			return false, nil
		}
		t, last = next, next.UpdatedAt
		if err := send(t); err != nil {
			return true, err
		}
		return t.Phase == PhaseTerminated, nil
	}
	for {
		values, reread, err := sub.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if reread {
			next, err := s.Get(ctx, terminationID)
			if err != nil {
				return err
			}
			if done, err := consider(next); done || err != nil {
				return err
			}
			continue
		}
		for _, raw := range values {
			var next Termination
			if err := decodedTerminations.decode(terminationID, raw, &next); err != nil {
				return err
			}
			if done, err := consider(next); done || err != nil {
				return err
			}
		}
	}
}

func getTermination(tx store.ReadTxn, terminationID string, t *Termination) error {
	decode := func(raw []byte) error { return decodedTerminations.decode(terminationID, raw, t) }
	return kv.GetOf(tx, terminationKey(terminationID), decode, ErrTerminationNotFound, "termination_id ", "termination", terminationID)
}

// terminationMemo remembers the decoded form of large stored terminations.
// A termination lists its members, so a 10,000-node one is hundreds of KiB
// of JSON, and the reconciler reads it on every pass (each batch of cancel
// acks is a pass): decoding it each time made a termination's cost grow
// with members × passes. The memo is keyed by the stored bytes themselves,
// so it can never answer for a value other than the one read (whatever the
// store or the transaction); each caller gets its own copy.
type terminationMemo struct {
	mu      sync.Mutex
	entries map[string]memoEntry
}

type memoEntry struct {
	raw []byte
	t   Termination
}

// Below memoMinBytes decoding is cheap; memoMaxEntries bounds the memory
// (a few large terminations in progress at once; a value is at most
// store.MaxValueSize). Terminated ones are not kept.
const (
	memoMinBytes   = 16 << 10
	memoMaxEntries = 8
)

var decodedTerminations = &terminationMemo{entries: map[string]memoEntry{}}

func (m *terminationMemo) decode(id string, raw []byte, t *Termination) error {
	if len(raw) < memoMinBytes {
		return json.Unmarshal(raw, t)
	}
	m.mu.Lock()
	e, ok := m.entries[id]
	m.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		*t = e.t.clone()
		return nil
	}
	var fresh Termination
	if err := json.Unmarshal(raw, &fresh); err != nil {
		return err
	}
	*t = fresh.clone()
	m.mu.Lock()
	defer m.mu.Unlock()
	if fresh.Phase == PhaseTerminated {
		// Finished: the reconciler is done with it, so the memo lets go.
		delete(m.entries, id)
		return nil
	}
	if _, ok := m.entries[id]; !ok && len(m.entries) >= memoMaxEntries {
		for k := range m.entries {
			delete(m.entries, k)
			break
		}
	}
	m.entries[id] = memoEntry{raw: bytes.Clone(raw), t: fresh}
	return nil
}
