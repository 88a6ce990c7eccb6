package tree

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/fault"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// Errors of the agent tree.
var (
	ErrNodeNotFound     = fault.New(fault.NotFound, "supervisor: node not found")
	ErrParentNotRunning = fault.New(fault.Precondition, "supervisor: parent is not running")
	ErrInvalidArgument  = fault.New(fault.Invalid, "supervisor: invalid argument")
	ErrLimit            = fault.New(fault.Exhausted, "supervisor: limit exceeded")
	ErrNodeStopping     = fault.New(fault.Precondition, "supervisor: node is stopping")
	// ErrNodeRecorded: the node is terminated, and the record that
	// accounts for it was written in the same transaction; an agent's
	// word about its exit comes too late to count (ConfirmExit).
	ErrNodeRecorded = fault.New(fault.Precondition, "supervisor: the node's termination record is written")
)

// Limits bound the tree so that one misbehaving agent cannot exhaust the
// control plane.
type Limits struct {
	MaxDepth    int // a root has depth 0
	MaxChildren int // per node
	MaxLabels   int
}

// DefaultLimits are generous for real swarms and small enough to stop a
// runaway spawner.
var DefaultLimits = Limits{MaxDepth: 32, MaxChildren: 10000, MaxLabels: 32}

// Tree is the persisted agent tree.
type Tree struct {
	Store  store.Store
	Clock  clock.Clock
	Limits Limits
	// Instance names this control-plane process in the sessions it serves
	// (see SessionOpened and CloseStaleSessions).
	Instance string
	// Observer, when set, is told of every spawn (stop rules).
	Observer Observer
}

// A node's name and its labels' keys and values are checked by hand, byte
// by byte, not with regular expressions: every spawn checks its child's
// name, and the regular expression was about 1% of the server's CPU per
// spawn. Each function accepts exactly the strings of the pattern it
// names (TestValidNamesMatchTheirPatterns compares them):
//
//	name:        ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$
//	label key:   ^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$
//	label value: ^[A-Za-z0-9._-]{0,63}$

// alnum reports whether c is an ASCII letter or digit.
func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// nameByte reports whether c may stand in a name or a label value: an
// ASCII letter or digit, '.', '_' or '-'.
func nameByte(c byte) bool { return alnum(c) || c == '.' || c == '_' || c == '-' }

// validName: 1-63 letters, digits, '.', '_' or '-', the first a letter or
// digit.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 63 || !alnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

// validLabelKey: 1-63 letters, digits, '.', '_', '/' or '-', the first
// and the last a letter or digit.
func validLabelKey(s string) bool {
	if len(s) == 0 || len(s) > 63 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !nameByte(c) && c != '/' {
			return false
		}
	}
	return true
}

