package tree

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// Who may say a node exited, and what the control plane does with it.
//
// The workload is the least reliable narrator of its own end: a node's own
// word that it exited, or an ancestor's inside the subtree being stopped
// (or itself stopping, stopped or exited under any termination), is a
// claim. An operator (a launcher that watched the process die) or an
// ancestor agent still running outside every stop attests; an agent whose
// own exit was confirmed may not vouch for anyone. Neither is enough on its own:
// the record says CONFIRMED only when the control plane's own evidence
// agrees — no session of the node is open, every grant it held is revoked
// or expired, nothing arrived from it after the first confirmation, and,
// for a bare claim, the control plane saw the node's session end.
//
// From the first confirmation on, the node may no longer act: its
// credential is refused (FailedPrecondition), a tool call with its tokens
// is refused, and each such attempt is kept on the node as a
// Contradiction (the first MaxContradictions of them). One contradiction
// makes the node unaccounted in the record, whoever confirmed it.

// ErrNodeExited refuses activity from a node whose exit was confirmed.
var ErrNodeExited = fault.New(fault.Precondition, "supervisor: the node's exit was confirmed")

// MaxContradictions bounds the contradicting evidence kept per node: the
// first few prove the point, and a node that floods cannot grow its entry.
const MaxContradictions = 16

// maxConfirmations bounds the confirmations kept per node (one per party),
// agents' and operators' each.
const maxConfirmations = 8

// Kinds of activity that contradict a confirmed exit.
const (
	ActivityHeartbeat = "heartbeat"
	ActivitySession   = "session"
	ActivityToolCall  = "tool_call"
	ActivitySpawn     = "spawn"
	ActivityLease     = "lease"
	ActivityDelegate  = "delegate"
	ActivityRefresh   = "refresh"
	ActivityRequest   = "request"
)

// ConfirmedByControlPlane names the control plane as the confirming party
// when only a claim exists and its own observation corroborates it.
const ConfirmedByControlPlane = "control-plane"

// ExitConfirmed reports whether anyone confirmed n's exit.
func ExitConfirmed(n *Node) bool { return !n.ExitedAt.IsZero() }

// NoteContradiction keeps one piece of contradicting evidence on n and
// reports whether n changed (false once the bound is reached).
func NoteContradiction(n *Node, kind, detail string, now time.Time) bool {
	if len(n.Contradictions) >= MaxContradictions {
		return false
	}
	detail = kv.ClipUTF8(detail, 200)
	n.Contradictions = append(n.Contradictions, Contradiction{Kind: kind, At: now, Detail: detail})
	return true
}

// ExitedError is the refusal of activity from a confirmed-exited node; it
// names the state, who confirmed and when.
func ExitedError(n *Node, kind string) error {
	by := n.ExitConfirmedBy
	if by == "" {
		by = "someone"
	}
	return fmt.Errorf("%w: node %s is %s (its exit was confirmed by %s at %s): this %s contradicts that and is recorded as evidence",
		ErrNodeExited, n.NodeID, StateName(n.State), by, n.ExitedAt.UTC().Format(time.RFC3339), strings.ReplaceAll(kind, "_", " "))
}

// Act checks that a node may still act, for activity of the given kind
// coming from it (its credential, its session, its tokens). A node whose
// exit was confirmed is refused with ErrNodeExited, and the attempt is
// stored on the node as a contradiction before Act returns. A node whose
// session's end is the last the control plane saw of it is seen alive
// now (NoteSeenAfterSessionEnd): its request after that end means a bare
// claim of its exit is not corroborated by the end (JudgeExit); only the
// first such request writes. It returns the node as read.
func (t *Tree) Act(ctx context.Context, nodeID, kind, detail string) (*Node, error) {
	n, err := t.Get(ctx, nodeID)
	if err != nil || n.State == NodeStateTerminated || !ExitConfirmed(n) && !SessionEndIsLastSeen(n) {
		// A terminated node's record is written: its credential is dead
		// (the caller refuses it as revoked) and nothing can change it.
		return n, err
	}
	now := t.Clock.Now()
	err = t.Store.Update(ctx, func(tx store.Txn) error {
		n, err = getNode(tx, nodeID)
		if err != nil {
			return err
		}
		if n.State == NodeStateTerminated {
			return nil
		}
		changed := NoteSeenAfterSessionEnd(n, now)
		if ExitConfirmed(n) && NoteContradiction(n, kind, detail, now) {
			changed = true
		}
		if !changed {
			return nil
		}
		return putNode(tx, n)
	})
	if err != nil {
		return nil, err
	}
	if !ExitConfirmed(n) {
		return n, nil
	}
	return n, ExitedError(n, kind)
}

