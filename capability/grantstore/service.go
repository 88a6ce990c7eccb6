package grantstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/reconcile"
	"github.com/tetherhq/tether/internal/store"
)

// Audience is the aud of capability tokens. It differs from the operator
// and agent credential audiences, so a capability token is never accepted
// as a credential and a credential never as a capability token.
const Audience = "tether-tools"

// Defaults for Config fields left zero.
const (
	DefaultRootTTL       = 24 * time.Hour
	MaxRootTTL           = 366 * 24 * time.Hour
	DefaultHeartbeat     = 2 * time.Second
	DefaultMarkBatch     = 512
	DefaultPruneInterval = time.Minute
	DefaultMaxPerNode    = 256
	// maxAttempts bounds the optimistic retries of one request.
	maxAttempts = 16
)

// Config configures a Service.
type Config struct {
	Store store.Store
	// Tree is the agent tree the grants are held in; required.
	Tree  Tree
	Clock clock.Clock
	// Keys returns the current signing key ring.
	Keys func() capability.KeyRing
	// Issuer is the iss of every token ("tether").
	Issuer string
	// TokenTTL is the lifetime of minted tokens; 0 means
	// capability.DefaultTokenTTL, at most capability.MaxTokenTTL.
	TokenTTL time.Duration
	// Heartbeat is how often WatchRevocations sends the head when nothing
	// was revoked, so followers can measure their staleness.
	Heartbeat time.Duration
	// MarkBatch is how many descendants the marker writes per transaction.
	MarkBatch int
	// PruneInterval is how often the pruner looks for droppable tombstones.
	PruneInterval time.Duration
	// MaxPerNode bounds the live grants one node holds, counted apart for
	// the grants agents delegated to it and the roots operators issued it
	// (0: DefaultMaxPerNode). See makeRoom.
	MaxPerNode int
	Log        *slog.Logger
	// OnPublish, if set, sees each tombstone as this replica's feed
	// publishes it: from a live store event, or from a rescan that found
	// it past what the feed had published (its watch fell behind); not
	// from the first load. It runs on the feed's goroutine and must return
	// quickly.
	OnPublish func(capability.Tombstone)
}

// Tree is the agent tree as grantstore reads it, inside grantstore's own
// transactions: the holder of a grant, a node's subtree. controlplane wires
// in the supervisor's tree, so the capability layer never imports the
// supervisor.
type Tree interface {
	// GetNodeIn returns the node, or an error for which NodeNotFound
	// reports true when there is none.
	GetNodeIn(tx store.ReadTxn, nodeID string) (*Node, error)
	// SubtreeIn returns the node rootID and all its descendants.
	SubtreeIn(tx store.ReadTxn, rootID string) ([]*Node, error)
	// NodeNotFound reports whether err says that a node does not exist.
	NodeNotFound(err error) bool
	HolderNoter
}

// StopCoverer is implemented by a Tree that knows, beside the nodes'
// states, of the stops requested on a node or its ancestors whose mark
// has not reached them yet (the agent tree's stop-request notes): from a
// stop's request on, no node of its subtree takes a fresh token, a grant,
// or arms anyone, however far the mark has got or whether it has begun.
// A Tree without it is judged by the states of a node's ancestors alone.
type StopCoverer interface {
	// StopCoveringIn describes, read in tx, the stop that covers the
	// running node n before its mark reaches it (a stopping or stopped
	// ancestor, or a stop requested on n or an ancestor), or returns ""
	// when none does.
	StopCoveringIn(tx store.ReadTxn, n *Node) (string, error)
}

// HolderNoter notes, inside the transaction that writes a new grant, that
// its holder node holds one (the agent tree keeps a bit per node, so that a
// termination reads the holder index only of the nodes that may hold a
// grant). Every writer of a new grant must call it: a grant written
// without it could be missed by the termination of its holder.
type HolderNoter interface {
	NoteHolderIn(tx store.Txn, nodeID string) error
}

// Node is what grantstore reads of an agent-tree node.
type Node struct {
	NodeID string
	// Ancestors, root first, excluding the node itself.
	Ancestors []string
	// State as messages show it: NodeRunning, NodeTerminated, or another
	// ("draining", "aborting", "exited").
	State string
}

// Node states grantstore tells apart.
const (
	NodeRunning    = "running"
	NodeTerminated = "terminated"
	NodeExited     = "exited"
)

