package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
	"github.com/tetherhq/tether/supervisor/tree"
)

// capabilityService is the CapabilityService edge: it names the caller,
// converts messages and maps errors; grantstore decides everything.
//
// Who may do what (the policy table lets the caller in; the store narrows):
//   - IssueRoot: operators. Delegate: only the agent holding the parent
//     grant, to a running node in its own subtree; operators issue roots
//     instead of delegating on an agent's behalf.
//   - Refresh: the holder agent, or an operator.
//   - Revoke: anyone in the grant's revoker set (the issuer, the holders of
//     every ancestor grant, the root's issuing operator, the security and
//     admin roles); bulk targets need that for every top grant.
//   - GetGrant, ListGrants: operators see everything, agents their own
//     subtree. Introspect and WatchRevocations: every reader.
type capabilityService struct {
	tetherv1connect.UnimplementedCapabilityServiceHandler
	s *Server
}

// grantCaller names the authenticated principal as the capability core
// does. An admin holds the admin role and a security operator the security
// role; every revoker set contains both. Without an authenticated caller
// it fails closed (principalOf).
func grantCaller(ctx context.Context) (grantstore.Caller, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return grantstore.Caller{}, err
	}
	c := grantstore.Caller{Principal: p.ID()}
	// A grant asked for by a token revoked on another replica, admitted
	// here before this replica's feed delivers the revocation, is refused
	// in the grant's transaction, as a spawn is (asCaller).
	if standing := asCaller(p); standing.Standing != nil {
		c.Standing = standing.Refused
	}
	switch {
	case p.IsAgent():
	case p.Role == auth.RoleAdmin:
		c.Roles = []string{capability.RoleAdmin}
	case p.Role == auth.RoleSecurity:
		c.Roles = []string{capability.RoleSecurity}
	}
	return c, nil
}

func issuedResponse(i grantstore.Issued) (*tetherv1.Grant, string, *timestamppb.Timestamp) {
	return wire.Grant(i.Grant), i.Token, timestamppb.New(i.TokenExpiresAt)
}

func (c *capabilityService) IssueRoot(ctx context.Context, req *connect.Request[tetherv1.IssueRootRequest]) (*connect.Response[tetherv1.IssueRootResponse], error) {
	if err := req.Msg.GetTtl().CheckValid(); req.Msg.Ttl != nil && err != nil {
		return nil, invalid("ttl: %v", err)
	}
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	issued, err := c.s.grants.IssueRoot(ctx, caller, grantstore.RootRequest{
		HolderNodeID: req.Msg.HolderNodeId, Scopes: req.Msg.Scopes, TTL: req.Msg.GetTtl().AsDuration(),
	})
	if err != nil {
		return nil, toConnect(err)
	}
	g, token, exp := issuedResponse(issued)
	return connect.NewResponse(&tetherv1.IssueRootResponse{Grant: g, Token: token, TokenExpiresAt: exp}), nil
}

func (c *capabilityService) Delegate(ctx context.Context, req *connect.Request[tetherv1.DelegateRequest]) (*connect.Response[tetherv1.DelegateResponse], error) {
	if err := req.Msg.GetTtl().CheckValid(); req.Msg.Ttl != nil && err != nil {
		return nil, invalid("ttl: %v", err)
	}
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	issued, err := c.s.grants.Delegate(ctx, caller, grantstore.DelegateRequest{
		ParentGrantID: req.Msg.ParentGrantId, HolderNodeID: req.Msg.HolderNodeId, Scopes: req.Msg.Scopes, TTL: req.Msg.GetTtl().AsDuration(),
		// The holder's bound reads every grant its index names once it
		// names the bound's worth (and their chains), refused or not: a
		// request of the caller's budget per thousand read, as a
		// listing's page, taken once read.
		Charge: func(read int) error { auth.SpendDone(ctx, (read-1)/maxPageSize); return nil },
	})
	if err != nil {
		return nil, toConnect(err)
	}
	g, token, exp := issuedResponse(issued)
	return connect.NewResponse(&tetherv1.DelegateResponse{Grant: g, Token: token, TokenExpiresAt: exp}), nil
}

func (c *capabilityService) Refresh(ctx context.Context, req *connect.Request[tetherv1.RefreshRequest]) (*connect.Response[tetherv1.RefreshResponse], error) {
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	issued, err := c.s.grants.Refresh(ctx, caller, req.Msg.GrantId)
	if err != nil {
		return nil, toConnect(err)
	}
	g, token, exp := issuedResponse(issued)
	return connect.NewResponse(&tetherv1.RefreshResponse{Grant: g, Token: token, TokenExpiresAt: exp}), nil
}