// SeenAlive records that the control plane saw the node alive now, when
// the last it saw of it was its session's end (NoteSeenAfterSessionEnd):
// a tool call of its refused before its transaction (for its lineage's
// spent budget). A stream of its credential that outlived the end is
// noted by the stream's own end (StreamClosed). A node whose end is not
// the last seen, a terminated or an unknown one, is left alone, on a
// read: only the first such sign after a session's end writes.
func (t *Tree) SeenAlive(ctx context.Context, nodeID string) error {
	n, err := t.Get(ctx, nodeID)
	if errors.Is(err, ErrNodeNotFound) || errors.Is(err, ErrInvalidArgument) {
		return nil
	}
	if err != nil || n.State == NodeStateTerminated || !SessionEndIsLastSeen(n) {
		return err
	}
	now := t.Clock.Now()
	return t.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getNode(tx, nodeID)
		if errors.Is(err, ErrNodeNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if n.State == NodeStateTerminated || !NoteSeenAfterSessionEnd(n, now) {
			return nil
		}
		return putNode(tx, n)
	})
}

// NeverSessioned reports whether n never had a session the control plane
// saw open: what it sees of n's credential leaves no end behind it
// (SeenAfterSessionEnd), and is weighed against its ancestors' claims by
// NoteAtWorkAfterClaims.
func NeverSessioned(n *Node) bool { return n.SessionOpenedAt.IsZero() }