// validLabelValue: up to 63 letters, digits, '.', '_' or '-'.
func validLabelValue(s string) bool {
	if len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

// ValidateNode checks a node's name and labels; errors name the field.
func (t *Tree) ValidateNode(name string, labels map[string]string) error {
	if !validName(name) {
		if name == "" {
			return fmt.Errorf("%w: name is required", ErrInvalidArgument)
		}
		return fmt.Errorf("%w: name must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidArgument)
	}
	// Operators find a node by its id, and the console's tree shows names:
	// a child named after another node's id (or any id) would read as that
	// node.
	if kind := id.Kind(name); kind != "" {
		return fmt.Errorf("%w: name must not look like an id (%s_ and 20 characters); ids are the control plane's", ErrInvalidArgument, kind)
	}
	// Nor hold one between its dots and hyphens: "<the planner's id>-helper"
	// reads, and a double-click in a browser selects, as the planner's id,
	// so an operator who copied it would stop the planner's tree.
	for part := range strings.FieldsFuncSeq(name, func(r rune) bool { return r == '.' || r == '-' }) {
		if kind := id.Kind(part); kind != "" {
			return fmt.Errorf("%w: name must not hold an id (%s_ and 20 characters between its dots and hyphens); ids are the control plane's", ErrInvalidArgument, kind)
		}
	}
	if len(labels) > t.Limits.MaxLabels {
		return fmt.Errorf("%w: labels: at most %d labels", ErrLimit, t.Limits.MaxLabels)
	}
	for k, v := range labels {
		if !validLabelKey(k) {
			return fmt.Errorf("%w: labels: key %q is not a valid label key", ErrInvalidArgument, kv.Clip(k))
		}
		if !validLabelValue(v) {
			return fmt.Errorf("%w: labels[%s]: value is not a valid label value (≤63 of letters, digits, '.', '_', '-')", ErrInvalidArgument, k)
		}
	}
	return nil
}

// Caller is who asks for a node (a spawn, a root's registration): its
// id, kept as the node's CreatedBy, and, when Standing is set, the key of
// the record of its standing, read in the transaction that writes the
// node, which Refuse is given (nil for a key that holds nothing) and may
// refuse on. The control plane sets it to the caller's token's record,
// which a revocation marks in the transaction of its tombstone: a replica
// whose revocation feed has not heard yet of a revocation another
// acknowledged admits the token, and a node it wrote then, with a
// credential of its own, outlived the revocation (rogue48c tests). Read
// in the node's transaction, it serializes with the revocation: a write
// that read it unrevoked conflicts with a revocation committed before the
// write's commit, and is tried again.
//
// A standing whose record is written only to refuse (an agent
// credential's, written by its revocation alone) is Unrecorded: it is
// expected absent (store.Expect), which on etcd is a comparison in the
// commit and no read, and read only when it is not. Otherwise a spawn
// reads it beside the parent's keys (one round trip on etcd).
type Caller struct {
	ID         string
	Standing   []byte
	Unrecorded bool
	Refuse     func(record []byte) error
}

// Refused reads c's standing in tx and returns Refuse's answer (nil
// without a Standing).
func (c Caller) Refused(tx store.ReadTxn) error {
	if c.Standing == nil {
		return nil
	}
	if c.Unrecorded {
		absent, err := store.Expect(tx, c.Standing, nil)
		if err != nil || absent {
			return err
		}
	}
	record, err := tx.Get(c.Standing)
	if errors.Is(err, store.ErrNotFound) {
		record, err = nil, nil
	}
	if err != nil {
		return err
	}
	return c.Refuse(record)
}

// RegisterRoot registers a root node.
func (t *Tree) RegisterRoot(ctx context.Context, name string, labels map[string]string, createdBy string) (*Node, error) {
	return t.RegisterRootBy(ctx, name, labels, Caller{ID: createdBy})
}

// RegisterRootBy is RegisterRoot for a caller whose standing is read in
// the transaction that writes the root (Caller).
func (t *Tree) RegisterRootBy(ctx context.Context, name string, labels map[string]string, by Caller) (*Node, error) {
	if err := t.ValidateNode(name, labels); err != nil {
		return nil, err
	}
	node := &Node{
		NodeID:    id.New(id.Node),
		Name:      name,
		Labels:    labels,
		State:     NodeStateRunning,
		CreatedAt: t.Clock.Now(),
		CreatedBy: by.ID,
		Holds:     HoldsTracked,
	}
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		if err := by.Refused(tx); err != nil {
			return err
		}
		if err := putNode(tx, node); err != nil {
			return err
		}
		return tx.Put(rootKey(node.NodeID), nil)
	})
	if err != nil {
		return nil, err
	}
	return node, nil
}

// Spawn registers a child under parentID. The parent must exist and be
// running at the moment the child is written (checked in the same
// transaction). authorize is called inside the transaction with the parent,
// so the caller's check and the write see the same state.
func (t *Tree) Spawn(ctx context.Context, parentID, name string, labels map[string]string, createdBy string, authorize func(parent *Node) error) (*Node, error) {
	return t.SpawnBy(ctx, parentID, name, labels, Caller{ID: createdBy}, authorize)
}