func (c *capabilityService) Revoke(ctx context.Context, req *connect.Request[tetherv1.RevokeRequest]) (*connect.Response[tetherv1.RevokeResponse], error) {
	var target grantstore.Target
	switch t := req.Msg.Target.(type) {
	case *tetherv1.RevokeRequest_GrantId:
		target.GrantID = t.GrantId
	case *tetherv1.RevokeRequest_HolderNodeId:
		target.HolderNodeID = t.HolderNodeId
	case *tetherv1.RevokeRequest_SubtreeNodeId:
		target.SubtreeNodeID = t.SubtreeNodeId
	case *tetherv1.RevokeRequest_IssuedBefore:
		if err := t.IssuedBefore.CheckValid(); err != nil {
			return nil, invalid("issued_before: %v", err)
		}
		target.IssuedBefore = t.IssuedBefore.AsTime()
		if target.IssuedBefore.IsZero() {
			return nil, invalid("issued_before must be after the Unix epoch")
		}
	}
	// A revocation by holder or subtree reads the node (or the whole
	// subtree) and every grant each node holds, whatever it revokes
	// (nothing, when all is revoked already): a request of the caller's
	// budget per thousand nodes and grants read, as a listing's page,
	// taken once read.
	target.Charge = func(read int) error { auth.SpendDone(ctx, (read-1)/maxPageSize); return nil }
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	result, err := c.s.grants.Revoke(ctx, caller, target, req.Msg.Reason)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RevokeResponse{RevokedGrantIds: result.GrantIDs, Sequence: result.Sequence, AlreadyRevokedGrantIds: result.AlreadyRevoked, AlreadyRevokedNotListed: uint32(result.AlreadyRevokedNotListed)}), nil
}

func (c *capabilityService) GetGrant(ctx context.Context, req *connect.Request[tetherv1.GetGrantRequest]) (*connect.Response[tetherv1.GetGrantResponse], error) {
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	g, err := c.s.grants.Get(ctx, caller, req.Msg.GrantId)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.GetGrantResponse{Grant: wire.Grant(g)}), nil
}

func (c *capabilityService) ListGrants(ctx context.Context, req *connect.Request[tetherv1.ListGrantsRequest]) (*connect.Response[tetherv1.ListGrantsResponse], error) {
	caller, err := grantCaller(ctx)
	if err != nil {
		return nil, err
	}
	grants, next, err := c.s.grants.List(ctx, caller, grantstore.ListQuery{
		HolderNodeID:       req.Msg.HolderNodeId,
		DerivedFromGrantID: req.Msg.DerivedFromGrantId,
		SubtreeNodeID:      req.Msg.SubtreeNodeId,
		PageSize:           int(req.Msg.PageSize),
		PageToken:          req.Msg.PageToken,
		// A page of a subtree's grants reads the whole subtree and every
		// grant id it holds, and any page reads its grants' chains: a
		// request of the caller's budget per thousand nodes and grants
		// read past the page's own, as ListNodes and a revocation by
		// subtree, taken once read even past what the budget has left.
		Charge: func(read int) error { auth.SpendDone(ctx, (read-1)/maxPageSize); return nil },
	})
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.Grant, len(grants))
	for i, g := range grants {
		out[i] = wire.Grant(g)
	}
	return connect.NewResponse(&tetherv1.ListGrantsResponse{Grants: out, NextPageToken: next}), nil
}

// Introspect answers for any token, active or not, with the reason; a
// token that does not verify is inactive, not an error. The stored grant
// is included only when the caller may see it.
func (c *capabilityService) Introspect(ctx context.Context, req *connect.Request[tetherv1.IntrospectRequest]) (*connect.Response[tetherv1.IntrospectResponse], error) {
	if req.Msg.Token == "" {
		return nil, invalid("token is required")
	}
	claims, verdict, err := c.s.grants.Introspect(ctx, req.Msg.Token)
	if err != nil {
		return nil, toConnect(err)
	}
	if claims.HolderNodeID != "" {
		// The holder's exit, as the ledger weighs a call with its token.
		if verdict, err = c.holderMayAct(ctx, claims.HolderNodeID, verdict); err != nil {
			return nil, toConnect(err)
		}
	}
	resp := &tetherv1.IntrospectResponse{Active: verdict.Active, Reason: verdict.Reason}
	if claims.GrantID != "" {
		resp.HolderNodeId, resp.Scopes, resp.ExpiresAt = claims.HolderNodeID, claims.Scopes, timestamppb.New(claims.ExpiresAt)
	}
	if verdict.GrantFound {
		caller, err := grantCaller(ctx)
		if err != nil {
			return nil, err
		}
		// Get answers an agent a grant outside its subtree as one that
		// does not exist (capability.ErrUnknownGrant), and so a grant
		// dropped since: either way the verdict stands without it. It
		// refused the whole answer for a live token held elsewhere, while
		// a revoked one (whose tombstone decides before the grant is read)
		// was answered.
		if g, err := c.s.grants.Get(ctx, caller, verdict.Grant.GrantID); err == nil {
			resp.Grant = wire.Grant(g)
		} else if !errors.Is(err, grantstore.ErrNotVisible) && !errors.Is(err, capability.ErrUnknownGrant) {
			return nil, toConnect(err)
		}
	}
	return connect.NewResponse(resp), nil
}

