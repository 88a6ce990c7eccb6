package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tetherhq/tether/controlplane/store"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Termination errors.
var (
	ErrTerminationNotFound = errors.New("supervisor: termination not found")
	ErrAlreadyStopping     = errors.New("supervisor: node is already stopping")
	ErrRecordNotFound      = errors.New("supervisor: record not found")
)

// GrantRevoker is the capability tree as the supervisor needs it.
type GrantRevoker interface {
	// RevokeHeldBy revokes every active grant held by the nodes, one
	// tombstone per top grant (a grant whose parent is not itself being
	// revoked). Idempotent.
	RevokeHeldBy(ctx context.Context, nodeIDs []string, by, reason string) error
	// HeldBy reports every grant held by the nodes and its outcome
	// (OutcomeRevoked, OutcomeExpired, or "" while active).
	HeldBy(ctx context.Context, nodeIDs []string) ([]HeldGrant, error)
}

// HeldGrant is a grant as the record lists it.
type HeldGrant struct {
	GrantID, NodeID, Outcome string
}

// LeaseCanceller is the lease module as the supervisor needs it.
type LeaseCanceller interface {
	// CancelHeldBy requests cancellation of every open lease held by the
	// holders. Idempotent.
	CancelHeldBy(ctx context.Context, holders []string, reason string) error
	// FinalizeHeldBy reconciles those leases explicitly (cancelled when the
	// worker acknowledged, expired when the lease ran out, otherwise a
	// bounded unresolved) and reports each. Idempotent.
	FinalizeHeldBy(ctx context.Context, holders []string, reason string) ([]*tetherv1.RecordLease, error)
}

// Supervisor terminates subtrees and writes reconciliation records.
type Supervisor struct {
	Store      store.Store
	Clock      clock.Clock
	Tree       *Tree
	Ledger     *Ledger
	Privileges *Privileges
	Grants     GrantRevoker   // nil: no grants to revoke
	Leases     LeaseCanceller // nil: no leases to cancel
	Sink       RecordSink     // nil: records stay in the store only
	Log        *slog.Logger

	queue *workQueue
}

// Defaults for a termination's windows when the request leaves them empty.
const (
	DefaultDrainWindow      = 30 * time.Second
	DefaultCancelAckTimeout = 10 * time.Second
	DefaultConfirmTimeout   = 30 * time.Second
)

// TerminateRequest is an authenticated request to terminate a subtree.
type TerminateRequest struct {
	NodeID                                        string
	Mode                                          Mode
	DrainWindow, CancelAckTimeout, ConfirmTimeout time.Duration
	Reason                                        string
	RequestedBy                                   string
	// Authorize is called inside the transaction with the target node.
	Authorize func(target *tetherv1.Node) error
}

// Terminate persists a termination request; the reconciler does the rest.
// The request is durable when Terminate returns.
func (s *Supervisor) Terminate(ctx context.Context, req TerminateRequest) (Termination, error) {
	if err := id.Check(id.Node, "node_id", req.NodeID); err != nil {
		return Termination{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	t, err := NewTermination(id.New(id.Termination), req.NodeID, req.Mode, req.DrainWindow, req.CancelAckTimeout, req.ConfirmTimeout, req.Reason, req.RequestedBy, s.Clock.Now())
	if err != nil {
		return Termination{}, err
	}
	err = s.Store.Update(ctx, func(tx store.Txn) error {
		target, err := getNode(tx, req.NodeID)
		if err != nil {
			return err
		}
		if req.Authorize != nil {
			if err := req.Authorize(target); err != nil {
				return err
			}
		}
		if target.State != tetherv1.NodeState_NODE_STATE_RUNNING {
			return fmt.Errorf("%w: node_id %s is %s (termination %s)", ErrAlreadyStopping, req.NodeID, StateName(target.State), target.TerminationId)
		}
		return putJSON(tx, terminationKey(t.ID), t)
	})
	if err != nil {
		return Termination{}, err
	}
	s.Kick(t.ID)
	return t, nil
}

// Get returns a termination.
func (s *Supervisor) Get(ctx context.Context, terminationID string) (Termination, error) {
	if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
		return Termination{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var t Termination
	err := s.Store.View(ctx, func(tx store.ReadTxn) error { return getTermination(tx, terminationID, &t) })
	return t, err
}

// Watch sends the termination now and each time it changes, until it is
// terminated or ctx ends.
func (s *Supervisor) Watch(ctx context.Context, terminationID string, send func(Termination) error) error {
	if err := id.Check(id.Termination, "termination_id", terminationID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	w, err := s.Store.Watch(ctx, terminationKey(terminationID))
	if err != nil {
		return err
	}
	t, err := s.Get(ctx, terminationID)
	if err != nil {
		return err
	}
	if err := send(t); err != nil || t.Phase == PhaseTerminated {
		return err
	}
	last := t.UpdatedAt
	for batch := range w.Events() {
		for _, ev := range batch {
			if ev.Type != store.EventPut || string(ev.Key) != string(terminationKey(terminationID)) {
				continue
			}
			var next Termination
			if err := jsonUnmarshal(ev.Value, &next); err != nil {
				return err
			}
			if !next.UpdatedAt.After(last) && next.Phase == t.Phase {
				continue
			}
			t, last = next, next.UpdatedAt
			if err := send(t); err != nil {
				return err
			}
			if t.Phase == PhaseTerminated {
				return nil
			}
		}
	}
	if err := w.Err(); err != nil && ctx.Err() == nil {
		return err
	}
	return ctx.Err()
}

func getTermination(tx store.ReadTxn, terminationID string, t *Termination) error {
	err := getJSON(tx, terminationKey(terminationID), t)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: termination_id %s", ErrTerminationNotFound, terminationID)
	}
	return err
}