// SpawnBy is Spawn for a caller whose standing is read in the spawn's
// transaction (Caller, SpawnManyBy).
func (t *Tree) SpawnBy(ctx context.Context, parentID, name string, labels map[string]string, by Caller, authorize func(parent *Node) error) (*Node, error) {
	nodes, err := t.SpawnManyBy(ctx, parentID, []ChildSpec{{Name: name, Labels: labels}}, by, authorize)
	if err != nil {
		return nil, err
	}
	return nodes[0], nil
}

// ChildSpec is one child of SpawnMany: its name and labels.
type ChildSpec struct {
	Name   string
	Labels map[string]string
}

// SpawnMany registers children under parentID in one transaction, all or
// none, in the order given, each with a fresh id, with Spawn's checks: the
// parent running and authorize called with it inside the transaction,
// and the depth and fan-out limits counting every child of the call.
func (t *Tree) SpawnMany(ctx context.Context, parentID string, specs []ChildSpec, createdBy string, authorize func(parent *Node) error) ([]*Node, error) {
	return t.SpawnManyBy(ctx, parentID, specs, Caller{ID: createdBy}, authorize)
}

// SpawnManyBy is SpawnMany for a caller whose standing is read in the
// spawn's transaction, before the parent, and prefetched with it
// (Caller).
func (t *Tree) SpawnManyBy(ctx context.Context, parentID string, specs []ChildSpec, by Caller, authorize func(parent *Node) error) ([]*Node, error) {
	if err := id.Check(id.Node, "parent_node_id", parentID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: no child to spawn", ErrInvalidArgument)
	}
	ids := make([]string, len(specs))
	for i, c := range specs {
		if err := t.ValidateNode(c.Name, c.Labels); err != nil {
			return nil, err
		}
		ids[i] = id.New(id.Node)
	}
	now := t.Clock.Now()
	var out []*Node
	err := t.Store.Update(ctx, func(tx store.Txn) error {
		out = out[:0]
		// One round trip on etcd for the two reads (three with the
		// caller's standing, when it is read: Caller).
		keys := [][]byte{nodeKey(parentID), childCountKey(parentID)}
		if by.Standing != nil && !by.Unrecorded {
			keys = append(keys, by.Standing)
		}
		if err := store.Prefetch(tx, keys, nil); err != nil {
			return err
		}
		if err := by.Refused(tx); err != nil {
			return err
		}
		parent, err := getAuthorized(tx, parentID, authorize)
		if err != nil {
			return err
		}
		if parent.State != NodeStateRunning {
			return fmt.Errorf("%w: parent_node_id %s is %s", ErrParentNotRunning, parentID, StateName(parent.State))
		}
		// A termination marks its subtree top down, in chunks, and from
		// its request on no node of the subtree may spawn, however far
		// the mark has got, or whether it has begun: a stop requested on
		// the parent or an ancestor (and not marked there yet) covers it
		// as a stopping ancestor does (CoveringStopIn).
		if err := coveredParent(tx, parent); err != nil {
			return err
		}
		if len(parent.Ancestors)+1 > t.Limits.MaxDepth {
			return fmt.Errorf("%w: parent_node_id %s is at the maximum tree depth %d", ErrLimit, parentID, t.Limits.MaxDepth)
		}
		children, err := childCount(tx, parentID)
		if err != nil {
			return err
		}
		if children+uint64(len(specs)) > uint64(t.Limits.MaxChildren) {
			if len(specs) == 1 {
				return fmt.Errorf("%w: parent_node_id %s already has %d children, the maximum per node", ErrLimit, parentID, children)
			}
			return fmt.Errorf("%w: parent_node_id %s has %d children; %d more would pass the maximum of %d per node", ErrLimit, parentID, children, len(specs), t.Limits.MaxChildren)
		}
		// The parent's first child is noted on it, and on its entry in its
		// own parent's list (the child notes): a termination's mark lists
		// the children only of the nodes that may have some.
		if parent.Holds&HoldsTracked != 0 && parent.Holds&HoldsChildren == 0 && parent.ParentNodeID != "" {
			if err := tx.Put(childKey(parent.ParentNodeID, parentID), childNoteParent); err != nil {
				return err
			}
		}
		if err := NoteHoldingIn(tx, parent, HoldsChildren); err != nil {
			return err
		}
		ancestors := append(append([]string(nil), parent.Ancestors...), parentID)
		for i, c := range specs {
			child := &Node{
				NodeID:       ids[i],
				ParentNodeID: parentID,
				Ancestors:    ancestors,
				Name:         c.Name,
				Labels:       c.Labels,
				State:        NodeStateRunning,
				CreatedAt:    now,
				CreatedBy:    by.ID,
				Holds:        HoldsTracked,
			}
			if err := putNode(tx, child); err != nil {
				return err
			}
			if t.Observer != nil {
				if err := t.Observer.ObserveSpawn(tx, child); err != nil {
					return err
				}
			}
			if err := tx.Put(childKey(parentID, ids[i]), childNoteLeaf); err != nil {
				return err
			}
			out = append(out, child)
		}
		return tx.Put(childCountKey(parentID), binary.BigEndian.AppendUint64(nil, children+uint64(len(specs))))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// coveredParent refuses a running parent a stop covers before its mark
// reaches it (CoveringStopIn): one of its ancestors is stopping or stopped
// (a termination is marking, or has marked, its subtree), or a termination
// is requested on it or an ancestor and its mark has not begun there. Read
// in tx, so that the spawn serializes with the request and the mark.
func coveredParent(tx store.ReadTxn, parent *Node) error {
	cover, err := CoveringStopIn(tx, parent)
	if err != nil || cover == nil {
		return err
	}
	return fmt.Errorf("%w: parent_node_id %s: %s", ErrParentNotRunning, parent.NodeID, cover.Describe(parent.NodeID))
}

// StoppingAncestorIn returns the nearest ancestor of n that is stopping or
// stopped (draining, aborting, terminated, or exited and marked by a
// termination: StopsBelow), read in tx, or nil when none is. A
// termination marks its subtree top down, its roots in one transaction
// and their descendants in later ones: between them a node below a root
// reads running while the termination already covers it, and what a node
// being stopped may not do (spawn, begin a tool call) its unmarked
// descendants may not do either. An exited ancestor outside every
// termination stops nothing below it: children may outlive what created
// them.
func StoppingAncestorIn(tx store.ReadTxn, n *Node) (*Node, error) {
	if err := store.Prefetch(tx, store.KeysOf(n.Ancestors, nodeKey), nil); err != nil {
		return nil, err
	}
	for i := len(n.Ancestors) - 1; i >= 0; i-- {
		a := n.Ancestors[i]
		// Only the state, not the whole node: every spawn and tool call
		// reads each ancestor; the node is decoded whole only to name it.
		var state NodeState
		if err := kv.GetOf(tx, nodeKey(a), func(b []byte) (err error) { state, err = StoredState(b); return err }, ErrNodeNotFound, "", "node", a); err != nil {
			return nil, err
		}
		switch state {
		case NodeStateDraining, NodeStateAborting, NodeStateTerminated:
			return getNode(tx, a)
		case NodeStateExited:
			// Rare: decoded to learn whether a termination marked it.
			an, err := getNode(tx, a)
			if err != nil || StopsBelow(an.State, an.TerminationID) {
				return an, err
			}
		}
	}
	return nil, nil
}

// StopsBelow reports whether a node in state, naming terminationID (""
// none), covers its descendants as a stop does: it is stopping or stopped,
// or it is exited and a termination has marked it. A termination's mark
// leaves an exited node its state (it may not act, and the record weighs
// its exit), but not its subtree: else an agent that confirmed its own
// exit (its word alone) would have a stop of its subtree cover none of
// its descendants until the mark, chunks later, reached each of them.
func StopsBelow(state NodeState, terminationID string) bool {
	switch state {
	case NodeStateDraining, NodeStateAborting, NodeStateTerminated:
		return true
	case NodeStateExited:
		return terminationID != ""
	}
	return false
}

// GetUnder returns a node and, when it is running, the stop that covers
// it before its mark reaches it (CoveringStopIn; nil when none does),
// read in one snapshot: what a node being stopped may not start, a running
// node a termination covers (from its request on) may not either.
func (t *Tree) GetUnder(ctx context.Context, nodeID string) (n *Node, cover *Cover, err error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	err = t.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if n, err = getNode(tx, nodeID); err != nil {
			return err
		}
		cover = nil
		if n.State != NodeStateRunning {
			return nil
		}
		cover, err = CoveringStopIn(tx, n)
		return err
	})
	return n, cover, err
}

// childCount is how many children parentID has: the stored count, or, for
// a parent that has none stored yet (its children were spawned before the
// count existed), the children counted once. Children are never removed,
// so the count only grows, with each Spawn, in the same transaction.
func childCount(tx store.Txn, parentID string) (uint64, error) {
	v, err := tx.Get(childCountKey(parentID))
	switch {
	case err == nil && len(v) == 8:
		return binary.BigEndian.Uint64(v), nil
	case err == nil:
		return 0, fmt.Errorf("supervisor: corrupt child count of %d bytes for node %s", len(v), parentID)
	case !errors.Is(err, store.ErrNotFound):
		return 0, err
	}
	var n uint64
	err = tx.Scan(childPrefix(parentID), nil, func(_, _ []byte) error {
		n++
		return nil
	})
	return n, err
}

// Get returns one node.
func (t *Tree) Get(ctx context.Context, nodeID string) (*Node, error) {
	if err := id.Check(id.Node, "node_id", nodeID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return store.Read(ctx, t.Store, func(tx store.ReadTxn) (*Node, error) { return getNode(tx, nodeID) })
}

// Subtree returns rootID and every descendant, breadth first, from one
// consistent snapshot.
func (t *Tree) Subtree(ctx context.Context, rootID string) ([]*Node, error) {
	if err := id.Check(id.Node, "root_node_id", rootID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return store.Read(ctx, t.Store, func(tx store.ReadTxn) ([]*Node, error) { return SubtreeIn(tx, rootID) })
}

// SubtreeIn walks a subtree inside an existing transaction.
func SubtreeIn(tx store.ReadTxn, rootID string) ([]*Node, error) {
	root, err := getNode(tx, rootID)
	if err != nil {
		return nil, err
	}
	out := []*Node{root}
	// Level by level, so that each level's child lists, then its nodes,
	// are read together (store.Prefetch: one round trip per level and few
	// hundred nodes on etcd instead of two per node).
	for level := out; len(level) > 0; {
		parents := make([]string, len(level))
		for i, n := range level {
			parents[i] = n.NodeID
		}
		ids, err := kv.IDsOf(tx, parents, childPrefix)
		if err != nil {
			return nil, err
		}
		if err := store.Prefetch(tx, store.KeysOf(ids, nodeKey), nil); err != nil {
			return nil, err
		}
		next := len(out)
		for _, cid := range ids {
			c, err := getNode(tx, cid)
			if err != nil {
				return nil, fmt.Errorf("supervisor: child index names %s: %w", cid, err)
			}
			out = append(out, c)
		}
		level = out[next:]
	}
	return out, nil
}

// List returns, in id order after pageToken, at most pageSize nodes
// matching selector, reading at most maxRead nodes (maxRead < 1: no
// bound). A scan that stops at maxRead before pageSize matches answers the
// matches it found with the last node it read as next, so a rare selector
// is a number of bounded calls, not one call that reads every node (an
// agent may grow its own subtree to a hundred thousand); next is empty
// after the last node. read is how many nodes it read.
func (t *Tree) List(ctx context.Context, selector map[string]string, pageToken string, pageSize, maxRead int) (out []*Node, next string, read int, err error) {
	err = t.Store.View(ctx, func(tx store.ReadTxn) error {
		out, next, read = nil, "", 0
		var start []byte
		if pageToken != "" {
			start = append(nodeKey(pageToken), 0)
		}
		last := ""
		return tx.Scan([]byte(prefixNode), start, func(k, v []byte) error {
			if maxRead > 0 && read == maxRead {
				next = last
				return store.ErrStopScan
			}
			n := &Node{}
			if err := UnmarshalNode(v, n); err != nil {
				return fmt.Errorf("supervisor: decode %s: %w", k, err)
			}
			read++
			last = n.NodeID
			if !MatchLabels(n.Labels, selector) {
				return nil
			}
			if len(out) == pageSize {
				next = out[len(out)-1].NodeID
				return store.ErrStopScan
			}
			out = append(out, n)
			return nil
		})
	})
	return out, next, read, err
}

// ParseSelector parses "k=v,k2=v2".
func ParseSelector(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: label_selector: %q is not k=v", ErrInvalidArgument, kv.Clip(part))
		}
		out[k] = v
	}
	return out, nil
}

// MatchLabels reports whether labels contain every pair of selector.
func MatchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// IsAncestor reports whether ancestorID is a strict ancestor of n.
func IsAncestor(n *Node, ancestorID string) bool {
	for _, a := range n.Ancestors {
		if a == ancestorID {
			return true
		}
	}
	return false
}

// Root is the id of the root of n's tree (n's own for a root): agents of
// one tree share it.
func Root(n *Node) string {
	if len(n.Ancestors) > 0 {
		return n.Ancestors[0]
	}
	return n.NodeID
}

// StateName is the lower-case name of a node state.
func StateName(s NodeState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "NODE_STATE_"))
}