// NoteAtWorkAfterClaims records that the control plane is serving n's
// credential now (a request of the given kind), for a node that never had
// a session (NeverSessioned): on each ancestor of n whose exit was
// confirmed, not terminated, that has none noted yet (BelowAfterClaim),
// it notes n. The ancestor was issued n's credential (a child's at its
// spawn, a deeper one from the Spawn's answer below it), and its claim
// was stored before this request was served: so n's activity came after
// the claim, in the store's order, whatever the replicas' clocks — which
// a descendant's own observations cannot say when it never had a session
// whose end to come after. A bare claim (or an agent's attestation) is
// then not corroborated (JudgeExitBeside). Until the thirty-seventh pass
// a rogue parent that ended its session, claimed its exit and worked on
// by requests with its never-sessioned child's credential read confirmed
// by the control plane, the life put on the child alone. One read of n's
// ancestors (prefetched together on etcd); a write only the first time
// for each ancestor, so a flood costs reads.
//
// An ancestor already terminated with its exit confirmed by a word the
// record weighs (recordedWeighed: a claim or an agent's attestation) has
// its record's entry written: a note would not reach it. The request is
// refused then (ErrAncestorRecorded, a Precondition fault; the caller
// answers FailedPrecondition and serves nothing). Until the thirty-eighth
// pass it was served: a rogue parent in a subtree larger than a record
// chunk worked on with its never-sessioned child's credential once its
// own chunk had committed, and read confirmed by the control plane.
func (t *Tree) NoteAtWorkAfterClaims(ctx context.Context, n *Node, kind string) error {
	if n == nil || n.State == NodeStateTerminated || !NeverSessioned(n) || len(n.Ancestors) == 0 {
		return nil
	}
	claimed := func(a *Node) bool {
		return a.State != NodeStateTerminated && ExitConfirmed(a) && len(a.BelowAfterClaim) == 0
	}
	var ids []string
	var refused error
	err := t.Store.View(ctx, func(tx store.ReadTxn) error {
		ids, refused = ids[:0], nil
		if err := store.Prefetch(tx, store.KeysOf(n.Ancestors, nodeKey), nil); err != nil {
			return err
		}
		for _, id := range n.Ancestors {
			a, err := getNode(tx, id)
			if errors.Is(err, ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if recordedWeighed(a) {
				refused = ancestorRecordedError(n, a)
				return nil
			}
			if claimed(a) {
				ids = append(ids, id)
			}
		}
		return nil
	})
	if err != nil || refused != nil {
		return cmp.Or(err, refused)
	}
	if len(ids) == 0 {
		return nil
	}
	now := t.Clock.Now()
	err = t.Store.Update(ctx, func(tx store.Txn) error {
		refused = nil
		for _, id := range ids {
			a, err := getNode(tx, id)
			if errors.Is(err, ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if recordedWeighed(a) {
				// Its record's chunk committed since the read: nothing
				// noted now would reach its entry.
				refused = ancestorRecordedError(n, a)
				return nil
			}
			if !claimed(a) {
				continue
			}
			a.BelowAfterClaim = []BelowAfterClaim{{NodeID: n.NodeID, ParentNodeID: n.ParentNodeID, Kind: kind, At: now}}
			if err := putNode(tx, a); err != nil {
				return err
			}
		}
		return nil
	})
	return cmp.Or(err, refused)
}

// ErrAncestorRecorded refuses a request of a node that never had a
// session (NoteAtWorkAfterClaims) once the record of an ancestor whose
// exit was confirmed (by its claim or an agent's attestation) is written.
var ErrAncestorRecorded = fault.New(fault.Precondition, "supervisor: an ancestor's exit is recorded")

// recordedWeighed reports whether a is terminated (its record's entry
// written) with its exit confirmed by a word the record weighs against
// what its descendants do (a claim or an agent's attestation, no
// launcher's): a request served to a descendant's credential now could no
// longer reach that entry.
func recordedWeighed(a *Node) bool {
	if a.State != NodeStateTerminated || !ExitConfirmed(a) {
		return false
	}
	for _, c := range confirmationsOf(a) {
		if c.Kind == ConfirmedByLauncher {
			return false
		}
	}
	return true
}

func ancestorRecordedError(n, a *Node) error {
	return fmt.Errorf("%w: node %s never had a session, and its ancestor %s, whose exit was confirmed by %s, is terminated with its record written: the control plane serves nothing more to the credential that ancestor was issued at the spawn below it (open a session before the stop to be served while stopping)",
		ErrAncestorRecorded, n.NodeID, a.NodeID, cmp.Or(a.ExitConfirmedBy, "its claim"))
}

// A node's streams of its own credential that are not sessions in the
// exit evidence's sense (their end does not witness the process's: its
// revocation feeds, its termination watches) are kept on the node with its
// sessions (OpenSessions), one entry for all of them on one control-plane
// process (the process counts them), its id "streams:s_…", from when the
// first opens until the last ends.
const streamIDPrefix = "streams:"

// MaxOpenStreams bounds the stream entries (StreamOpened) a node may have
// at once, apart from its sessions: one per control-plane process serving
// some.
const MaxOpenStreams = 16

// IsStream reports whether an entry of OpenSessions is a stream entry
// (StreamOpened), not a session.
func IsStream(s OpenSession) bool { return strings.HasPrefix(s.SessionID, streamIDPrefix) }

// StreamOpened records that the first of the node's streams of its own
// credential that are not sessions (a revocation feed, a termination
// watch) opened on this process, and returns the entry's id for
// StreamClosed, which the process calls when the last of them ends. While
// it is open the control plane sees the node alive (JudgeExit: a claim is
// not corroborated): a rogue that ended its session and read on through
// its feed was weighed only by the feed's end, noted a moment after its
// claim (or never, the replica serving it gone), and read confirmed in
// between (twenty-ninth pass). A node whose exit was confirmed may not
// open one (its request was kept as a contradiction when it arrived, Act).
func (t *Tree) StreamOpened(ctx context.Context, nodeID string) (string, error) {
	now := t.Clock.Now()
	streamID := streamIDPrefix + id.New(id.Session)
	var refused error
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		refused = nil
		n, err := getNode(tx, nodeID)
		if err != nil {
			return err
		}
		if ExitConfirmed(n) && n.State != NodeStateTerminated {
			refused = ExitedError(n, ActivityRequest)
			return nil
		}
		if open := countStreams(n); open >= MaxOpenStreams {
			refused = fmt.Errorf("%w: node %s already has streams open on %d control-plane processes, the maximum", ErrLimit, nodeID, open)
			return nil
		}
		n.OpenSessions = append(n.OpenSessions, OpenSession{SessionID: streamID, OpenedAt: now, Instance: t.Instance})
		if err := putNode(tx, n); err != nil {
			return err
		}
		return tx.Put(sessionKey(t.Instance, nodeID, streamID), nil)
	})
	if err != nil {
		return "", err
	}
	if refused != nil {
		return "", refused
	}
	return streamID, nil
}

// StreamClosed records that the last of the node's streams on this
// process (StreamOpened) ended: the control plane saw the node alive
// until now. When the last it saw of the node
// before was its session's end (and no session of it is open), the node
// is seen after that end (NoteSeenAfterSessionEnd), in the transaction
// that removes the stream, so the claim is never judged between the two.
// The caller passes a context that outlives the stream.
func (t *Tree) StreamClosed(ctx context.Context, nodeID, streamID string) error {
	return t.closeOpenEntry(ctx, nodeID, streamID, true, closeStream)
}

