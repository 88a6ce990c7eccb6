package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// Signals pushes drain and abort signals to open agent sessions the moment
// a node's stored state says so. It follows the store (a watch on the
// nodes), not the reconciler's memory, so a signal decided on any replica,
// or before a restart, reaches the session wherever it is connected.
type Signals struct {
	Store store.Store
	Clock clock.Clock  // the backoff after a failed watch; nil: the wall clock
	Log   *slog.Logger // nil: no logs

	mu      sync.Mutex
	subs    map[string]map[chan *SessionSignal]struct{}
	changes map[string]map[chan struct{}]struct{}
}

// Changes returns a channel that receives (coalesced) whenever nodeID's
// stored node changes, and a cancel function: a stream that checked the
// node once re-checks it only when it may have changed (a lease channel's
// per-message activity check), instead of reading it per message. A lagged
// watch notifies every subscriber.
func (h *Signals) Changes(nodeID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	return ch, subscribe(&h.mu, &h.changes, nodeID, ch)
}

// subscribe adds ch to nodeID's set in *subs (made on first use), under mu,
// and returns the function that removes it again.
func subscribe[C comparable](mu *sync.Mutex, subs *map[string]map[C]struct{}, nodeID string, ch C) (cancel func()) {
	mu.Lock()
	defer mu.Unlock()
	if *subs == nil {
		*subs = map[string]map[C]struct{}{}
	}
	if (*subs)[nodeID] == nil {
		(*subs)[nodeID] = map[C]struct{}{}
	}
	(*subs)[nodeID][ch] = struct{}{}
	return func() {
		mu.Lock()
		defer mu.Unlock()
		delete((*subs)[nodeID], ch)
		if len((*subs)[nodeID]) == 0 {
			delete(*subs, nodeID)
		}
	}
}

// NodeChanged tells nodeID's change subscribers now (all of them when
// nodeID is ""): the store's watch tells them too, a moment later.
func (h *Signals) NodeChanged(nodeID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	notify := func(set map[chan struct{}]struct{}) {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default: // a change is already pending
			}
		}
	}
	if nodeID == "" {
		for _, set := range h.changes {
			notify(set)
		}
		return
	}
	notify(h.changes[nodeID])
}

// SignalFor returns the signal a node in state n should be under, or nil.
func SignalFor(n *Node) *SessionSignal {
	switch n.State {
	case NodeStateDraining:
		return &SessionSignal{Kind: SignalKindDrain, TerminationID: n.TerminationID, Reason: "the subtree is draining: finish in-flight work, start nothing new, then exit"}
	case NodeStateAborting:
		return &SessionSignal{Kind: SignalKindAbort, TerminationID: n.TerminationID, Reason: "the subtree is aborting: stop now and exit"}
	case NodeStateTerminated:
		return &SessionSignal{Kind: SignalKindAbort, TerminationID: n.TerminationID, Reason: "the node is terminated"}
	case NodeStateExited:
		return &SessionSignal{Kind: SignalKindAbort, TerminationID: n.TerminationID, Reason: "the node's exit was confirmed: stop now"}
	}
	return nil
}

// Subscribe returns a channel of signals for nodeID and a cancel function.
// The channel holds the latest few signals; a session that lags misses
// only duplicates (signals are level-triggered: the node's state is the
// truth, and a reconnecting session is told it on open).
func (h *Signals) Subscribe(nodeID string) (<-chan *SessionSignal, func()) {
	ch := make(chan *SessionSignal, 4)
	return ch, subscribe(&h.mu, &h.subs, nodeID, ch)
}

func (h *Signals) publish(nodeID string, sig *SessionSignal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[nodeID] {
		select {
		case ch <- sig:
		default: // the session has unread signals already; the state is the truth
		}
	}
}

// Run follows node changes until ctx ends. Each pass establishes the
// watch, then notifies every Changes subscriber and reads every open
// session's node again and sends its signal: a change made before the
// watch began (while a watch that fell behind, or failed, is re-established
// — reconcile.Passes — as before the first, when the control plane already
// serves sessions that subscribed and read their node) still reaches them.
func (h *Signals) Run(ctx context.Context) error {
	c := h.Clock
	if c == nil {
		c = clock.Real{}
	}
	return reconcile.Passes(ctx, "session signals", c, h.Log, h.follow)
}

func (h *Signals) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := h.Store.Watch(ctx, []byte(prefixNode))
	if err != nil {
		return err
	}
	// After the watch is established, so nothing in between is missed.
	h.NodeChanged("")
	if err := h.resend(ctx); err != nil {
		return err
	}
	for batch := range w.Events() {
		for _, ev := range batch {
			if ev.Type != store.EventPut {
				continue
			}
			n := &Node{}
			if UnmarshalNode(ev.Value, n) != nil {
				continue
			}
			h.NodeChanged(n.NodeID)
			h.mu.Lock()
			_, watched := h.subs[n.NodeID]
			h.mu.Unlock()
			if !watched {
				continue
			}
			if sig := SignalFor(n); sig != nil {
				h.publish(n.NodeID, sig)
			}
		}
	}
	return reconcile.WatchEnded(w)
}