// Service is the store-backed capability tree: it persists grants,
// tombstones and the revocation feed, and runs the background work that
// keeps them tidy (RunFeed, RunMarker, RunPruner). See the package
// documentation for the key layout and the protocols.
type Service struct {
	cfg        Config
	minter     capability.Minter
	verifier   capability.Verifier
	verified   *verifiedTokens // tokens Introspect verified (verified.go)
	tombstones *capability.TombstoneSet
	feed       *feed
	marker     *reconcile.Loop
}

// New builds a Service. Nothing runs until RunFeed, RunMarker and
// RunPruner are started.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Keys == nil || cfg.Tree == nil {
		return nil, errors.New("grantstore: a store, a key ring and the agent tree are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Issuer == "" {
		cfg.Issuer = "tether"
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = capability.DefaultTokenTTL
	}
	if cfg.TokenTTL < 0 || cfg.TokenTTL > capability.MaxTokenTTL {
		return nil, fmt.Errorf("grantstore: token ttl %s is out of range: want more than 0s and at most %s", cfg.TokenTTL, capability.MaxTokenTTL)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.MarkBatch <= 0 {
		cfg.MarkBatch = DefaultMarkBatch
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = DefaultPruneInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	minter, err := capability.NewMinter(cfg.Issuer, Audience)
	if err != nil {
		return nil, err
	}
	verifier, err := capability.NewVerifier(cfg.Issuer, Audience, capability.DefaultLeeway)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:        cfg,
		minter:     minter,
		verifier:   verifier,
		verified:   newVerifiedTokens(),
		tombstones: &capability.TombstoneSet{},
		feed:       newFeed(),
	}
	s.marker = s.newMarker()
	return s, nil
}

// Tombstones is the service's own tombstone set, fed by RunFeed.
func (s *Service) Tombstones() *capability.TombstoneSet { return s.tombstones }

// Caller is the authenticated principal of a request, as the capability
// core names it.
type Caller struct {
	// Principal is "operator:<subject>" or "agent:<node id>".
	Principal string
	// Roles are capability.RoleSecurity and capability.RoleAdmin when the
	// operator holds them; other entries are ignored by the core.
	Roles []string
	// Standing, when set, is called in the transaction that writes a
	// grant the caller asks for (IssueRoot, Delegate), which it refuses
	// with Standing's error: the control plane reads there the caller's
	// token's record (tree.Caller), which a revocation on another replica
	// marks before this one's revocation feed may deliver it; a grant
	// written in that delay outlived the revocation (rogue48c test).
	Standing func(tx store.ReadTxn) error
}

// standing is c.Standing's answer in tx (nil when it is not set).
func (c Caller) standing(tx store.ReadTxn) error {
	if c.Standing == nil {
		return nil
	}
	return c.Standing(tx)
}

// agentNode returns the caller's node id when the caller is an agent.
func (c Caller) agentNode() (string, bool) {
	return strings.CutPrefix(c.Principal, capability.AgentPrefix)
}

// Issued is a grant with a freshly minted token.
type Issued struct {
	Grant          capability.Grant
	Token          string
	TokenExpiresAt time.Time
}

// RootRequest asks for a root grant.
type RootRequest struct {
	HolderNodeID string
	Scopes       []string
	// TTL is the grant's lifetime; 0 means DefaultRootTTL.
	TTL time.Duration
}