// closeOpenEntry removes the node's open session or stream entryID, in
// the node (by close, at the clock's now) and its index key, in one
// transaction. goneOK: a node no longer stored has only its key removed.
func (t *Tree) closeOpenEntry(ctx context.Context, nodeID, entryID string, goneOK bool, close func(n *Node, entryID string, now time.Time)) error {
	now := t.Clock.Now()
	return t.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getNode(tx, nodeID)
		if goneOK && errors.Is(err, ErrNodeNotFound) {
			return tx.Delete(sessionKey(t.Instance, nodeID, entryID))
		}
		if err != nil {
			return err
		}
		close(n, entryID, now)
		if err := putNode(tx, n); err != nil {
			return err
		}
		return tx.Delete(sessionKey(t.Instance, nodeID, entryID))
	})
}

func closeStream(n *Node, streamID string, now time.Time) {
	kept := n.OpenSessions[:0]
	for _, s := range n.OpenSessions {
		if s.SessionID != streamID {
			kept = append(kept, s)
		}
	}
	n.OpenSessions = kept
	// A session still open ends later, after the stream; a terminated
	// node's record is written.
	if n.State != NodeStateTerminated && !SessionOpen(n) {
		NoteSeenAfterSessionEnd(n, now)
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func hasOpenStream(n *Node) bool { _, ok := OpenStream(n); return ok }

func countStreams(n *Node) int {
	c := 0
	for _, s := range n.OpenSessions {
		if IsStream(s) {
			c++
		}
	}
	return c
}

// OpenStream returns a stream of n open now (StreamOpened), if any.
func OpenStream(n *Node) (OpenSession, bool) {
	for _, s := range n.OpenSessions {
		if IsStream(s) {
			return s, true
		}
	}
	return OpenSession{}, false
}

// MaxOpenSessions bounds the sessions a node may hold open at once.
const MaxOpenSessions = 8

// SessionOpened records that one of the node's sessions opened and returns
// its id, for SessionClosed. A node whose exit was confirmed may not open
// one: the attempt is a contradiction. The sessions are kept on the node
// one by one, so that a second, silent session cannot hide behind the
// close of the first.
func (t *Tree) SessionOpened(ctx context.Context, nodeID string) (*Node, string, error) {
	now := t.Clock.Now()
	sessionID := id.New(id.Session)
	var out *Node
	var refused error
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		refused = nil
		n, err := getNode(tx, nodeID)
		if err != nil {
			return err
		}
		out = n
		if ExitConfirmed(n) && n.State != NodeStateTerminated {
			refused = ExitedError(n, ActivitySession)
			if !NoteContradiction(n, ActivitySession, "a session was opened", now) {
				return nil
			}
			return putNode(tx, n)
		}
		if open := len(n.OpenSessions) - countStreams(n); open >= MaxOpenSessions {
			refused = fmt.Errorf("%w: node %s already has %d sessions open, the maximum", ErrLimit, nodeID, open)
			return nil
		}
		n.SessionOpenedAt = now
		n.OpenSessions = append(n.OpenSessions, OpenSession{SessionID: sessionID, OpenedAt: n.SessionOpenedAt, Instance: t.Instance})
		if err := putNode(tx, n); err != nil {
			return err
		}
		return tx.Put(sessionKey(t.Instance, nodeID, sessionID), nil)
	})
	if err != nil {
		return nil, "", err
	}
	return out, sessionID, refused
}

// SessionClosed records that a session ended. The caller passes a context
// that outlives the stream.
func (t *Tree) SessionClosed(ctx context.Context, nodeID, sessionID string) error {
	return t.closeOpenEntry(ctx, nodeID, sessionID, false, closeSession)
}

func closeSession(n *Node, sessionID string, now time.Time) {
	kept := n.OpenSessions[:0]
	for _, s := range n.OpenSessions {
		if s.SessionID != sessionID {
			kept = append(kept, s)
		}
	}
	n.OpenSessions = kept
	n.SessionClosedAt, n.SessionClosedSeq = now, nextSeenSeq(n)
}