// resend sends every open session its node's current signal (signals are
// level-triggered: a session may receive one twice).
func (h *Signals) resend(ctx context.Context) error {
	h.mu.Lock()
	ids := make([]string, 0, len(h.subs))
	for id := range h.subs {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	var nodes []*Node
	err := h.Store.View(ctx, func(tx store.ReadTxn) error {
		nodes = nodes[:0]
		for _, id := range ids {
			n, err := getNode(tx, id)
			if errors.Is(err, ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			nodes = append(nodes, n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if sig := SignalFor(n); sig != nil {
			h.publish(n.NodeID, sig)
		}
	}
	return nil
}

// Confirmation strengths: a launcher (outside the process) beats an
// ancestor, which beats the agent's own word.
const (
	ConfirmedBySelf     = "self"
	ConfirmedByAncestor = "ancestor"
	ConfirmedByLauncher = "launcher"
)

func confirmStrength(by string) int {
	switch {
	case len(by) > 0 && hasSuffix(by, "("+ConfirmedByLauncher+")"):
		return 3
	case hasSuffix(by, "("+ConfirmedByAncestor+")"):
		return 2
	case by != "":
		return 1
	}
	return 0
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}

// ConfirmExit records that a node's process has exited, and who says so
// (principal plus kind: ConfirmedBySelf, ConfirmedByAncestor or
// ConfirmedByLauncher). Each party's first word is kept; exited_at is the
// first confirmation and exit_confirmed_by the strongest. A running node
// becomes EXITED: from now on it may not act (see Act), and whether the
// confirmation counts is decided by the record (JudgeExit). Once the node
// is terminated (its record written) an agent's word is refused
// (ErrNodeRecorded); a launcher's is still kept on the node.
func (t *Tree) ConfirmExit(ctx context.Context, nodeID, principal, kind, reason string, authorize func(*Node) error) (*Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	reason = kv.ClipUTF8(reason, 256)
	by := principal + " (" + kind + ")"
	now := t.Clock.Now()
	return t.updateNode(ctx, nodeID, authorize, func(tx store.Txn, n *Node) error {
		if n.State == NodeStateTerminated && kind != ConfirmedByLauncher {
			// The record was written, from outside, with the node's exit
			// as it stood; an agent of the swarm vouching for the node
			// afterwards would have the node read confirmed on its word
			// where the record says otherwise. (A launcher's late
			// attestation is kept: an operator's own observation.)
			return fmt.Errorf("%w: node_id %s is terminated: termination %s has written its record, with the node's exit as the control plane had it then (read it with GetRecord); an agent's word after that is not recorded",
				ErrNodeRecorded, n.NodeID, n.TerminationID)
		}
		changed := false
		// Agents' words (the node's, its ancestors') and operators'
		// attestations are bounded apart: a workload that holds its
		// ancestors' credentials must not fill the room with claims and
		// crowd out the launcher's attestation from outside.
		known, alike := false, 0
		for _, c := range n.ExitConfirmations {
			known = known || c.By == principal
			if (c.Kind == ConfirmedByLauncher) == (kind == ConfirmedByLauncher) {
				alike++
			}
		}
		if !known && alike < maxConfirmations {
			n.ExitConfirmations = append(n.ExitConfirmations, ExitConfirmation{By: principal, Kind: kind, At: now, Reason: reason})
			changed = true
		}
		if n.ExitedAt.IsZero() {
			n.ExitedAt = now
			changed = true
		}
		if confirmStrength(n.ExitConfirmedBy) < confirmStrength(by) {
			n.ExitConfirmedBy = by
			changed = true
		}
		if n.State == NodeStateRunning {
			n.State = NodeStateExited
			changed = true
		}
		if !changed {
			return nil
		}
		return putNode(tx, n)
	})
}

// LastSeenEvery bounds how often heartbeats are written: the record needs
// "last seen" to this precision, not every beat.
const LastSeenEvery = 10 * time.Second

// Heartbeat records that a node was seen, at most once per LastSeenEvery.
func (t *Tree) Heartbeat(ctx context.Context, nodeID string, lastWritten time.Time) (time.Time, error) {
	now := t.Clock.Now()
	if !lastWritten.IsZero() && now.Sub(lastWritten) < LastSeenEvery {
		return lastWritten, nil
	}
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getNode(tx, nodeID)
		if err != nil {
			return err
		}
		n.LastSeenAt, n.LastSeenSeq = now, nextSeenSeq(n)
		return putNode(tx, n)
	})
	if err != nil {
		return lastWritten, err
	}
	return now, nil
}