// IssueRoot issues a root grant to a running node. Only operators issue
// roots. The grant is durable before the token is returned.
func (s *Service) IssueRoot(ctx context.Context, caller Caller, req RootRequest) (Issued, error) {
	if _, isAgent := caller.agentNode(); isAgent || !strings.HasPrefix(caller.Principal, capability.OperatorPrefix) {
		return Issued{}, fmt.Errorf("%w: agents delegate from a grant they hold; root grants are issued by operators", ErrOperatorOnly)
	}
	if err := checkID(id.Node, "holder_node_id", req.HolderNodeID); err != nil {
		return Issued{}, err
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = DefaultRootTTL
	}
	if ttl < 0 || ttl > MaxRootTTL {
		return Issued{}, fmt.Errorf("%w: ttl %s is out of range: want more than 0s and at most %s", capability.ErrInvalidTTL, ttl, MaxRootTTL)
	}
	now := s.cfg.Clock.Now()
	g, err := capability.NewRoot(capability.RootRequest{
		GrantID: id.New(id.Grant), Issuer: caller.Principal, HolderNodeID: req.HolderNodeID, Scopes: req.Scopes, TTL: ttl,
	}, now)
	if err != nil {
		return Issued{}, err
	}
	// The holder's tree, for the token's root claim (a node's ancestors
	// never change; the write below checks it is running).
	var root string
	if err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		root, err = s.lineageOf(tx, req.HolderNodeID)
		return err
	}); err != nil {
		return Issued{}, err
	}
	// Minted before the write, so a signing failure changes nothing; it is
	// returned only once the grant is durable.
	token, exp, err := s.minter.MintInTree(s.cfg.Keys(), g, root, now, s.cfg.TokenTTL)
	if err != nil {
		return Issued{}, err
	}
	err = s.cfg.Store.Update(ctx, func(tx store.Txn) error {
		if err := caller.standing(tx); err != nil {
			return err
		}
		if err := s.requireRunning(tx, req.HolderNodeID, "holder_node_id"); err != nil {
			return err
		}
		if err := s.makeRoom(tx, g, now, nil); err != nil {
			return err
		}
		return putGrant(tx, s.cfg.Tree, g, true)
	})
	if err != nil {
		return Issued{}, err
	}
	return Issued{Grant: g, Token: token, TokenExpiresAt: exp}, nil
}

// DelegateRequest asks the holder of a grant to derive a narrower one.
type DelegateRequest struct {
	ParentGrantID string
	HolderNodeID  string
	Scopes        []string
	// TTL 0 inherits the parent's expiry; a TTL that outlives the parent
	// is refused.
	TTL time.Duration
	// Charge, when set, is told how many grants the holder's bound read
	// (makeRoom: once the holder's index names MaxPerNode, every grant it
	// names and their chains, whatever the delegation then does, refused
	// or not; nothing below that); an error refuses the delegation with
	// it. The
	// server charges the caller's rate budget, as for a listing
	// (ListQuery.Charge).
	Charge func(read int) error
}

