package privilege

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetherhq/tether/internal/fault"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Privilege outcomes, as they appear in the record.
const (
	OutcomeRevoked      = capability.OutcomeRevoked
	OutcomeExpired      = capability.OutcomeExpired
	OutcomeRevokeFailed = "revoke_failed"
)

// Privilege is a temporary privilege held by a node outside Tether — a file
// lock, a queue reservation, a cloud credential — registered so that a
// termination revokes it.
type Privilege struct {
	ID         string    `json:"privilege_id"`
	NodeID     string    `json:"node_id"`
	GrantID    string    `json:"grant_id,omitempty"`
	Kind       string    `json:"kind"`
	ExternalID string    `json:"external_id"`
	ExpiresAt  time.Time `json:"expires_at"`
	RevokeURL  string    `json:"revoke_url,omitempty"`
	// ByOperator: an operator registered it, not the agent. Agents' and
	// operators' privileges count apart against MaxPerNode, so an agent
	// filling its node's room cannot keep its operator's privilege (the
	// one a termination must revoke) from being registered. A privilege
	// stored before this was kept counts as the agent's.
	ByOperator bool `json:"by_operator,omitempty"`
	// RegisteredBy is the registrant's principal id, for the record: an
	// expiry an agent declared is the agent's word. Empty for a privilege
	// stored before it was kept.
	RegisteredBy string `json:"registered_by,omitempty"`
	// Outcome is set once, when a termination dealt with the privilege.
	Outcome   string    `json:"outcome,omitempty"`
	Error     string    `json:"error,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// PrivilegeRevoker revokes privileges of one kind in process.
type PrivilegeRevoker interface {
	RevokePrivilege(ctx context.Context, p Privilege) error
}

// Privileges is the registry of temporary privileges and their revocation
// handlers: in-process revokers by kind, or an HTTP webhook per privilege.
//
// Nothing the workload registers can hold a termination hostage: a revoke
// webhook may only point at a destination the operator allowed
// (AllowHooks), a node holds at most MaxPerNode live privileges of agents'
// registering (and as many of operators'), and a
// termination's revocations run in parallel off the reconciler's path
// (Dispatch), each bounded by the termination's hook deadline, redirects
// never followed. What has not answered by the deadline is revoke_failed
// in the record.
type Privileges struct {
	Store    store.Store
	Clock    clock.Clock
	Handlers map[string]PrivilegeRevoker
	// HTTP calls the webhooks (its redirect policy is replaced: a
	// redirect is never followed). Nil: a default client.
	HTTP *http.Client
	// AllowHooks are the destinations a revoke_url may name: a host
	// ("hooks.internal", any port), a host and port ("hooks.internal:8443")
	// or a URL prefix ("https://hooks.internal/revoke/"). Empty: none.
	AllowHooks []string
	// MaxPerNode bounds the live (unexpired) privileges of one node, per
	// registrant (its agents', its operators'), and so the expired ones
	// it keeps listed (a registration drops the oldest past it); zero
	// means DefaultMaxPrivilegesPerNode.
	MaxPerNode int
	// Concurrency bounds the revocations in flight per termination; zero
	// means DefaultHookConcurrency.
	Concurrency int
	Log         *slog.Logger

	mu       sync.Mutex
	inFlight map[string]bool // privilege ids being revoked now
	// waiting holds the privileges queued for a hook slot and not called
	// (yet): the record tells one never called from one whose hook did
	// not answer (NotCalled). A mark goes when its hook is called, when
	// its dispatch is cancelled, or when its node's record is written
	// (Forget).
	waiting map[string]map[string]waitMark // by node, then privilege id
}

// waitMark is a queued privilege's: the slots its termination had, and
// whether its revocation began before the control plane
// restarted (an earlier process may have called its hook).
type waitMark struct {
	slots   int
	resumed bool
}

// kindPattern is the syntax of a privilege's kind (a tool name's).
var kindPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// decideBatch bounds the privileges one transaction decides expired.
const decideBatch = 256

// Defaults of the privilege registry.
const (
	DefaultMaxPrivilegesPerNode = 64
	DefaultHookConcurrency      = 32
)

// ErrHookNotAllowed refuses a revoke_url outside the operator's allow-list.
var ErrHookNotAllowed = fault.New(fault.Denied, "supervisor: revoke_url destination not allowed")

// ErrNodeNotRunning refuses a privilege for a node that is stopping or
// stopped: a termination already revoked (or is revoking) what it held.
var ErrNodeNotRunning = fault.New(fault.Precondition, "supervisor: node is not running")

// HookAllowFlag names the serve flag that sets AllowHooks, for messages.
const HookAllowFlag = "tether serve --privilege-hook-allow"

// CheckHookURL checks a revoke_url: http or https, no credentials in it,
// and a destination on the allow-list. Its errors never quote the URL (it
// may carry a secret), only its host.
func (r *Privileges) CheckHookURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: revoke_url must be an http or https URL", tree.ErrInvalidArgument)
	}
	if u.User != nil {
		return fmt.Errorf("%w: revoke_url must not carry credentials", tree.ErrInvalidArgument)
	}
	// An allowed URL prefix confines the path: a dot segment or a
	// backslash (plain or percent-encoded; u.Path is decoded) would climb
	// out of it on a server that normalises paths.
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." || strings.Contains(seg, "\\") {
			return fmt.Errorf("%w: revoke_url's path must not contain '.' or '..' segments or backslashes", tree.ErrInvalidArgument)
		}
	}
	if !hookAllowed(r.AllowHooks, u) {
		return fmt.Errorf("%w: revoke_url's destination %q is not on the operator's allow-list (%s); ask an operator to allow it", ErrHookNotAllowed, u.Host, HookAllowFlag)
	}
	return nil
}

// hookAllowed matches u against the allow-list entries.
func hookAllowed(allow []string, u *url.URL) bool {
	for _, a := range allow {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if strings.Contains(a, "://") {
			// A URL prefix ends at a path boundary: "https://h/revoke"
			// allows "https://h/revoke/x", never "https://h/revoked" nor
			// "https://h.evil/".
			p, err := url.Parse(a)
			if err != nil || !strings.EqualFold(p.Scheme, u.Scheme) || !strings.EqualFold(p.Host, u.Host) {
				continue
			}
			prefix := strings.TrimSuffix(p.EscapedPath(), "/")
			path := u.EscapedPath()
			if prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/") {
				return true
			}
			continue
		}
		if strings.Contains(a, ":") {
			if strings.EqualFold(a, u.Host) {
				return true
			}
			continue
		}
		if strings.EqualFold(a, u.Hostname()) {
			return true
		}
	}
	return false
}

// Register records a privilege held by a running node.
func (r *Privileges) Register(ctx context.Context, p Privilege) (Privilege, error) {
	if err := id.Check(id.Node, "node_id", p.NodeID); err != nil {
		return p, fmt.Errorf("%w: %v", tree.ErrInvalidArgument, err)
	}
	if !kindPattern.MatchString(p.Kind) {
		return p, fmt.Errorf("%w: kind must be 1-128 characters of letters, digits and . _ : / -", tree.ErrInvalidArgument)
	}
	if p.ExternalID == "" || len(p.ExternalID) > 512 {
		return p, fmt.Errorf("%w: external_id must be 1-512 bytes", tree.ErrInvalidArgument)
	}
	now := r.Clock.Now()
	if p.ExpiresAt.IsZero() || !p.ExpiresAt.After(now) {
		return p, fmt.Errorf("%w: expires_at must be in the future", tree.ErrInvalidArgument)
	}
	if p.RevokeURL != "" {
		if len(p.RevokeURL) > 2048 {
			return p, fmt.Errorf("%w: revoke_url is longer than 2048 bytes", tree.ErrInvalidArgument)
		}
		if err := r.CheckHookURL(p.RevokeURL); err != nil {
			return p, err
		}
	} else if _, ok := r.Handlers[p.Kind]; !ok {
		return p, fmt.Errorf("%w: kind %q has no revocation handler; give a revoke_url", tree.ErrInvalidArgument, p.Kind)
	}
	p.ID = id.New(id.Privilege)
	p.Outcome, p.Error = "", ""
	limit := r.maxPerNode()
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		n, err := tree.GetNodeIn(tx, p.NodeID)
		if err != nil {
			return err
		}
		if n.State != tree.NodeStateRunning {
			return fmt.Errorf("%w: node_id %s is %s; a privilege is registered only for a running node", ErrNodeNotRunning, p.NodeID, tree.StateName(n.State))
		}
		// Nor for one a termination covers before its mark, top down,
		// reaches it (from its request on).
		cover, err := tree.CoveringStopIn(tx, n)
		if err != nil {
			return err
		}
		if cover != nil {
			return fmt.Errorf("%w: %s; a privilege is registered only for a running node", ErrNodeNotRunning, cover.Describe(p.NodeID))
		}
		held, err := PrivilegesIn(tx, []string{p.NodeID})
		if err != nil {
			return err
		}
		live := 0
		var expired []Privilege
		for _, h := range held {
			switch {
			case h.Outcome != "" || h.ByOperator != p.ByOperator:
			case now.Before(h.ExpiresAt):
				live++
			default:
				expired = append(expired, h)
			}
		}
		// The bound is on live privileges, and one that expired stays
		// listed for its node until a termination decides it: a node kept
		// only the newest limit expired ones of its registrant's, so that
		// registering short-lived privileges over and over cannot grow its
		// list (read by every registration, listed whole, and decided in
		// its termination's transactions) without bound.
		if over := len(expired) - limit; over > 0 {
			slices.SortFunc(expired, func(a, b Privilege) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
			for _, h := range expired[:over] {
				if err := tx.Delete(nodePrivKey(h.NodeID, h.ID)); err != nil {
					return err
				}
				if err := tx.Delete(privilegeKey(h.ID)); err != nil {
					return err
				}
			}
		}
		if live >= limit {
			who := "agents"
			if p.ByOperator {
				who = "operators"
			}
			return fmt.Errorf("%w: node_id %s already holds %d unexpired privileges registered by %s, the maximum per node (tether serve --privilege-max-per-node)", tree.ErrLimit, p.NodeID, live, who)
		}
		if err := kv.PutJSON(tx, privilegeKey(p.ID), p); err != nil {
			return err
		}
		if err := tree.NoteHoldingIn(tx, n, tree.HoldsPrivileges); err != nil {
			return err
		}
		return tx.Put(nodePrivKey(p.NodeID, p.ID), nil)
	})
	return p, err
}

func (r *Privileges) maxPerNode() int {
	if r.MaxPerNode > 0 {
		return r.MaxPerNode
	}
	return DefaultMaxPrivilegesPerNode
}

// PrivilegesIn lists the privileges of the nodes.
func PrivilegesIn(tx store.ReadTxn, nodeIDs []string) ([]Privilege, error) {
	ids, err := kv.IDsOf(tx, nodeIDs, nodePrivPrefix)
	if err != nil {
		return nil, err
	}
	// The privileges themselves, fetched together too.
	return ByID(tx, ids)
}

// Dispatch starts revoking every undecided privilege of the nodes and
// returns at once: the calls run in parallel (at most Concurrency at a
// time, taking the tree's branches in turn so one subtree's hooks cannot
// starve another's: treeBranch), off the reconciler's path, each bounded by deadline (on the
// registry's clock; the HTTP call gets a context deadline of the time left).
// Each outcome is persisted as it is decided, and never over one already
// decided (the record decides, at the deadline, what has not answered). A
// privilege past its expiry is decided expired without a call. Dispatch is
// idempotent: a privilege being revoked is not started twice, nor one
// decided since the caller read it (DispatchRead reads again), and after a
// restart the reconciler calls Resume for what is undecided. ctx
// bounds the calls' lifetime (the reconciler's); decided, when set, is
// called after each outcome is persisted.
func (r *Privileges) Dispatch(ctx context.Context, nodeIDs []string, deadline time.Time, decided func()) error {
	return r.DispatchBegun(ctx, nodeIDs, r.Clock.Now(), deadline, false, decided)
}

// DispatchBegun is Dispatch of a revocation that began at began (a
// termination's chunk of it, started again after a restart before the
// chunk committed): a privilege is decided expired only if it had expired
// by then, as it would have been had the chunk committed; one live then is
// called, whatever its declared expiry now. again says the revocation
// began before this call was made (the chunk's stored start was read, not
// just stored: an earlier process may have called the hooks), for the
// record of a privilege never called now (NotCalled).
func (r *Privileges) DispatchBegun(ctx context.Context, nodeIDs []string, began, deadline time.Time, again bool, decided func()) error {
	privs, err := store.Read(ctx, r.Store, func(tx store.ReadTxn) ([]Privilege, error) { return PrivilegesIn(tx, nodeIDs) })
	if err != nil {
		return err
	}
	return r.DispatchReadBegun(ctx, privs, began, deadline, again, decided)
}

// DispatchRead is Dispatch of privileges the caller has read (PrivilegesIn
// in a transaction of its own, as a termination's revocation does to keep
// the list).
func (r *Privileges) DispatchRead(ctx context.Context, privs []Privilege, deadline time.Time, decided func()) error {
	return r.DispatchReadBegun(ctx, privs, r.Clock.Now(), deadline, false, decided)
}

// DispatchReadBegun is DispatchBegun of privileges the caller has read.
func (r *Privileges) DispatchReadBegun(ctx context.Context, privs []Privilege, began, deadline time.Time, again bool, decided func()) error {
	if began.IsZero() {
		// (The zero time would read as "before every expiry": Resume.)
		began = r.Clock.Now()
	}
	return r.dispatch(ctx, privs, began, deadline, again, decided)
}

// Resume is DispatchRead of privileges whose revocation already began (a
// restarted reconciler's, for what is still undecided): each of them was
// live when it began (one past its expiry then was decided expired at
// once), so none is decided expired now, whatever its declared expiry:
// each is called again within deadline, and one that does not answer by
// then is the record's to decide (revoke_failed). Until the thirty-ninth
// pass a control plane restarted after the declared expiry of a privilege
// whose hook hung, before the hook deadline, decided it expired on its
// registrant's word.
func (r *Privileges) Resume(ctx context.Context, privs []Privilege, deadline time.Time, decided func()) error {
	return r.dispatch(ctx, privs, time.Time{}, deadline, true, decided)
}

// ResumeNodes is Resume of the undecided privileges of the nodes.
func (r *Privileges) ResumeNodes(ctx context.Context, nodeIDs []string, deadline time.Time, decided func()) error {
	privs, err := store.Read(ctx, r.Store, func(tx store.ReadTxn) ([]Privilege, error) { return PrivilegesIn(tx, nodeIDs) })
	if err != nil {
		return err
	}
	return r.Resume(ctx, privs, deadline, decided)
}

// dispatch decides expired the privileges past their expiry at began (the
// zero time: none) and calls the others; again: their revocation began
// before (an earlier process may have called their hooks).
func (r *Privileges) dispatch(ctx context.Context, privs []Privilege, began, deadline time.Time, again bool, decided func()) error {
	now := r.Clock.Now()
	var expired []Privilege
	byNode := map[string][]Privilege{}
	var order []string
	r.mu.Lock()
	if r.inFlight == nil {
		r.inFlight = map[string]bool{}
	}
	for _, p := range privs {
		switch {
		case p.Outcome != "" || r.inFlight[p.ID]:
		case !began.IsZero() && !began.Before(p.ExpiresAt):
			p.Outcome, p.DecidedAt = OutcomeExpired, now
			expired = append(expired, p)
		default:
			r.inFlight[p.ID] = true
			if _, ok := byNode[p.NodeID]; !ok {
				order = append(order, p.NodeID)
			}
			byNode[p.NodeID] = append(byNode[p.NodeID], p)
		}
	}
	r.mu.Unlock()
	var paths map[string][]string
	if len(order) > 0 {
		var err error
		// The caller's read may be older than an outcome a revocation
		// persisted before it left inFlight (this dispatch's earlier one,
		// or one started for a termination this one took over from): read
		// again, now that they are marked, and start only what is still
		// undecided, so a hook is called once.
		if paths, err = r.keepUndecided(ctx, byNode); err != nil {
			for _, ps := range byNode {
				r.release(ps)
			}
			return err
		}
	}
	// In batches: a termination's chunk holds up to a thousand nodes'
	// privileges, more than one transaction takes.
	for batch := range slices.Chunk(expired, decideBatch) {
		if err := r.Store.Update(ctx, func(tx store.Txn) error {
			for _, p := range batch {
				if err := r.putDecided(tx, p); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	// Operators' privileges first, then agents': the revocations in flight
	// are bounded (Concurrency), and a hook an agent chose may hang until
	// the deadline. In the queue's order a rogue that spawned as many
	// children as there are slots, each registering a privilege behind a
	// hook that never answers, held every slot until the hook deadline,
	// and an operator's privilege on a node after them in the order (a
	// cloud credential of an honest agent deeper in the tree) was never
	// called: left live, read revoke_failed (rogue42d test). Within each,
	// by the tree (treeBranch): at every node its own privileges and each
	// child's subtree in turn, so that the rogue's whole subtree is one
	// branch beside an honest agent's however many children it spawns
	// (until the forty-third pass the nodes were taken in turn, and an
	// agent's own privilege after the rogue's children was never called:
	// rogue43a test).
	var tiers [2]treeBranch
	total := 0
	for _, node := range order {
		for _, p := range byNode[node] {
			tier := 1
			if p.ByOperator {
				tier = 0
			}
			tiers[tier].add(paths[node], p)
			total++
		}
	}
	queue := make([]Privilege, 0, total)
	for i := range tiers {
		queue = tiers[i].appendTo(queue)
	}
	if len(queue) == 0 {
		return nil
	}
	slots := r.concurrency()
	workers := min(slots, len(queue))
	// Each is marked waiting until its hook is called: one whose slot
	// does not come before the deadline is never called, and the record
	// says so (until the forty-third pass it read "no answer", as if its
	// hook had been called and had not answered).
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[string]map[string]waitMark{}
	}
	for _, p := range queue {
		if r.waiting[p.NodeID] == nil {
			r.waiting[p.NodeID] = map[string]waitMark{}
		}
		r.waiting[p.NodeID][p.ID] = waitMark{slots: slots, resumed: again}
	}
	r.mu.Unlock()
	next := make(chan Privilege)
	go func() {
		defer close(next)
		for i, p := range queue {
			select {
			case next <- p:
			case <-ctx.Done():
				r.release(queue[i:])
				r.unmark(queue[i:])
				return
			}
		}
	}()
	for range workers {
		go func() {
			for p := range next {
				if r.revokeOne(ctx, p, deadline) && decided != nil {
					decided()
				}
			}
		}()
	}
	return nil
}

// unmark forgets the waiting marks of ps (their hooks are called, or
// their dispatch is cancelled).
func (r *Privileges) unmark(ps []Privilege) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ps {
		if m := r.waiting[p.NodeID]; m != nil {
			delete(m, p.ID)
			if len(m) == 0 {
				delete(r.waiting, p.NodeID)
			}
		}
	}
}

// NotCalled says why the hook of the undecided privilege p was never
// called, if this registry queued it and no slot came for it (a
// termination's hook slots, Concurrency, all held by hooks that did not
// answer): the record's revoke_failed reads that, not "no answer", which
// would say the hook was called and kept silent. Empty when its hook was
// called, or when this registry did not queue it (another replica's or
// process's revocation: the record cannot tell).
func (r *Privileges) NotCalled(p Privilege) string {
	r.mu.Lock()
	m, ok := r.waiting[p.NodeID][p.ID]
	r.mu.Unlock()
	if !ok {
		return ""
	}
	if m.resumed {
		return fmt.Sprintf("not called again after the control plane restarted (an earlier call may have been made): the termination's %d revoke-hook slots were all held until the deadline by hooks that did not answer", m.slots)
	}
	return fmt.Sprintf("never called: the termination's %d revoke-hook slots were all held until the deadline by hooks that did not answer", m.slots)
}

// Forget drops the waiting marks of the nodes' privileges: their record
// is written.
func (r *Privileges) Forget(nodeIDs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waiting) == 0 {
		return
	}
	for _, n := range nodeIDs {
		delete(r.waiting, n)
	}
}

// keepUndecided drops from byNode (and from inFlight) the privileges whose
// stored outcome is decided, and keeps the stored value of the others. It
// answers, read with them, the path of each of byNode's nodes from its
// tree's root (its ancestors, root first, then the node), which orders the
// queue (treeBranch); a node not found is a path of itself.
func (r *Privileges) keepUndecided(ctx context.Context, byNode map[string][]Privilege) (map[string][]string, error) {
	var ids, nodes []string
	for node, ps := range byNode {
		nodes = append(nodes, node)
		for _, p := range ps {
			ids = append(ids, p.ID)
		}
	}
	var fresh []Privilege
	paths := make(map[string][]string, len(nodes))
	err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		if fresh, err = ByID(tx, ids); err != nil {
			return err
		}
		if err := store.Prefetch(tx, store.KeysOf(nodes, tree.NodeKey), nil); err != nil {
			return err
		}
		for _, node := range nodes {
			n, err := tree.GetNodeIn(tx, node)
			switch {
			case errors.Is(err, tree.ErrNodeNotFound):
				paths[node] = []string{node}
			case err != nil:
				return err
			default:
				paths[node] = append(slices.Clip(n.Ancestors), node)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	stored := make(map[string]Privilege, len(fresh))
	for _, p := range fresh {
		stored[p.ID] = p
	}
	var decided []Privilege
	for node, ps := range byNode {
		kept := ps[:0]
		for _, p := range ps {
			if f, ok := stored[p.ID]; ok && f.Outcome == "" {
				kept = append(kept, f)
			} else {
				decided = append(decided, p)
			}
		}
		byNode[node] = kept
	}
	r.release(decided)
	return paths, nil
}

// treeBranch is a node of the revocation queue's tree (treeBranch): the
// privileges held by the node itself, and its children's branches in the
// order they were first added.
type treeBranch struct {
	own  []Privilege
	keys []string
	kids map[string]*treeBranch
}

// add puts p under the branch at path (node ids from the branch down to
// p's node).
func (b *treeBranch) add(path []string, p Privilege) {
	for _, k := range path {
		c := b.kids[k]
		if c == nil {
			if b.kids == nil {
				b.kids = map[string]*treeBranch{}
			}
			c = &treeBranch{}
			b.kids[k] = c
			b.keys = append(b.keys, k)
		}
		b = c
	}
	b.own = append(b.own, p)
}

// appendTo appends the branch's privileges to q in the queue's order,
// the queue's order (treeBranch): its own privileges and each child's branch (so ordered)
// in turn, the first of each, then the second of each... A subtree is one
// branch at every level above it, however many nodes it holds: a rogue
// that spawns children, each with a privilege behind a hook that hangs,
// takes one place a round beside each of its siblings' subtrees, not one
// a child, and the privileges of a node that is not its descendant are
// not queued behind all of them.
func (b *treeBranch) appendTo(q []Privilege) []Privilege {
	lists := make([][]Privilege, 0, len(b.keys)+1)
	if len(b.own) > 0 {
		lists = append(lists, b.own)
	}
	for _, k := range b.keys {
		if l := b.kids[k].appendTo(nil); len(l) > 0 {
			lists = append(lists, l)
		}
	}
	if len(lists) == 1 {
		return append(q, lists[0]...)
	}
	for i := 0; len(lists) > 0; i++ {
		left := lists[:0]
		for _, l := range lists {
			q = append(q, l[i])
			if i+1 < len(l) {
				left = append(left, l)
			}
		}
		lists = left
	}
	return q
}

func (r *Privileges) concurrency() int {
	if r.Concurrency > 0 {
		return r.Concurrency
	}
	return DefaultHookConcurrency
}

// release forgets privileges no longer being revoked (so that a later
// Dispatch may start them again).
func (r *Privileges) release(ps []Privilege) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ps {
		delete(r.inFlight, p.ID)
	}
}

// revokeOne calls one privilege's handler or webhook within the deadline
// and persists the outcome unless one is already decided; it reports
// whether it persisted one.
func (r *Privileges) revokeOne(ctx context.Context, p Privilege, deadline time.Time) bool {
	defer r.release([]Privilege{p})
	left := deadline.Sub(r.Clock.Now())
	if left <= 0 {
		// The record decides it: never called (its waiting mark stays
		// for the record to read).
		return false
	}
	r.unmark([]Privilege{p})
	callCtx, cancel := context.WithTimeout(ctx, left)
	err := r.revoke(callCtx, p)
	timedOut := callCtx.Err() != nil
	cancel()
	if ctx.Err() != nil {
		return false // shutting down: the restarted reconciler calls it again
	}
	p.DecidedAt = r.Clock.Now()
	switch {
	case err == nil:
		p.Outcome = OutcomeRevoked
	case timedOut:
		p.Outcome, p.Error = OutcomeRevokeFailed, fmt.Sprintf("no answer within the %s deadline", left.Round(time.Millisecond))
	default:
		p.Outcome, p.Error = OutcomeRevokeFailed, err.Error()
	}
	if err := r.Store.Update(ctx, func(tx store.Txn) error { return r.putDecided(tx, p) }); err != nil {
		if ctx.Err() == nil && r.Log != nil {
			r.Log.Warn("persisting a privilege's revocation failed", "privilege_id", p.ID, "error", err)
		}
		return false
	}
	return true
}

// putDecided stores a decided privilege unless it was decided already.
func (r *Privileges) putDecided(tx store.Txn, p Privilege) error {
	var stored Privilege
	if err := kv.GetJSON(tx, privilegeKey(p.ID), &stored); err != nil {
		return err
	}
	if stored.Outcome != "" {
		return nil
	}
	return kv.PutJSON(tx, privilegeKey(p.ID), p)
}

// PutIn stores p as it is, inside the caller's transaction: the record
// decides, at the deadline, the privileges that never answered.
func PutIn(tx store.Txn, p Privilege) error { return kv.PutJSON(tx, privilegeKey(p.ID), p) }

// PendingIn counts the undecided privileges of the nodes (Pending).
func PendingIn(tx store.ReadTxn, nodeIDs []string) (int, error) {
	privs, err := PrivilegesIn(tx, nodeIDs)
	if err != nil {
		return 0, err
	}
	return Pending(privs), nil
}

// Pending counts the undecided privileges of privs: a termination waits
// for them up to its hook deadline. One that had expired when its
// revocation began is decided expired then, without a call (Dispatch);
// one whose expiry comes while its hook is being called is still waited
// for: its expiry is its registrant's word, and the hook's silence the
// control plane's own observation (until the thirty-seventh pass it
// stopped counting at its expiry, and the record read it expired).
func Pending(privs []Privilege) int {
	n := 0
	for _, p := range privs {
		if p.Outcome == "" {
			n++
		}
	}
	return n
}

// ByID reads the privileges ids names, in order, fetched together.
func ByID(tx store.ReadTxn, ids []string) ([]Privilege, error) {
	if err := store.Prefetch(tx, store.KeysOf(ids, privilegeKey), nil); err != nil {
		return nil, err
	}
	out := make([]Privilege, 0, len(ids))
	for _, pid := range ids {
		var priv Privilege
		if err := kv.GetJSON(tx, privilegeKey(pid), &priv); err != nil {
			return nil, err
		}
		out = append(out, priv)
	}
	return out, nil
}

// hookClient is r.HTTP (or a default client) that never follows a
// redirect: the 3xx answer is the hook's answer, and a failure.
func (r *Privileges) hookClient() *http.Client {
	c := http.Client{}
	if r.HTTP != nil {
		c = *r.HTTP
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

func (r *Privileges) revoke(ctx context.Context, p Privilege) error {
	if h, ok := r.Handlers[p.Kind]; ok && p.RevokeURL == "" {
		return h.RevokePrivilege(ctx, p)
	}
	if p.RevokeURL == "" {
		return errors.New("no revocation handler")
	}
	// The allow-list is checked again: an operator who narrowed it since
	// the registration is obeyed.
	if err := r.CheckHookURL(p.RevokeURL); err != nil {
		return errors.New("webhook destination no longer on the operator's allow-list")
	}
	body, _ := json.Marshal(map[string]string{
		"privilege_id": p.ID, "kind": p.Kind, "external_id": p.ExternalID, "node_id": p.NodeID, "grant_id": p.GrantID,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.RevokeURL, bytes.NewReader(body))
	if err != nil {
		return errors.New("webhook request could not be built")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", p.ID)
	resp, err := r.hookClient().Do(req)
	if err != nil {
		return fmt.Errorf("webhook unreachable")
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 3:
		return fmt.Errorf("webhook answered %d: redirects are not followed", resp.StatusCode)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return nil
}