func getNode(tx store.ReadTxn, nodeID string) (*Node, error) {
	n := &Node{}
	if err := kv.GetOf(tx, nodeKey(nodeID), func(b []byte) error { return UnmarshalNode(b, n) }, ErrNodeNotFound, "", "node", nodeID); err != nil {
		return nil, err
	}
	return n, nil
}

// GetNodeIn reads a node inside a transaction.
func GetNodeIn(tx store.ReadTxn, nodeID string) (*Node, error) { return getNode(tx, nodeID) }

// PutNodeIn writes a node inside a transaction.
func PutNodeIn(tx store.Txn, n *Node) error { return putNode(tx, n) }

// NoteHoldingIn notes, inside the transaction that gives n (read in tx)
// a holding of kind, that n may hold one: the node is written only the
// first time (a node created before the bits were kept is left alone: it
// may hold anything). A termination's mark reads the node and, in the
// same transaction, trusts the bits, so a writer that gives a node a
// holding without noting it here would have it missed.
func NoteHoldingIn(tx store.Txn, n *Node, kind Holdings) error {
	if n.Holds.With(kind) == n.Holds {
		return nil
	}
	n.Holds = n.Holds.With(kind)
	return putNode(tx, n)
}

// NoteHolderIn notes, inside the transaction that issues it, that the node
// nodeID holds a grant (NoteHoldingIn). grantstore calls it through its
// Tree for every grant it writes.
func (t *Tree) NoteHolderIn(tx store.Txn, nodeID string) error {
	n, err := getNode(tx, nodeID)
	if err != nil {
		return err
	}
	return NoteHoldingIn(tx, n, HoldsGrants)
}

func putNode(tx store.Txn, n *Node) error {
	v, err := encodeNode(n)
	if err != nil {
		return fmt.Errorf("supervisor: encode node: %w", err)
	}
	return tx.Put(nodeKey(n.NodeID), v)
}