// Delegate derives a grant from one the calling agent holds, for a running
// node in the caller's subtree, after checking the parent's whole chain.
// Operators do not delegate: they issue roots (ErrAgentOnly).
//
// The decision is made on a snapshot, outside the store's committer; the
// write then checks that none of the grants and nodes it was based on
// changed, and starts over if one did.
func (s *Service) Delegate(ctx context.Context, caller Caller, req DelegateRequest) (Issued, error) {
	callerNode, isAgent := caller.agentNode()
	if !isAgent {
		return Issued{}, fmt.Errorf("%w: operators issue root grants (IssueRoot); only the agent holding parent_grant_id may delegate from it", ErrAgentOnly)
	}
	if err := checkID(id.Grant, "parent_grant_id", req.ParentGrantID); err != nil {
		return Issued{}, err
	}
	if err := checkID(id.Node, "holder_node_id", req.HolderNodeID); err != nil {
		return Issued{}, err
	}
	grantID := id.New(id.Grant)
	for range maxAttempts {
		now := s.cfg.Clock.Now()
		var (
			g     capability.Grant
			root  string
			reads *reader
		)
		err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
			reads = newReader(tx)
			parent, ok := reads.grant(req.ParentGrantID)
			if err := reads.failed(); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: parent_grant_id %s", capability.ErrUnknownGrant, req.ParentGrantID)
			}
			if parent.HolderNodeID != callerNode {
				// Checked before the chain so a non-holder learns nothing
				// about the state of grants it does not hold; a grant
				// outside its subtree is answered as one that does not
				// exist, without its holder.
				if err := s.visible(tx, caller, parent.HolderNodeID); errors.Is(err, ErrNotVisible) {
					return fmt.Errorf("%w: parent_grant_id %s", capability.ErrUnknownGrant, req.ParentGrantID)
				} else if err != nil {
					return err
				}
				return fmt.Errorf("%w: grant %s is held by %s", capability.ErrNotHolder, parent.GrantID, capability.AgentPrincipal(parent.HolderNodeID))
			}
			if v := capability.CheckGrant(parent, s.tombstones, reads.grant, now); !v.Active {
				if err := reads.failed(); err != nil {
					return err
				}
				return v.Err
			}
			if err := s.requireRunning(tx, callerNode, "the delegating node"); err != nil {
				return err
			}
			holder, err := s.cfg.Tree.GetNodeIn(tx, req.HolderNodeID)
			// Outside the caller's subtree before its state: another
			// tree's node is refused the same way whatever its state, and
			// so is an id that names no node (no node's ancestors include
			// the caller), so the refusal never says which ids exist.
			if s.cfg.Tree.NodeNotFound(err) || err == nil && req.HolderNodeID != callerNode && !slices.Contains(holder.Ancestors, callerNode) {
				return fmt.Errorf("%w: node %s is not a descendant of %s", capability.ErrNotInSubtree, req.HolderNodeID, callerNode)
			}
			if err != nil {
				return err
			}
			if err := s.running(tx, holder, "holder_node_id"); err != nil {
				return err
			}
			root = holder.NodeID
			if len(holder.Ancestors) > 0 {
				root = holder.Ancestors[0]
			}
			g, err = capability.Delegate(parent, capability.DelegateRequest{
				GrantID: grantID, Issuer: caller.Principal, HolderNodeID: req.HolderNodeID, Scopes: req.Scopes, TTL: req.TTL,
			}, holder.Ancestors, now)
			return err
		})
		if err != nil {
			return Issued{}, err
		}
		token, exp, err := s.minter.MintInTree(s.cfg.Keys(), g, root, now, s.cfg.TokenTTL)
		if err != nil {
			return Issued{}, err
		}
		stale := false
		err = s.cfg.Store.Update(ctx, func(tx store.Txn) error {
			stale = false
			if changed, err := reads.changed(tx); err != nil || changed {
				stale = true
				return err
			}
			if err := caller.standing(tx); err != nil {
				return err
			}
			// Nodes change for reasons that do not matter here (heartbeats),
			// so they are re-checked by meaning rather than by bytes.
			if err := s.requireRunning(tx, callerNode, "the delegating node"); err != nil {
				return err
			}
			holder, err := s.cfg.Tree.GetNodeIn(tx, req.HolderNodeID)
			if err != nil {
				return err
			}
			if !slices.Contains(holder.Ancestors, callerNode) {
				stale = true
				return nil
			}
			if err := s.running(tx, holder, "holder_node_id"); errors.Is(err, ErrNodeNotRunning) {
				stale = true
				return nil
			} else if err != nil {
				return err
			}
			if err := s.makeRoom(tx, g, now, req.Charge); err != nil {
				return err
			}
			return putGrant(tx, s.cfg.Tree, g, true)
		})
		if err != nil {
			return Issued{}, err
		}
		if !stale {
			return Issued{Grant: g, Token: token, TokenExpiresAt: exp}, nil
		}
	}
	return Issued{}, fmt.Errorf("%w: delegating from %s", ErrContended, req.ParentGrantID)
}

// Refresh mints a fresh token for a grant after checking it and its whole
// chain: stored states, tombstones and expiry. The holder agent refreshes
// its own grants; operators may refresh any. It writes nothing.
func (s *Service) Refresh(ctx context.Context, caller Caller, grantID string) (Issued, error) {
	if err := checkID(id.Grant, "grant_id", grantID); err != nil {
		return Issued{}, err
	}
	now := s.cfg.Clock.Now()
	var (
		g    capability.Grant
		root string
	)
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		reads := newReader(tx)
		var ok bool
		g, ok = reads.grant(grantID)
		if err := reads.failed(); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, grantID)
		}
		if node, isAgent := caller.agentNode(); isAgent && node != g.HolderNodeID {
			if err := s.visible(tx, caller, g.HolderNodeID); errors.Is(err, ErrNotVisible) {
				// Answered as a grant that does not exist (as Get does),
				// without its holder: an agent learns neither whether
				// another tree's grant exists nor who holds it.
				return fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, grantID)
			} else if err != nil {
				return err
			}
			return fmt.Errorf("%w: grant %s is held by %s; only its holder refreshes it", capability.ErrNotHolder, grantID, capability.AgentPrincipal(g.HolderNodeID))
		}
		if v := capability.CheckGrant(g, s.tombstones, reads.grant, now); !v.Active {
			if err := reads.failed(); err != nil {
				return err
			}
			return v.Err
		}
		n, err := s.cfg.Tree.GetNodeIn(tx, g.HolderNodeID)
		if s.cfg.Tree.NodeNotFound(err) {
			return fmt.Errorf("%w: holder node %s of grant %s is unknown", ErrNodeNotRunning, g.HolderNodeID, grantID)
		}
		if err != nil {
			return err
		}
		root = n.NodeID
		if len(n.Ancestors) > 0 {
			root = n.Ancestors[0]
		}
		// A node being stopped (draining, aborting), stopped or exited
		// gets no fresh token, from anyone: draining refuses new tool
		// calls, and at a tool that checks tokens offline (never asking
		// the ledger) the token's few minutes are the only bound until
		// the termination revokes the grant.
		if n.State != NodeRunning {
			return fmt.Errorf("%w: holder node %s of grant %s is %s: a node being stopped, stopped or exited gets no fresh token (the one it holds lives until its expiry, and the termination revokes the grant)", ErrNodeNotRunning, g.HolderNodeID, grantID, n.State)
		}
		// Nor does a node a termination covers before its mark reaches it
		// (requested, or marking top down, in chunks).
		cover, err := s.coveredBy(tx, n)
		if err != nil {
			return err
		}
		if cover != "" {
			return fmt.Errorf("%w: holder node %s of grant %s: %s: a node being stopped, stopped or exited gets no fresh token (the one it holds lives until its expiry, and the termination revokes the grant)", ErrNodeNotRunning, g.HolderNodeID, grantID, cover)
		}
		return nil
	})
	if err != nil {
		return Issued{}, err
	}
	token, exp, err := s.minter.MintInTree(s.cfg.Keys(), g, root, now, s.cfg.TokenTTL)
	if err != nil {
		return Issued{}, err
	}
	return Issued{Grant: g, Token: token, TokenExpiresAt: exp}, nil
}