// holderMayAct weighs an introspected token's holder as the ledger does a
// call with the token: a token whose holder's exit was confirmed (and
// whose record is not written) is inactive, whatever its grant says — from
// the first confirmation the node may not act. And a tool server's or an
// agent's introspection (a tool checking the token it was handed, online)
// is the holder at work (tree.Act): after its confirmed exit kept as a
// contradiction, after its session's end the node seen alive. An
// operator's (a person looking at a token) notes nothing. Until the
// thirty-fourth pass Introspect answered such a token active and wrote
// nothing: a rogue that claimed its exit was served by a tool that
// introspects, and read confirmed (rogue34a test).
func (c *capabilityService) holderMayAct(ctx context.Context, holder string, verdict capability.Verdict) (capability.Verdict, error) {
	n, err := c.s.tree.Get(ctx, holder)
	// Judged on the read: only an introspection that may add evidence
	// takes a write transaction (a flood of them, a read each).
	if p, ok := auth.FromContext(ctx); err == nil && ok && (p.IsToolServer() || p.IsAgent()) && n.State != tree.NodeStateTerminated &&
		(tree.SessionEndIsLastSeen(n) || tree.ExitConfirmed(n) && len(n.Contradictions) < tree.MaxContradictions) {
		n, err = c.s.tree.Act(ctx, holder, tree.ActivityRequest, "its capability token, introspected by "+p.ID())
		if errors.Is(err, tree.ErrNodeExited) {
			err = nil
		}
	}
	switch {
	case errors.Is(err, tree.ErrNodeNotFound) || errors.Is(err, tree.ErrInvalidArgument):
		return verdict, nil
	case err != nil:
		return verdict, err
	case !verdict.Active || n.State == tree.NodeStateTerminated:
		return verdict, nil
	case !tree.ExitConfirmed(n):
		// A token of a holder that never had a session, answered active
		// to a tool: the holder served, weighed against its ancestors'
		// claims of exit as its own requests are (agentActAs).
		if p, ok := auth.FromContext(ctx); ok && (p.IsToolServer() || p.IsAgent()) {
			return verdict, c.s.tree.NoteAtWorkAfterClaims(ctx, n, tree.ActivityRequest)
		}
		return verdict, nil
	}
	verdict.Active = false
	verdict.Reason = fmt.Sprintf("the token's holder %s may no longer act: its exit was confirmed (by %s at %s), and its tokens are refused from then on",
		holder, n.ExitConfirmedBy, n.ExitedAt.UTC().Format(time.RFC3339))
	verdict.Err = tree.ErrNodeExited
	return verdict, nil
}