// CloseStaleSessions closes, on the nodes, every session served by another
// control-plane instance than this one. Only a process that owns its store
// alone (a Badger data directory, locked by it) may call it, at start: the
// sessions of its previous life died with it. (Replicas sharing a store
// cannot tell a dead replica's sessions from a live one's; those read as
// open until the agent reconnects and closes, so the record errs towards
// unaccounted.)
func (t *Tree) CloseStaleSessions(ctx context.Context) (int, error) {
	type stale struct {
		key           []byte
		node, session string
	}
	var found []stale
	err := t.Store.View(ctx, func(tx store.ReadTxn) error {
		found = nil
		return tx.Scan([]byte(prefixSession), nil, func(k, _ []byte) error {
			parts := strings.Split(string(k[len(prefixSession):]), "/")
			if len(parts) == 3 && parts[0] != t.Instance {
				found = append(found, stale{key: append([]byte(nil), k...), node: parts[1], session: parts[2]})
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	// The streams (StreamOpened) first: one open at the restart was the
	// node alive until then, after a session's end stored before it, not
	// after a session's that died with it.
	slices.SortStableFunc(found, func(a, b stale) int {
		return cmpBool(!IsStream(OpenSession{SessionID: a.session}), !IsStream(OpenSession{SessionID: b.session}))
	})
	now := t.Clock.Now()
	for start := 0; start < len(found); start += 256 {
		batch := found[start:min(start+256, len(found))]
		err := t.Store.Update(ctx, func(tx store.Txn) error {
			for _, s := range batch {
				n, err := getNode(tx, s.node)
				if err == nil {
					if IsStream(OpenSession{SessionID: s.session}) {
						closeStream(n, s.session, now)
					} else {
						closeSession(n, s.session, now)
					}
					if err := putNode(tx, n); err != nil {
						return err
					}
				} else if !errors.Is(err, ErrNodeNotFound) {
					return err
				}
				if err := tx.Delete(s.key); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	return len(found), nil
}

// SessionOpen reports whether, by the control plane's observation, a
// session of n is open (a stream, StreamOpened, is not a session).
func SessionOpen(n *Node) bool { return len(n.OpenSessions) > countStreams(n) }

// ExitVerdict is what the record says about one node's exit: confirmed
// (by whom, when), or unaccounted and why, and the claim it weighed.
type ExitVerdict struct {
	Confirmed         bool
	ConfirmedBy       string
	ConfirmedAt       time.Time
	ClaimedBy         string
	ClaimedAt         time.Time
	UnaccountedReason string
	// Settled: no later evidence can change the verdict (the reconciler
	// stops waiting for the node).
	Settled bool
}

// confirmationsOf returns n's confirmations, reading a node stored before
// they were kept one by one from its strongest confirmation.
func confirmationsOf(n *Node) []ExitConfirmation {
	if len(n.ExitConfirmations) > 0 || n.ExitedAt.IsZero() {
		return n.ExitConfirmations
	}
	by, kind := n.ExitConfirmedBy, ConfirmedBySelf
	if i := strings.LastIndex(by, " ("); i >= 0 && strings.HasSuffix(by, ")") {
		by, kind = by[:i], by[i+2:len(by)-1]
	}
	return []ExitConfirmation{{By: by, Kind: kind, At: n.ExitedAt}}
}

// isClaim says whether a confirmation is the workload's own word: the
// node's, or an ancestor's that is itself part of the workload being
// stopped (inStopped: the termination's view of its workload).
func isClaim(c ExitConfirmation, inStopped func(nodeID string) bool) bool {
	switch c.Kind {
	case ConfirmedBySelf:
		return true
	case ConfirmedByAncestor:
		return inStopped(strings.TrimPrefix(c.By, "agent:"))
	}
	return false
}

// JudgeExit weighs a node's confirmations against the control plane's own
// evidence. liveGrants are grants the node held that are neither revoked
// nor expired.
func JudgeExit(n *Node, inStopped func(nodeID string) bool, liveGrants []string) ExitVerdict {
	return JudgeExitBeside(n, inStopped, liveGrants, Beside{})
}

// ChildAlive returns a child among children (nodes the node spawned) that
// the control plane sees alive now, the child not terminated — a session
// or a stream of its credential open (the session returned), or its
// credential at work after the last end the control plane saw of it (the
// session returned empty: SeenAfterSessionEnd, or a contradiction of its
// confirmed exit) — if any. Each is the order of that node's own
// observations, never two nodes' times (two etcd replicas' clocks): a
// rogue parent that ended its session and claimed its exit, and worked on
// by requests with a credential of a descendant whose own session had
// ended (or whose launcher had attested its exit), nothing of it open at
// the record, read confirmed until the thirty-third pass.
func ChildAlive(children []*Node) (*Node, OpenSession, bool) {
	var worked *Node
	for _, c := range children {
		if c == nil || c.State == NodeStateTerminated {
			continue
		}
		for _, s := range c.OpenSessions {
			return c, s, true
		}
		if worked == nil && workedAfterItsEnd(c) {
			worked = c
		}
	}
	if worked != nil {
		return worked, OpenSession{}, true
	}
	return nil, OpenSession{}, false
}

// workedAfterItsEnd reports whether the control plane saw n's credential
// at work after the last end it saw of n: a heartbeat, a request, a tool
// call or a stream after its session's last end (SeenAfterSessionEnd), or
// activity after its exit was confirmed (a contradiction). Nothing of it
// need be open: the credential's holder works on by requests alone.
func workedAfterItsEnd(n *Node) bool {
	return SeenAfterSessionEnd(n) || ExitConfirmed(n) && len(n.Contradictions) > 0
}

// Beside is what the record reads, beside the node itself, of what may
// still be at work for a node whose bare claim of its exit would be
// corroborated (JudgeExitBeside).
type Beside struct {
	// Descendants: those read, a child or a deeper descendant.
	Descendants []*Node
	// OpenCall: a tool call of the node still open (in flight, or its
	// cancel not acknowledged) as the record is written, if any.
	OpenCall *CallInFlight
	// DescendantCall: a tool call of a descendant still open, if any
	// (read when no descendant's session or stream is).
	DescendantCall *CallInFlight
	// DescendantsUnread: the descendants were not read, none of them
	// found at work among what was (a claim corroborated while its record
	// was being written, past the rounds that read them): the control
	// plane cannot say none is at work.
	DescendantsUnread bool
}

// CallInFlight is a tool call of a node still open at the record: its
// gate never ended it nor acknowledged its cancel.
type CallInFlight struct {
	CallID, Tool, GateID string
	BegunAt              time.Time
	// The node the call is recorded against, and its parent.
	NodeID, ParentNodeID string
}

// JudgeExitBeside is JudgeExit with what is beside the node as read now:
// its descendants (beside.Descendants), and a call of its still open
// (beside.OpenCall). The node was
// issued each child's credential at its spawn (the Spawn's answer), and
// with it may spawn below and take each grandchild's, so what the control
// plane sees of a descendant's credential may be the node at work under
// it. A bare claim of the node's exit (no
// attestation) is not corroborated while a descendant has a session or a
// stream open (ChildAlive): a rogue parent that ended its session, claimed
// its exit and lived on through its child's revocation feed read confirmed
// by the control plane, the life put on its child alone (thirtieth pass);
// one that lived on as its grandchild, until the thirty-first. Nor while
// a descendant was seen at work after its own last end (ChildAlive): one
// that worked on by requests with an ended child's credential read
// confirmed until the thirty-third.
// Not settled: the child's end may come before the record. Nor is a bare
// claim corroborated while a call of the node is still open at the
// record: its tool may still be at work for the node, and a rogue that
// began a long call, ended its session and claimed its exit read
// confirmed, its call listed cancel_unacknowledged beside it, until the
// thirty-second pass. An agent's attestation (an ancestor outside the
// workload) is weighed against both as a bare claim is, unless a launcher
// attested too: the ancestor holds the node's credential and its
// descendants', and its word that the node exited, while a descendant or
// a call of the node was at work, read confirmed until the thirty-second
// pass; and, since the forty-eighth, against the node's own life after
// its last end (SeenAfterSessionEnd), as a bare claim is. A launcher's
// attestation is not weighed against any of them: it watched the process
// end, from outside.
func JudgeExitBeside(n *Node, inStopped func(nodeID string) bool, liveGrants []string, beside Beside) ExitVerdict {
	var v ExitVerdict
	var attestation, launcher *ExitConfirmation
	for _, c := range confirmationsOf(n) {
		if isClaim(c, inStopped) {
			if v.ClaimedBy == "" {
				v.ClaimedBy, v.ClaimedAt = c.By+" ("+c.Kind+")", c.At
			}
			continue
		}
		if attestation == nil {
			attestation = &c
		}
		if launcher == nil && c.Kind == ConfirmedByLauncher {
			launcher = &c
		}
	}
	switch {
	case v.ClaimedBy == "" && attestation == nil:
		v.UnaccountedReason = "nobody confirmed its exit"
	case len(n.Contradictions) > 0:
		v.UnaccountedReason = fmt.Sprintf("activity after its exit was confirmed contradicts the confirmation (%d recorded)", len(n.Contradictions))
		v.Settled = true
	case SessionOpen(n):
		v.UnaccountedReason = "its session is still open"
	case hasOpenStream(n):
		// A stream of its credential open now is the node alive now,
		// whatever its session's end said (StreamOpened).
		s, _ := OpenStream(n)
		v.UnaccountedReason = fmt.Sprintf("a stream of its own (its revocation feed or a termination watch, open since %s) is still open: the control plane sees the node alive while it is",
			s.OpenedAt.UTC().Format(time.RFC3339))
	case len(liveGrants) > 0:
		// At most a few named: a node may hold any number.
		v.UnaccountedReason = "a grant it held is still live: " + strings.Join(liveGrants[:min(len(liveGrants), 8)], ", ")
		if len(liveGrants) > 8 {
			v.UnaccountedReason += fmt.Sprintf(" and %d more", len(liveGrants)-8)
		}
		v.Settled = true
	case attestation != nil && launcher == nil && atWork(n, beside) != "":
		// Only agents' attestations (an ancestor outside the workload):
		// the ancestor holds the node's credential and its descendants',
		// and cannot see whether the node lives on as one of them or
		// through its call, any more than a bare claim can (the
		// thirty-second pass: it was taken whole). A launcher watched the
		// process end, from outside.
		v.UnaccountedReason = "only an attestation by " + attestation.By + " (" + attestation.Kind + "), an agent's word: " + atWork(n, beside)
	case attestation != nil && launcher == nil && SeenAfterSessionEnd(n):
		// Nor against the node's own life after its last end, any more
		// than a bare claim is (below): the ancestor holds the node's
		// credential, and its word that the node exited cannot say the
		// process ended after what the control plane saw of it. Until the
		// forty-eighth pass a rogue parent running outside the stop
		// vouched for its stopped child, whose credential the control
		// plane had seen at work after the child's last end, and the
		// record read the child CONFIRMED on the parent's word (rogue48b
		// test
		// TestRogue48BAnAncestorsAttestationIsWeighedAgainstTheNodesOwnLifeAfterItsEnd),
		// where its descendant seen so was weighed (ChildAlive).
		v.UnaccountedReason = "only an attestation by " + attestation.By + " (" + attestation.Kind + "), an agent's word: " + aliveAfterEnd(n)
	case attestation != nil:
		v.Confirmed, v.Settled = true, true
		// The word that confirms is named: a launcher's whenever one
		// attested, which nothing above weighs. Until the forty-eighth
		// pass the first attestation was, and a rogue parent that vouched
		// before the launcher was named the confirming party where its
		// word alone left the node unaccounted (rogue48b test).
		if launcher != nil {
			attestation = launcher
		}
		v.ConfirmedBy, v.ConfirmedAt = attestation.By+" ("+attestation.Kind+")", attestation.At
	case atWork(n, beside) != "":
		v.UnaccountedReason = "only a claim by " + v.ClaimedBy + ": " + atWork(n, beside)
	case SeenAfterSessionEnd(n):
		// A session's end witnesses the process's only when it was the
		// last the control plane saw of the node: a node that heartbeat
		// after it (a rogue that closed its session at once and lived on
		// without one) was alive past that end, which proves nothing about
		// the exit it claims later. After in the store's order, not by
		// the times: on etcd two replicas with their own clocks may have
		// written them.
		v.UnaccountedReason = "only a claim by " + v.ClaimedBy + ": " + aliveAfterEnd(n)
	case !n.SessionClosedAt.IsZero():
		// A bare claim, corroborated: the control plane saw the session
		// end, nothing from the node after that end but the claim, and
		// nothing since the claim.
		v.Confirmed, v.Settled = true, true
		v.ConfirmedBy, v.ConfirmedAt = ConfirmedByControlPlane, n.SessionClosedAt
		if n.SessionClosedAt.Before(v.ClaimedAt) {
			v.ConfirmedAt = v.ClaimedAt
		}
	default:
		v.UnaccountedReason = "only a claim by " + v.ClaimedBy + ": the control plane never saw the node's session end"
	}
	return v
}

// aliveAfterEnd words why n's session's end does not witness its exit:
// the control plane saw n alive after its last end (SeenAfterSessionEnd).
func aliveAfterEnd(n *Node) string {
	s := fmt.Sprintf("the control plane saw the node alive (last seen %s) after its session ended (%s), and never saw it end since",
		n.LastSeenAt.UTC().Format(time.RFC3339), n.SessionClosedAt.UTC().Format(time.RFC3339))
	if !n.LastSeenAt.After(n.SessionClosedAt) {
		s += " (each time by the clock of the replica that saw it)"
	}
	return s
}

// WeighedBeside says whether a verdict of JudgeExit rests on a word that
// JudgeExitBeside weighs against what is beside the node (Beside): a bare
// claim the control plane corroborated, or an agent's attestation (an
// ancestor outside the workload). A launcher's attestation is not weighed.
func WeighedBeside(v ExitVerdict) bool {
	return v.Confirmed && (v.ConfirmedBy == ConfirmedByControlPlane || strings.HasSuffix(v.ConfirmedBy, "("+ConfirmedByAncestor+")"))
}

// atWork words what beside n may still be at work for it — a call of its
// still open, a descendant alive — or is empty.
func atWork(n *Node, beside Beside) string {
	if c := beside.OpenCall; c != nil {
		return fmt.Sprintf("its tool call %s (%q at gate %q, begun %s) is still open: its gate neither ended it nor acknowledged its cancel, and the tool may still be at work for the node",
			c.CallID, c.Tool, c.GateID, c.BegunAt.UTC().Format(time.RFC3339))
	}
	if len(n.BelowAfterClaim) > 0 {
		return workedAfterClaim(n, n.BelowAfterClaim[0])
	}
	if w := childAlive(n, beside.Descendants); w != "" {
		return w
	}
	c := beside.DescendantCall
	if c == nil {
		if beside.DescendantsUnread {
			return "its descendants were not read: its exit came to be corroborated while its record was being written, past the rounds that read them, and none of them at work was found among the nodes read with it; the control plane cannot say that none is at work with a credential this node may hold"
		}
		return ""
	}
	call := fmt.Sprintf("tool call %s (%q at gate %q, begun %s) is still open: its gate neither ended it nor acknowledged its cancel",
		c.CallID, c.Tool, c.GateID, c.BegunAt.UTC().Format(time.RFC3339))
	if c.ParentNodeID != n.NodeID {
		return fmt.Sprintf("the %s of its descendant %s (spawned under %s), made with a credential this node may hold: it was issued its child's credential at that child's spawn, and with it may spawn below and take each credential the spawn issues; the control plane cannot tell the descendant's activity from this node's",
			call, c.NodeID, c.ParentNodeID)
	}
	return fmt.Sprintf("the %s of its child %s, made with the credential this node was issued at that child's spawn: the control plane cannot tell the child's activity from this node's",
		call, c.NodeID)
}

// childAlive words why a bare claim of n's exit is not corroborated by
// its descendants (ChildAlive), or is empty.
func childAlive(n *Node, children []*Node) string {
	c, s, ok := ChildAlive(children)
	if !ok {
		return ""
	}
	if s.SessionID == "" {
		return workedBeside(n, c)
	}
	what := "a session"
	if IsStream(s) {
		what = "a stream (its revocation feed or a termination watch)"
	}
	if c.ParentNodeID != n.NodeID {
		return fmt.Sprintf("%s of its descendant %s (spawned under %s), open since %s, is still open, with a credential this node may hold: it was issued its child's credential at that child's spawn, and with it may spawn below and take each credential the spawn issues; the control plane cannot tell the descendant's activity from this node's",
			what, c.NodeID, c.ParentNodeID, s.OpenedAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("%s of its child %s, open since %s, is still open, with the credential this node was issued at that child's spawn: the control plane cannot tell the child's activity from this node's",
		what, c.NodeID, s.OpenedAt.UTC().Format(time.RFC3339))
}

// workedBeside words a descendant c of n whose credential the control
// plane saw at work after the last end it saw of c (workedAfterItsEnd),
// nothing of it open.
func workedBeside(n, c *Node) string {
	what := fmt.Sprintf("was seen at work (last seen %s) after its session ended (%s), and never seen to end since",
		c.LastSeenAt.UTC().Format(time.RFC3339), c.SessionClosedAt.UTC().Format(time.RFC3339))
	if !SeenAfterSessionEnd(c) {
		what = fmt.Sprintf("was seen at work after its exit was confirmed (%d such activities recorded, the first %s at %s)",
			len(c.Contradictions), c.Contradictions[0].Kind, c.Contradictions[0].At.UTC().Format(time.RFC3339))
	}
	if c.ParentNodeID != n.NodeID {
		return fmt.Sprintf("its descendant %s (spawned under %s) %s, with a credential this node may hold: it was issued its child's credential at that child's spawn, and with it may spawn below and take each credential the spawn issues; the control plane cannot tell the descendant's activity from this node's",
			c.NodeID, c.ParentNodeID, what)
	}
	return fmt.Sprintf("its child %s %s, with the credential this node was issued at that child's spawn: the control plane cannot tell the child's activity from this node's",
		c.NodeID, what)
}

// workedAfterClaim words a descendant that never had a session, its
// credential served after n's exit was confirmed (NoteAtWorkAfterClaims).
func workedAfterClaim(n *Node, b BelowAfterClaim) string {
	what := fmt.Sprintf("which never had a session, had a %s served (%s) after this node's claim of its exit was stored", b.Kind, b.At.UTC().Format(time.RFC3339))
	if b.ParentNodeID != n.NodeID {
		return fmt.Sprintf("its descendant %s (spawned under %s), %s, with a credential this node may hold: it was issued its child's credential at that child's spawn, and with it may spawn below and take each credential the spawn issues; the control plane cannot tell the descendant's activity from this node's",
			b.NodeID, b.ParentNodeID, what)
	}
	return fmt.Sprintf("its child %s, %s, with the credential this node was issued at that child's spawn: the control plane cannot tell the child's activity from this node's",
		b.NodeID, what)
}