// Get returns a grant in its effective state (see effective). Agents see
// only grants held in their own subtree; another is capability.ErrUnknownGrant,
// as a grant that does not exist.
func (s *Service) Get(ctx context.Context, caller Caller, grantID string) (capability.Grant, error) {
	if err := checkID(id.Grant, "grant_id", grantID); err != nil {
		return capability.Grant{}, err
	}
	now := s.cfg.Clock.Now()
	var g capability.Grant
	err := s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		reads := newReader(tx)
		stored, ok := reads.grant(grantID)
		if err := reads.failed(); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, grantID)
		}
		if err := s.visible(tx, caller, stored.HolderNodeID); err != nil {
			if errors.Is(err, ErrNotVisible) {
				// Answered as a grant that does not exist, so an agent
				// cannot learn by its id whether a grant outside its
				// subtree exists.
				return fmt.Errorf("%w: grant_id %s", capability.ErrUnknownGrant, grantID)
			}
			return err
		}
		g = effective(stored, reads.grant, now)
		return reads.failed()
	})
	return g, err
}

// effective is a grant as the API shows it: a stored grant covered by a
// revoked ancestor is shown as the marker will store it (see covered) even
// before the marker has rewritten it, and an active grant past its expiry
// is shown expired. Because covered is also the marker's rule, it gives the
// same answer before and after marking.
func effective(g capability.Grant, lookup capability.GrantLookup, now time.Time) capability.Grant {
	if marked, ok, _ := covered(g, lookup); ok {
		return marked
	}
	if g.StateAt(now) == capability.StateExpired {
		g.State = capability.StateExpired
	}
	return g
}

// stoppingAncestor returns n's nearest ancestor that is being stopped or
// stopped (draining, aborting, terminated), or nil. A termination marks its
// subtree top down, in chunks: between its roots' chunk and the one that
// reaches n, n reads running while the termination already covers it. An
// exited ancestor stops nothing below it.
func (s *Service) stoppingAncestor(tx store.ReadTxn, n *Node) (*Node, error) {
	if p, ok := s.cfg.Tree.(nodePrefetcher); ok && len(n.Ancestors) > 0 {
		if err := p.PrefetchNodesIn(tx, n.Ancestors); err != nil {
			return nil, err
		}
	}
	for i := len(n.Ancestors) - 1; i >= 0; i-- {
		a, err := s.cfg.Tree.GetNodeIn(tx, n.Ancestors[i])
		if err != nil {
			return nil, err
		}
		if a.State != NodeRunning && a.State != NodeExited {
			return a, nil
		}
	}
	return nil, nil
}