// WatchRevocations streams the revocation feed; see grantstore's package
// documentation for the protocol. Operators and tool servers get the whole
// feed. An agent gets only its own lineage's tombstones (the grants held in
// its tree), each message naming that tree (tree_root: a verifier following
// it refuses another tree's tokens, whose revocations it never hears of), with the reason and the holder only for grants held by itself
// or an ancestor — the subtree the revocation affects; the sequence numbers
// and heads are the feed's, so its position and snapshots work as for
// anyone. The feed walks an agent's lineage's tombstones apart from the
// others' (grantstore.LineageFeed), and the agent pays for them as for a
// listing: a request of its budget per thousand tombstones sent past the
// first thousand.
func (c *capabilityService) WatchRevocations(ctx context.Context, req *connect.Request[tetherv1.WatchRevocationsRequest], stream *connect.ServerStream[tetherv1.WatchRevocationsResponse]) error {
	view, show, err := c.revocationFilter(ctx)
	if err != nil {
		return toConnect(err)
	}
	// What the agent is sent of its lineage's tombstones, charged as a
	// listing's pages are, taken once sent even past what its budget has
	// left (auth.SpendDone): opening the feed at 0, or behind its
	// compaction point, sends every live one, and a rogue reopening it had
	// them all walked and sent again for one request each time.
	sentTombstones := 0
	charge := func(n int) {
		if view.Whole() || n == 0 {
			return
		}
		before := max(0, sentTombstones-1) / maxPageSize
		sentTombstones += n
		auth.SpendDone(ctx, (sentTombstones-1)/maxPageSize-before)
	}
	// A message that carries no tombstone the caller may see and only
	// moves the head (another tree's revocations, to an agent) is sent at
	// most once per heartbeat, as the heartbeat it stands in for (the feed
	// resets its heartbeat on each batch): else every revocation anywhere
	// cost a message on each of a rogue's open feeds, and told its agents
	// when other trees revoke.
	if before := req.Msg.BeforeSequence; before > 0 {
		if req.Msg.Newest == 0 || req.Msg.AfterSequence != 0 {
			return invalid("before_sequence: a page of the older feed takes newest (how many) and no after_sequence")
		}
		batch, head, err := c.s.grants.NewestBefore(ctx, view, before, int(req.Msg.Newest))
		if err != nil {
			return toConnect(err)
		}
		msg := &tetherv1.WatchRevocationsResponse{HeadSequence: head, ServerTime: timestamppb.New(c.s.cfg.Clock.Now()), TreeRoot: view.Root()}
		for _, t := range batch {
			if t, ok := show(t); ok {
				msg.Tombstones = append(msg.Tombstones, wire.Tombstone(t))
			}
		}
		charge(len(batch))
		return stream.Send(msg)
	}
	// The live feed is the node alive while it is open (a page above is
	// one answer: its request was seen when it arrived, tree.Act).
	closeStream, err := c.s.streamOpened(ctx)
	if err != nil {
		return err
	}
	defer closeStream()
	every := cmp.Or(c.s.cfg.RevocationHeartbeat, grantstore.DefaultHeartbeat)
	var lastSent time.Time
	sent, continued := false, false
	err = c.s.grants.WatchNewestRevocations(ctx, view, req.Msg.AfterSequence, int(min(req.Msg.Newest, grantstore.MaxFeedBatch)), func(m grantstore.FeedMessage) error {
		msg := &tetherv1.WatchRevocationsResponse{
			Tombstones:   make([]*tetherv1.Tombstone, 0, len(m.Tombstones)),
			HeadSequence: m.Head,
			ServerTime:   timestamppb.New(m.ServerTime),
			Snapshot:     m.Snapshot,
			Continues:    m.Continues,
			TreeRoot:     view.Root(),
		}
		for _, t := range m.Tombstones {
			if t, ok := show(t); ok {
				msg.Tombstones = append(msg.Tombstones, wire.Tombstone(t))
			}
		}
		charge(len(m.Tombstones))
		// A message that ends a cut-short run (the last of a snapshot) is
		// always sent: the follower applies the snapshot on it.
		hidden := m.Skipped || len(m.Tombstones) > 0 && len(msg.Tombstones) == 0 && !m.Snapshot && !continued
		continued = m.Continues
		if hidden && sent && m.ServerTime.Before(lastSent.Add(every)) {
			return nil
		}
		sent, lastSent = true, m.ServerTime
		return stream.Send(msg)
	})
	if err != nil && ctx.Err() != nil {
		return nil // the follower went away
	}
	return toConnect(err)
}

// revocationFilter decides which tombstones the caller sees, and how: the
// view of the feed it is walked (an agent's lineage's, or the whole feed),
// and what of each tombstone of that view it is shown.
func (c *capabilityService) revocationFilter(ctx context.Context) (grantstore.View, func(capability.Tombstone) (capability.Tombstone, bool), error) {
	p, err := principalOf(ctx)
	if err != nil {
		return grantstore.View{}, nil, err
	}
	if !p.IsAgent() {
		return grantstore.WholeFeed(), func(t capability.Tombstone) (capability.Tombstone, bool) { return t, true }, nil
	}
	node, err := c.s.tree.Get(ctx, p.NodeID())
	if err != nil {
		return grantstore.View{}, nil, err
	}
	lineage := node.NodeID
	if len(node.Ancestors) > 0 {
		lineage = node.Ancestors[0]
	}
	affects := map[string]bool{node.NodeID: true} // holders whose subtree holds the caller
	for _, a := range node.Ancestors {
		affects[a] = true
	}
	return grantstore.LineageFeed(lineage), func(t capability.Tombstone) (capability.Tombstone, bool) {
		if t.Lineage == "" || t.Lineage != lineage {
			return capability.Tombstone{}, false
		}
		if !affects[t.Holder] {
			// Nor whose it was: the lineage's other nodes (siblings,
			// cousins) are not the caller's to read (GetNode answers them
			// as missing), and a termination's revocations would tell it
			// when each was stopped, and who revoked it (a sibling's node,
			// or the termination). The grant id is what a verifier needs.
			t.Reason, t.Holder, t.RevokedBy = "", "", ""
		}
		return t, true
	}, nil
}

// Grants is the capability tree's store-backed service: the supervisor's
// GrantRevoker, the ledger's TokenChecker, and what tests and benchmarks
// drive directly (MarkPending, PruneTombstones).
func (s *Server) Grants() *grantstore.Service { return s.grants }