// coveredBy describes the stop that covers n, a running node, before its
// mark reaches it, or returns "" (StopCoverer when the Tree is one, else
// a stopping ancestor).
func (s *Service) coveredBy(tx store.ReadTxn, n *Node) (string, error) {
	if c, ok := s.cfg.Tree.(StopCoverer); ok {
		return c.StopCoveringIn(tx, n)
	}
	above, err := s.stoppingAncestor(tx, n)
	if err != nil || above == nil {
		return "", err
	}
	return fmt.Sprintf("node %s is below %s, which is %s", n.NodeID, above.NodeID, above.State), nil
}

// requireRunning refuses a node that is unknown or not running.
func (s *Service) requireRunning(tx store.ReadTxn, nodeID, what string) error {
	n, err := s.cfg.Tree.GetNodeIn(tx, nodeID)
	if err != nil {
		return err
	}
	return s.running(tx, n, what)
}

// running refuses a node that is not running, or that a termination covers
// before its mark reaches it (coveredBy): neither is armed with a new
// grant, nor arms anyone.
func (s *Service) running(tx store.ReadTxn, n *Node, what string) error {
	if n.State != NodeRunning {
		return fmt.Errorf("%w: %s %s is %s", ErrNodeNotRunning, what, n.NodeID, n.State)
	}
	cover, err := s.coveredBy(tx, n)
	if err != nil {
		return err
	}
	if cover != "" {
		return fmt.Errorf("%w: %s %s: %s", ErrNodeNotRunning, what, n.NodeID, cover)
	}
	return nil
}

// visible returns nil when the caller may read grants held by holderNodeID:
// operators read everything, an agent reads its own subtree.
func (s *Service) visible(tx store.ReadTxn, caller Caller, holderNodeID string) error {
	node, isAgent := caller.agentNode()
	if !isAgent || node == holderNodeID {
		return nil
	}
	holder, err := s.cfg.Tree.GetNodeIn(tx, holderNodeID)
	if err == nil && slices.Contains(holder.Ancestors, node) {
		return nil
	}
	if err != nil && !s.cfg.Tree.NodeNotFound(err) {
		return err
	}
	return fmt.Errorf("%w: agent %s may read only grants held in its own subtree, not by node %s", ErrNotVisible, node, holderNodeID)
}

func checkID(kind, field, value string) error {
	if err := id.Check(kind, field, value); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// reader reads grants in one transaction and remembers the bytes it saw,
// so that a later Update can confirm nothing it based a decision on has
// changed (optimistic concurrency). Decisions are made outside the store's
// committer, whose time every writer shares. Lookup errors other than "not
// found" are kept and reported by failed, as a GrantLookup cannot return
// them.
type reader struct {
	tx    store.ReadTxn
	seen  map[string][]byte // nil value: read and not found
	cache map[string]capability.Grant
	err   error
}

func newReader(tx store.ReadTxn) *reader {
	return &reader{tx: tx, seen: map[string][]byte{}, cache: map[string]capability.Grant{}}
}

// grant is a capability.GrantLookup.
func (r *reader) grant(grantID string) (capability.Grant, bool) {
	if g, ok := r.cache[grantID]; ok {
		return g, true
	}
	if raw, ok := r.seen[grantID]; ok && raw == nil {
		return capability.Grant{}, false
	}
	g, raw, err := getGrant(r.tx, grantID)
	switch {
	case errors.Is(err, capability.ErrUnknownGrant):
		r.seen[grantID] = nil
		return capability.Grant{}, false
	case err != nil:
		if r.err == nil {
			r.err = err
		}
		return capability.Grant{}, false
	}
	r.seen[grantID], r.cache[grantID] = raw, g
	return g, true
}

func (r *reader) failed() error { return r.err }

// indexed reads a grant an index names: a grant missing is corruption.
func (r *reader) indexed(grantID string) (capability.Grant, error) {
	if g, ok := r.grant(grantID); ok {
		return g, nil
	}
	if err := r.failed(); err != nil {
		return capability.Grant{}, err
	}
	return capability.Grant{}, fmt.Errorf("%w: an index names missing grant %s", ErrCorrupt, grantID)
}

// changed reports whether any grant read differs in tx.
func (r *reader) changed(tx store.ReadTxn) (bool, error) {
	for grantID, was := range r.seen {
		now, err := tx.Get(grantKey(grantID))
		switch {
		case errors.Is(err, store.ErrNotFound):
			if was != nil {
				return true, nil
			}
		case err != nil:
			return false, err
		case was == nil || !bytes.Equal(now, was):
			return true, nil
		}
	}
	return false, nil
}
