package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The authorisation matrix: every procedure of every service (enumerated
// from the proto registry, so a new RPC fails this test until it has a
// row) against every kind of caller, through the real server. The target
// of each request is one agent, "self", in this tree:
//
//	ancestor ── parent ─┬─ self ── descendant
//	                    └─ sibling
//	unrelated (another root)
//
// and the objects it holds: a grant delegated ancestor → parent → self, a
// job lease, a termination of self requested by its parent, a stop
// proposal, a tool call. Each allowed cell runs in a fresh tree, so no
// cell sees another's effects; the refused callers of a procedure share
// one (a refusal changes nothing).

type caller int

const (
	anonymous caller = iota
	expired          // an admin token past its expiry
	self
	parent
	ancestor
	sibling
	descendant
	unrelated
	viewer
	operator
	security
	admin
	toolServer // the tool server whose gate began self's calls
	otherTool  // another tool server
	callerKinds
)

func (c caller) String() string {
	return [...]string{"anonymous", "expired", "self", "parent", "ancestor", "sibling", "descendant", "unrelated",
		"viewer", "operator", "security", "admin", "tool-server", "other-tool-server"}[c]
}

// verdict is what a cell must show.
type verdict int

const (
	// denied: unauthenticated (anonymous, expired) or permission_denied.
	denied verdict = iota
	// allowed: not refused with unauthenticated or permission_denied (the
	// request may still fail validation); a lease worker message from its
	// holder is ACCEPTED.
	allowed
	// judged: a lease worker message from an agent of the job's
	// coordinating lineage that is not the holder reaches the state
	// machine (holder binding: the holder identity is the caller) and is
	// REJECTED there, changing no authority.
	judged
)

func (v verdict) String() string { return [...]string{"denied", "allowed", "judged"}[v] }

// expectation is one row of the matrix: who is allowed; who is judged;
// everyone else is denied.
type expectation struct {
	allow, judge []caller
}

func (e expectation) verdict(c caller) verdict {
	switch {
	case slices.Contains(e.allow, c):
		return allowed
	case slices.Contains(e.judge, c):
		return judged
	}
	return denied
}

var (
	everyAgent    = []caller{self, parent, ancestor, sibling, descendant, unrelated}
	everyReader   = []caller{viewer, operator, security, admin}
	authenticated = append(slices.Clone(everyAgent), everyReader...)
	// tool servers report tool calls and do nothing else.
	toolServers  = []caller{toolServer, otherTool}
	operators    = []caller{operator, admin}
	selfAndAbove = []caller{self, parent, ancestor}
	// readers of self's objects: self, its ancestors and every operator role.
	subtreeReaders = append(slices.Clone(selfAndAbove), everyReader...)
	// a worker message for self's lease: accepted from self; judged and
	// rejected from the lineage that coordinates the job (the ancestors of
	// the holder; the offer here is an operator's); refused before the
	// state machine from every other agent (a stranger to the job);
	// operators never speak for a holder.
	holderOnly = expectation{allow: []caller{self}, judge: []caller{parent, ancestor}}
)

func allow(cs ...[]caller) expectation {
	var out []caller
	for _, c := range cs {
		out = append(out, c...)
	}
	return expectation{allow: out}
}

func callers(cs ...caller) []caller { return cs }

// authzMatrix is the expectation, reviewed against docs/design.md (§3 authority,
// §4 termination, §5) and the issues: roles viewer < operator, security,
// admin; an agent acts on its own node and directs its descendants, never
// its ancestors, siblings or unrelated agents; a grant is revoked by its
// revoker set (issuer, holders of ancestor grants, security, admin); a
// termination is requested by an operator, the security role or a strict
// ancestor; lease worker messages come only from the holder (holder
// binding) and are refused before the lease machine from strangers to the
// job, coordinator messages from operators or ancestors of the holder.
var authzMatrix = map[string]expectation{
	tetherv1connect.AuthServiceCreateTokenProcedure: allow(callers(admin)),
	tetherv1connect.AuthServiceWhoAmIProcedure:      allow(authenticated, toolServers),
	tetherv1connect.AuthServiceRotateKeysProcedure:  allow(callers(admin)),
	tetherv1connect.AuthServiceListKeysProcedure:    allow(everyReader),
	tetherv1connect.AuthServiceRevokeTokenProcedure: allow(callers(security, admin)),
	tetherv1connect.AuthServiceListTokensProcedure:  allow(callers(security, admin)),

	tetherv1connect.AgentServiceRegisterRootProcedure: allow(operators),
	tetherv1connect.AgentServiceSpawnProcedure:        allow(callers(self), operators),
	tetherv1connect.AgentServiceSpawnBatchProcedure:   allow(callers(self), operators),
	tetherv1connect.AgentServiceSessionProcedure:      allow(callers(self)),
	tetherv1connect.AgentServiceConfirmExitProcedure:  allow(selfAndAbove, operators),
	tetherv1connect.AgentServiceGetNodeProcedure:      allow(subtreeReaders),
	tetherv1connect.AgentServiceListNodesProcedure:    allow(subtreeReaders),
	tetherv1connect.AgentServiceProposeStopProcedure:  allow(callers(self)),
	tetherv1connect.AgentServiceReportReadyProcedure:  allow(callers(self), operators),
	tetherv1connect.AgentServiceWatchSignalsProcedure: allow(callers(self)),
	tetherv1connect.AgentServiceHeartbeatProcedure:    allow(callers(self)),

	tetherv1connect.CapabilityServiceIssueRootProcedure:        allow(operators),
	tetherv1connect.CapabilityServiceDelegateProcedure:         allow(callers(self)),
	tetherv1connect.CapabilityServiceRefreshProcedure:          allow(callers(self), operators),
	tetherv1connect.CapabilityServiceRevokeProcedure:           allow(callers(parent, ancestor, security, admin)),
	tetherv1connect.CapabilityServiceGetGrantProcedure:         allow(subtreeReaders),
	tetherv1connect.CapabilityServiceListGrantsProcedure:       allow(subtreeReaders),
	tetherv1connect.CapabilityServiceIntrospectProcedure:       allow(authenticated, toolServers),
	tetherv1connect.CapabilityServiceWatchRevocationsProcedure: allow(authenticated, toolServers),

	// The tool layer only: an agent never reports (or acknowledges) its own
	// calls, operators are not the tool layer, and a tool server ends,
	// acknowledges and watches only its own gate's calls.
	tetherv1connect.ToolServiceBeginCallProcedure:    allow(toolServers),
	tetherv1connect.ToolServiceEndCallProcedure:      allow(callers(toolServer)),
	tetherv1connect.ToolServiceCancelAckProcedure:    allow(callers(toolServer)),
	tetherv1connect.ToolServiceWatchCancelsProcedure: allow(callers(toolServer)),
	tetherv1connect.ToolServiceListCallsProcedure:    allow(everyReader),

	tetherv1connect.SupervisorServiceTerminateProcedure:         allow(callers(parent, ancestor, operator, security, admin)),
	tetherv1connect.SupervisorServiceGetTerminationProcedure:    allow(callers(parent), everyReader),
	tetherv1connect.SupervisorServiceWatchTerminationProcedure:  allow(callers(parent), everyReader),
	tetherv1connect.SupervisorServiceGetRecordProcedure:         allow(everyReader),
	tetherv1connect.SupervisorServiceListRecordsProcedure:       allow(everyReader),
	tetherv1connect.SupervisorServiceDecideProposalProcedure:    allow(operators),
	tetherv1connect.SupervisorServiceListProposalsProcedure:     allow(everyReader),
	tetherv1connect.SupervisorServiceRegisterPrivilegeProcedure: allow(callers(self), operators),
	tetherv1connect.SupervisorServiceListPrivilegesProcedure:    allow(everyReader),
	// Rollouts drain agents across the whole tree: operators only.
	tetherv1connect.SupervisorServiceRolloutProcedure:       allow(operators),
	tetherv1connect.SupervisorServiceGetRolloutProcedure:    allow(everyReader),
	tetherv1connect.SupervisorServiceListRolloutsProcedure:  allow(everyReader),
	tetherv1connect.SupervisorServiceWatchRolloutProcedure:  allow(everyReader),
	tetherv1connect.SupervisorServicePauseRolloutProcedure:  allow(operators),
	tetherv1connect.SupervisorServiceResumeRolloutProcedure: allow(operators),
	tetherv1connect.SupervisorServiceAbortRolloutProcedure:  allow(operators),

	// Stop rules: an agent attaches rules to its own subtree; it removes
	// only rules it or a descendant set (self's rule here); counters are
	// reported by the agent about itself.
	tetherv1connect.StopRuleServiceAddStopRuleProcedure:    allow(selfAndAbove, operators),
	tetherv1connect.StopRuleServiceListStopRulesProcedure:  allow(subtreeReaders),
	tetherv1connect.StopRuleServiceRemoveStopRuleProcedure: allow(selfAndAbove, operators),
	tetherv1connect.StopRuleServiceTestStopRuleProcedure:   allow(subtreeReaders),
	tetherv1connect.StopRuleServiceReportCountersProcedure: allow(callers(self)),

	tetherv1connect.LeaseServiceOfferProcedure:         allow(callers(parent, ancestor), operators),
	tetherv1connect.LeaseServiceAckProcedure:           holderOnly,
	tetherv1connect.LeaseServiceRenewProcedure:         holderOnly,
	tetherv1connect.LeaseServiceProgressProcedure:      holderOnly,
	tetherv1connect.LeaseServiceCancelAckProcedure:     holderOnly,
	tetherv1connect.LeaseServiceCompleteProcedure:      holderOnly,
	tetherv1connect.LeaseServiceChannelProcedure:       holderOnly,
	tetherv1connect.LeaseServiceRequestCancelProcedure: allow(callers(parent, ancestor), operators),
	tetherv1connect.LeaseServiceReassignProcedure:      allow(callers(parent, ancestor), operators),
	tetherv1connect.LeaseServiceResolveProcedure:       allow(callers(parent, ancestor), operators),
	tetherv1connect.LeaseServiceGetLeaseProcedure:      allow(subtreeReaders, toolServers), // a fenced tool server asks which generation was issued
	tetherv1connect.LeaseServiceListLeasesProcedure:    allow(subtreeReaders),
	tetherv1connect.LeaseServiceEvidenceProcedure:      allow(subtreeReaders),
	tetherv1connect.LeaseServiceGetPolicyProcedure:     allow(authenticated),
}

// allProcedures lists every procedure of tether.v1 from the registry.
func allProcedures(t testing.TB) []string {
	var out []string
	protoregistry.GlobalFiles.RangeFilesByPackage("tether.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				out = append(out, "/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) < 40 {
		t.Fatalf("found only %d procedures; is the proto package registered?", len(out))
	}
	slices.Sort(out)
	return out
}

// authzServer is one server for the whole matrix, with a manual clock (no
// termination or lease deadline moves while the matrix runs) and a token
// per role.
type authzServer struct {
	srv    *testserver.Server
	clk    *clock.Manual
	admin  *testserver.Clients
	tokens map[caller]string
}

func newAuthzServer(t *testing.T) *authzServer {
	clk := clock.NewManual(time.Now().UTC())
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	s := &authzServer{srv: srv, clk: clk, admin: srv.AdminClients(), tokens: map[caller]string{admin: srv.Admin}}
	for c, role := range map[caller]tetherv1.Role{viewer: tetherv1.Role_ROLE_VIEWER, operator: tetherv1.Role_ROLE_OPERATOR, security: tetherv1.Role_ROLE_SECURITY} {
		resp, err := s.admin.Auth.CreateToken(context.Background(), connect.NewRequest(&tetherv1.CreateTokenRequest{Role: role, Ttl: durationpb.New(time.Hour)}))
		if err != nil {
			t.Fatal(err)
		}
		s.tokens[c] = resp.Msg.Token
	}
	// Expired an hour ago, far beyond the leeway; an admin's, so that only
	// the expiry can refuse it. (Signed now: the key ring has no key
	// older than the server.)
	tok, _, _, err := srv.Issuer().MintOperator("expired-admin", auth.RoleAdmin, clk.Now(), -time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.tokens[expired] = tok
	s.tokens[toolServer] = srv.ToolServerToken(t, matrixGate)
	s.tokens[otherTool] = srv.ToolServerToken(t, "matrix-other-tool")
	return s
}

// matrixGate is the tool server that begins self's calls: its name is the
// calls' gate id.
const matrixGate = "matrix-tool"

// authzWorld is one cell's tree and the objects self holds, made on
// demand.
type authzWorld struct {
	t     *testing.T
	s     *authzServer
	ids   map[caller]string // node ids of the agents
	creds map[caller]string

	grant     *tetherv1.DelegateResponse // self's grant: ancestor's root → parent → self
	job       string
	lease     *tetherv1.Lease
	term      *tetherv1.Termination
	proposal  string
	rule      string
	callID    string
	callGate  string
	watchGate string
}

func (s *authzServer) world(t *testing.T) *authzWorld {
	w := &authzWorld{t: t, s: s, ids: map[caller]string{}, creds: map[caller]string{}}
	add := func(c caller, node *tetherv1.Node, cred string) { w.ids[c], w.creds[c] = node.NodeId, cred }
	r := register(t, s.admin, "ancestor")
	add(ancestor, r.Node, r.Credential)
	p := spawn(t, s.srv.Clients(r.Credential), r.Node.NodeId, "parent")
	add(parent, p.Node, p.Credential)
	me := spawn(t, s.srv.Clients(p.Credential), p.Node.NodeId, "self")
	add(self, me.Node, me.Credential)
	sib := spawn(t, s.srv.Clients(p.Credential), p.Node.NodeId, "sibling")
	add(sibling, sib.Node, sib.Credential)
	d := spawn(t, s.srv.Clients(me.Credential), me.Node.NodeId, "descendant")
	add(descendant, d.Node, d.Credential)
	u := register(t, s.admin, "unrelated")
	add(unrelated, u.Node, u.Credential)
	return w
}

func (w *authzWorld) as(c caller) *testserver.Clients {
	if cred, ok := w.creds[c]; ok {
		return w.s.srv.Clients(cred)
	}
	return w.s.srv.Clients(w.s.tokens[c]) // anonymous: no token at all
}

func (w *authzWorld) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

// selfGrant delegates a grant down the tree: the admin's root grant to
// the ancestor, then ancestor → parent → self.
func (w *authzWorld) selfGrant() *tetherv1.DelegateResponse {
	if w.grant != nil {
		return w.grant
	}
	ctx := context.Background()
	root, err := w.s.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: w.ids[ancestor], Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
	w.must(err)
	toParent, err := w.as(ancestor).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: root.Msg.Grant.GrantId, HolderNodeId: w.ids[parent], Scopes: []string{"tool:*"}}))
	w.must(err)
	toSelf, err := w.as(parent).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: toParent.Msg.Grant.GrantId, HolderNodeId: w.ids[self], Scopes: []string{"tool:*"}}))
	w.must(err)
	w.grant = toSelf.Msg
	return w.grant
}

// selfLease offers self a job and, when ack is set, has self ACK it;
// cancel also requests its cancellation. A world has one such lease.
func (w *authzWorld) selfLease(ack, cancel bool) *tetherv1.Lease {
	if w.lease != nil {
		return w.lease
	}
	ctx := context.Background()
	w.job = fmt.Sprintf("matrix-job-%s", w.ids[self])
	resp, err := w.s.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: w.job, HolderIdentity: w.ids[self], LeaseDuration: durationpb.New(time.Minute)}))
	w.must(err)
	w.lease = resp.Msg.Lease
	if ack {
		a, err := w.as(self).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: w.job, LeaseId: w.lease.LeaseId, LeaseGeneration: w.lease.LeaseGeneration}))
		w.must(err)
		if a.Msg.Decision.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
			w.t.Fatalf("setup: self's ack: %v", a.Msg.Decision)
		}
		w.lease = a.Msg.Lease
	}
	if cancel {
		c, err := w.s.admin.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: w.job, Reason: "matrix"}))
		w.must(err)
		w.lease = c.Msg.Lease
	}
	return w.lease
}

// selfTermination: self's parent asks for self's termination (a drain
// that, on the manual clock, stays in progress).
func (w *authzWorld) selfTermination() *tetherv1.Termination {
	if w.term == nil {
		w.term = terminate(w.t, w.as(parent), w.ids[self], tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	}
	return w.term
}

func (w *authzWorld) selfProposal() string {
	if w.proposal == "" {
		resp, err := w.as(self).Agent.ProposeStop(context.Background(), connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "now", Reason: "matrix"}))
		w.must(err)
		w.proposal = resp.Msg.Proposal.ProposalId
	}
	return w.proposal
}

// selfRule is a stop rule self set on itself.
func (w *authzWorld) selfRule() string {
	if w.rule == "" {
		resp, err := w.as(self).StopRule.AddStopRule(context.Background(), connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: w.ids[self], Name: "matrix", Expression: "observed.calls > 100"}))
		w.must(err)
		w.rule = resp.Msg.Rule.RuleId
	}
	return w.rule
}

// selfCall begins a tool call on self's grant through the tool server's
// gate.
func (w *authzWorld) selfCall() (callID, gate string) {
	if w.callID == "" {
		w.callGate = matrixGate
		resp, err := w.as(toolServer).Tool.BeginCall(context.Background(), connect.NewRequest(&tetherv1.BeginCallRequest{Token: w.selfGrant().Token, Tool: "shell", GateId: w.callGate}))
		w.must(err)
		w.callID = resp.Msg.Call.CallId
	}
	return w.callID, w.callGate
}

// cancelOrders gives every agent of the world a tool call in flight on
// one gate and aborts both roots, so the gate holds a cancel order for a
// call of every agent: each allowed watcher has one to receive.
func (w *authzWorld) cancelOrders() string {
	if w.watchGate != "" {
		return w.watchGate
	}
	ctx := context.Background()
	w.watchGate = matrixGate
	for _, c := range everyAgent {
		g, err := w.s.admin.Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: w.ids[c], Scopes: []string{"tool:*"}, Ttl: durationpb.New(time.Hour)}))
		w.must(err)
		_, err = w.as(toolServer).Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Msg.Token, Tool: "shell", GateId: w.watchGate}))
		w.must(err)
	}
	var terms []string
	for _, root := range []caller{ancestor, unrelated} {
		terms = append(terms, terminate(w.t, w.s.admin, w.ids[root], tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Hour, time.Hour).TerminationId)
	}
	testserver.WaitFor(w.t, 20*time.Second, "a cancel order for every agent's call", func() bool {
		pending := 0
		for _, id := range terms {
			pending += int(getTermination(w.t, w.s.admin, id).Progress.GetAcksPending())
		}
		return pending == len(everyAgent)
	})
	return w.watchGate
}

// cellResult is what one call showed: the error (nil for success) and,
// for lease worker messages, the decision.
type cellResult struct {
	err      error
	decision *tetherv1.Decision
}

func leaseDecision[R any](r *connect.Response[R], err error) cellResult {
	if err != nil {
		return cellResult{err: err}
	}
	var msg any = r.Msg
	return cellResult{decision: msg.(interface{ GetDecision() *tetherv1.Decision }).GetDecision()}
}

func plain[R any](_ *connect.Response[R], err error) cellResult { return cellResult{err: err} }

// firstMessage opens a server stream and waits for its first message (or
// its error): every stream in the matrix sends one at once to a caller it
// serves.
func firstMessage[R any](stream *connect.ServerStreamForClient[R], err error) (*R, error) {
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	if stream.Receive() {
		return stream.Msg(), nil
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return nil, io.EOF
}

// authzNoRollout is a well-formed rollout id no rollout has.
const authzNoRollout = "o_00000000000000000000"

// authzRequests builds, for each procedure, the call a caller makes
// against self (or self's objects).
var authzRequests = map[string]func(ctx context.Context, w *authzWorld, c caller) cellResult{
	tetherv1connect.AuthServiceCreateTokenProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{Role: tetherv1.Role_ROLE_VIEWER, Ttl: durationpb.New(time.Hour)})))
	},
	tetherv1connect.AuthServiceWhoAmIProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})))
	},
	tetherv1connect.AuthServiceRotateKeysProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		// The new key signs only after publish_ahead, which the manual
		// clock never reaches: every other cell's tokens stay valid.
		return plain(w.as(c).Auth.RotateKeys(ctx, connect.NewRequest(&tetherv1.RotateKeysRequest{PublishAhead: durationpb.New(time.Hour)})))
	},
	tetherv1connect.AuthServiceListKeysProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Auth.ListKeys(ctx, connect.NewRequest(&tetherv1.ListKeysRequest{})))
	},
	// A token id nobody minted: those allowed get not_found, and no
	// token of the matrix is revoked.
	tetherv1connect.AuthServiceRevokeTokenProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: "tok-never-minted", Reason: "matrix"})))
	},
	tetherv1connect.AuthServiceListTokensProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Auth.ListTokens(ctx, connect.NewRequest(&tetherv1.ListTokensRequest{})))
	},
	tetherv1connect.AgentServiceReportReadyProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: w.ids[self]})))
	},
	// Rollouts are operator-only by role; a rollout id nobody started
	// answers not_found to those allowed.
	tetherv1connect.SupervisorServiceRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.Rollout(ctx, connect.NewRequest(&tetherv1.RolloutRequest{
			Selector: "matrix-rollout=" + w.ids[self], TargetSelector: "matrix-target=" + w.ids[self], Description: "matrix"})))
	},
	tetherv1connect.SupervisorServiceGetRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.GetRollout(ctx, connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: authzNoRollout})))
	},
	tetherv1connect.SupervisorServiceListRolloutsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.ListRollouts(ctx, connect.NewRequest(&tetherv1.ListRolloutsRequest{})))
	},
	tetherv1connect.SupervisorServiceWatchRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		_, err := firstMessage(w.as(c).Supervisor.WatchRollout(ctx, connect.NewRequest(&tetherv1.WatchRolloutRequest{RolloutId: authzNoRollout})))
		return cellResult{err: err}
	},
	tetherv1connect.SupervisorServicePauseRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.PauseRollout(ctx, connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: authzNoRollout, Reason: "matrix"})))
	},
	tetherv1connect.SupervisorServiceResumeRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: authzNoRollout})))
	},
	tetherv1connect.SupervisorServiceAbortRolloutProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.AbortRollout(ctx, connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: authzNoRollout, Reason: "matrix"})))
	},

	tetherv1connect.AgentServiceRegisterRootProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "matrix-root"})))
	},
	tetherv1connect.AgentServiceSpawnProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: w.ids[self], Name: "matrix-child"})))
	},
	tetherv1connect.AgentServiceSpawnBatchProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: w.ids[self],
			Children: []*tetherv1.SpawnBatchChild{{Name: "matrix-child-1"}, {Name: "matrix-child-2"}}})))
	},
	tetherv1connect.AgentServiceSessionProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		stream := w.as(c).Agent.Session(ctx)
		defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
		if err := stream.Send(&tetherv1.SessionRequest{Kind: &tetherv1.SessionRequest_Hello{Hello: &tetherv1.SessionHello{NodeId: w.ids[self]}}}); err != nil && !errors.Is(err, io.EOF) {
			return cellResult{err: err}
		}
		resp, err := stream.Receive()
		if err == nil && resp.GetOpened() == nil {
			err = fmt.Errorf("first session message is %T, want opened", resp.Kind)
		}
		return cellResult{err: err}
	},
	tetherv1connect.AgentServiceWatchSignalsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		msg, err := firstMessage(w.as(c).Agent.WatchSignals(ctx, connect.NewRequest(&tetherv1.WatchSignalsRequest{NodeId: w.ids[self]})))
		if err == nil && msg.GetOpened().GetNode().GetNodeId() != w.ids[self] {
			err = fmt.Errorf("first message is %v, want self's node opened", msg)
		}
		return cellResult{err: err}
	},
	tetherv1connect.AgentServiceHeartbeatProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.Heartbeat(ctx, connect.NewRequest(&tetherv1.HeartbeatRequest{NodeId: w.ids[self]})))
	},
	tetherv1connect.AgentServiceConfirmExitProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.ids[self]})))
	},
	tetherv1connect.AgentServiceGetNodeProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.ids[self]})))
	},
	tetherv1connect.AgentServiceListNodesProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: w.ids[self]})))
	},
	tetherv1connect.AgentServiceProposeStopProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: w.ids[self], Condition: "now", Reason: "matrix"})))
	},

	tetherv1connect.CapabilityServiceIssueRootProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Capability.IssueRoot(ctx, connect.NewRequest(&tetherv1.IssueRootRequest{HolderNodeId: w.ids[self], Scopes: []string{"tool:read"}, Ttl: durationpb.New(time.Hour)})))
	},
	tetherv1connect.CapabilityServiceDelegateProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		return plain(w.as(c).Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: g.Grant.GrantId, HolderNodeId: w.ids[descendant], Scopes: []string{"tool:read"}})))
	},
	tetherv1connect.CapabilityServiceRefreshProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		return plain(w.as(c).Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: g.Grant.GrantId})))
	},
	tetherv1connect.CapabilityServiceRevokeProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		return plain(w.as(c).Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: g.Grant.GrantId}, Reason: "matrix"})))
	},
	tetherv1connect.CapabilityServiceGetGrantProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		return plain(w.as(c).Capability.GetGrant(ctx, connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: g.Grant.GrantId})))
	},
	tetherv1connect.CapabilityServiceListGrantsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		w.selfGrant()
		return plain(w.as(c).Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: w.ids[self]})))
	},
	tetherv1connect.CapabilityServiceIntrospectProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		return plain(w.as(c).Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{Token: g.Token})))
	},
	tetherv1connect.CapabilityServiceWatchRevocationsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		_, err := firstMessage(w.as(c).Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{})))
		return cellResult{err: err}
	},

	tetherv1connect.ToolServiceBeginCallProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		g := w.selfGrant()
		// No gate_id: a tool server reports as itself.
		return plain(w.as(c).Tool.BeginCall(ctx, connect.NewRequest(&tetherv1.BeginCallRequest{Token: g.Token, Tool: "shell"})))
	},
	tetherv1connect.ToolServiceEndCallProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		call, gate := w.selfCall()
		return plain(w.as(c).Tool.EndCall(ctx, connect.NewRequest(&tetherv1.EndCallRequest{CallId: call, GateId: gate})))
	},
	tetherv1connect.ToolServiceCancelAckProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		call, gate := w.selfCall()
		return plain(w.as(c).Tool.CancelAck(ctx, connect.NewRequest(&tetherv1.CancelAckRequest{CallId: call, GateId: gate})))
	},
	tetherv1connect.ToolServiceWatchCancelsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		gate := w.cancelOrders()
		_, err := firstMessage(w.as(c).Tool.WatchCancels(ctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: gate})))
		return cellResult{err: err}
	},

	tetherv1connect.ToolServiceListCallsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.ids[self]})))
	},

	tetherv1connect.SupervisorServiceTerminateProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.ids[self], Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, Reason: "matrix"})))
	},
	tetherv1connect.SupervisorServiceGetTerminationProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		term := w.selfTermination()
		return plain(w.as(c).Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.TerminationId})))
	},
	tetherv1connect.SupervisorServiceWatchTerminationProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		term := w.selfTermination()
		_, err := firstMessage(w.as(c).Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId})))
		return cellResult{err: err}
	},
	tetherv1connect.SupervisorServiceGetRecordProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		term := w.selfTermination() // no record yet: allowed callers get not_found
		return plain(w.as(c).Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.TerminationId})))
	},
	tetherv1connect.SupervisorServiceListRecordsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{})))
	},
	tetherv1connect.SupervisorServiceDecideProposalProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: w.selfProposal(), Approve: false, Reason: "matrix"})))
	},
	tetherv1connect.SupervisorServiceListProposalsProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{})))
	},
	tetherv1connect.SupervisorServiceRegisterPrivilegeProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
			NodeId: w.ids[self], Kind: "db-lock", ExternalId: "lock-1", ExpiresAt: timestamppb.New(w.s.clk.Now().Add(time.Hour)), RevokeUrl: "http://127.0.0.1:1/revoke",
		})))
	},
	tetherv1connect.SupervisorServiceListPrivilegesProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: w.ids[self]})))
	},

	tetherv1connect.StopRuleServiceAddStopRuleProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: w.ids[self], Name: "matrix-" + c.String(), Expression: "observed.calls > 10"})))
	},
	tetherv1connect.StopRuleServiceListStopRulesProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		w.selfRule()
		return plain(w.as(c).StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: w.ids[self]})))
	},
	tetherv1connect.StopRuleServiceRemoveStopRuleProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: w.selfRule()})))
	},
	tetherv1connect.StopRuleServiceTestStopRuleProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).StopRule.TestStopRule(ctx, connect.NewRequest(&tetherv1.TestStopRuleRequest{NodeId: w.ids[self], Expression: "observed.calls > 10"})))
	},
	tetherv1connect.StopRuleServiceReportCountersProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).StopRule.ReportCounters(ctx, connect.NewRequest(&tetherv1.ReportCountersRequest{NodeId: w.ids[self], Counters: map[string]float64{"cost_usd": 1}})))
	},

	tetherv1connect.LeaseServiceOfferProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return leaseDecision(w.as(c).Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "matrix-offer-" + w.ids[self], HolderIdentity: w.ids[self], LeaseDuration: durationpb.New(time.Minute)})))
	},
	tetherv1connect.LeaseServiceAckProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(false, false)
		return leaseDecision(w.as(c).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})))
	},
	tetherv1connect.LeaseServiceRenewProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1})))
	},
	tetherv1connect.LeaseServiceProgressProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, ProgressSequence: 1, ProgressValue: "half"})))
	},
	tetherv1connect.LeaseServiceCancelAckProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, true)
		return leaseDecision(w.as(c).Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})))
	},
	tetherv1connect.LeaseServiceCompleteProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED})))
	},
	tetherv1connect.LeaseServiceChannelProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		stream := w.as(c).Lease.Channel(ctx)
		defer func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() }()
		err := stream.Send(&tetherv1.ChannelRequest{CorrelationId: 7, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1}}})
		if err != nil && !errors.Is(err, io.EOF) {
			return cellResult{err: err}
		}
		resp, err := stream.Receive()
		switch {
		case err != nil:
			return cellResult{err: err}
		case resp.Error != "":
			// "code: message", as the stream reports a refusal.
			name, msg, _ := strings.Cut(resp.Error, ": ")
			var code connect.Code
			if code.UnmarshalText([]byte(name)) == nil {
				return cellResult{err: connect.NewError(code, errors.New(msg))}
			}
			return cellResult{err: errors.New(resp.Error)}
		}
		return cellResult{decision: resp.Decision}
	},
	tetherv1connect.LeaseServiceRequestCancelProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: l.JobId, Reason: "matrix"})))
	},
	tetherv1connect.LeaseServiceReassignProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{JobId: l.JobId, HolderIdentity: w.ids[self], Reason: "matrix"})))
	},
	tetherv1connect.LeaseServiceResolveProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return leaseDecision(w.as(c).Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{JobId: l.JobId, Result: tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, Reason: "matrix"})))
	},
	tetherv1connect.LeaseServiceGetLeaseProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return plain(w.as(c).Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId})))
	},
	tetherv1connect.LeaseServiceListLeasesProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		w.selfLease(true, false)
		return plain(w.as(c).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: w.ids[self]})))
	},
	tetherv1connect.LeaseServiceEvidenceProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		l := w.selfLease(true, false)
		return plain(w.as(c).Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.JobId})))
	},
	tetherv1connect.LeaseServiceGetPolicyProcedure: func(ctx context.Context, w *authzWorld, c caller) cellResult {
		return plain(w.as(c).Lease.GetPolicy(ctx, connect.NewRequest(&tetherv1.GetPolicyRequest{})))
	},
}

// TestAuthorizationMatrix asserts every cell through the real server and
// counts them.
func TestAuthorizationMatrix(t *testing.T) {
	procedures := allProcedures(t)
	for _, p := range procedures {
		if _, ok := authzMatrix[p]; !ok {
			t.Errorf("%s has no row in the authorisation matrix: decide who may call it (authzMatrix) and how (authzRequests)", p)
		}
		if _, ok := authzRequests[p]; !ok {
			t.Errorf("%s has no request in the authorisation matrix", p)
		}
	}
	if len(authzMatrix) != len(procedures) || len(authzRequests) != len(procedures) {
		t.Fatalf("the matrix has %d rows and %d requests for %d procedures: a row names a procedure that does not exist", len(authzMatrix), len(authzRequests), len(procedures))
	}
	if t.Failed() {
		t.FailNow()
	}
	s := newAuthzServer(t)
	var (
		mu     sync.Mutex
		counts = map[verdict]int{}
	)
	t.Run("cells", func(t *testing.T) {
		for _, p := range procedures {
			t.Run(strings.TrimPrefix(p, "/tether.v1."), func(t *testing.T) {
				t.Parallel()
				want := authzMatrix[p]
				// Refused calls change nothing, so the refused callers share
				// one tree; every other caller gets a fresh one.
				var shared *authzWorld
				for c := range callerKinds {
					v := want.verdict(c)
					w := shared
					if v != denied || w == nil {
						w = s.world(t)
					}
					if v == denied && shared == nil {
						shared = w
					}
					checkCell(t, w, p, c, v)
					mu.Lock()
					counts[v]++
					mu.Unlock()
				}
			})
		}
	})
	cells := counts[allowed] + counts[judged] + counts[denied]
	t.Logf("authorisation matrix: %d procedures × %d kinds of caller = %d cells (%d allowed, %d judged by the lease state machine, %d denied)",
		len(procedures), int(callerKinds), cells, counts[allowed], counts[judged], counts[denied])
	if want := len(procedures) * int(callerKinds); cells != want {
		t.Fatalf("asserted %d cells, want %d", cells, want)
	}
}

// concealed lists the reads by id (and the listings by a node id) that
// answer an agent refused the object not_found, as for an id that names
// nothing, so that an agent cannot learn whether another tree's object
// exists (policy refusals, before the object is read, stay
// permission_denied).
var concealed = map[string]bool{
	tetherv1connect.AgentServiceGetNodeProcedure:               true,
	tetherv1connect.CapabilityServiceGetGrantProcedure:         true,
	tetherv1connect.SupervisorServiceGetTerminationProcedure:   true,
	tetherv1connect.SupervisorServiceWatchTerminationProcedure: true,
	tetherv1connect.AgentServiceListNodesProcedure:             true,
	tetherv1connect.StopRuleServiceListStopRulesProcedure:      true,
	tetherv1connect.StopRuleServiceTestStopRuleProcedure:       true,
}

// concealedOutside lists the procedures that answer not_found only the
// agents that may not read self's grant (outside self's lineage: a
// sibling, a descendant, an unrelated agent); an ancestor may read it, so
// its refusal (it does not hold the grant) stays permission_denied.
var concealedOutside = map[string]bool{
	tetherv1connect.CapabilityServiceRefreshProcedure:  true,
	tetherv1connect.CapabilityServiceDelegateProcedure: true,
}

// concealedFromStrangers lists the procedures that answer not_found only
// the agents that may not read self's stop rule (neither in self's lineage
// nor under it: a sibling, an unrelated agent); self's descendants see the
// rule in effect at them, so their refusal (they did not set it) stays
// permission_denied (rogue42N test).
var concealedFromStrangers = map[string]bool{
	tetherv1connect.StopRuleServiceRemoveStopRuleProcedure: true,
}

// checkCell makes one caller's call in w and checks its verdict.
func checkCell(t *testing.T, w *authzWorld, procedure string, c caller, want verdict) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := authzRequests[procedure](ctx, w, c)
	code := connect.CodeOf(got.err)
	refused := got.err != nil && (code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied)
	where := fmt.Sprintf("%s by %s", procedure, c)
	switch {
	case c == anonymous || c == expired:
		if code != connect.CodeUnauthenticated {
			t.Errorf("%s: %v, want unauthenticated", where, got.err)
		}
	case want == denied && (concealed[procedure] && slices.Contains(everyAgent, c) ||
		concealedOutside[procedure] && slices.Contains([]caller{sibling, descendant, unrelated}, c) ||
		concealedFromStrangers[procedure] && slices.Contains([]caller{sibling, unrelated}, c)):
		// An agent may not learn that the object exists: it is refused
		// as if the id named nothing.
		if code != connect.CodeNotFound {
			t.Errorf("%s: %v, want not_found, as for an id that names nothing", where, got.err)
		}
	case want == denied:
		if code != connect.CodePermissionDenied {
			t.Errorf("%s: %v (decision %v), want permission_denied", where, got.err, got.decision)
		} else if !strings.Contains(got.err.Error(), "may") && !strings.Contains(got.err.Error(), "not") {
			t.Errorf("%s: the refusal %q does not say why", where, got.err)
		}
	case refused:
		t.Errorf("%s: refused (%v), want %s", where, got.err, want)
	case want == judged:
		if got.err != nil || got.decision.GetOutcome() != tetherv1.Outcome_OUTCOME_REJECTED {
			t.Errorf("%s: %v / %v, want a REJECTED decision (not the holder)", where, got.err, got.decision)
		} else if ev := got.decision.AuditEvent; ev != tetherv1.AuditEvent_AUDIT_EVENT_HOLDER_MISMATCH && ev != tetherv1.AuditEvent_AUDIT_EVENT_OWNERSHIP_CONFLICT {
			t.Errorf("%s: rejected with %s, want HOLDER_MISMATCH or OWNERSHIP_CONFLICT", where, ev)
		}
	case slices.Equal(authzMatrix[procedure].allow, holderOnly.allow) && authzMatrix[procedure].judge != nil:
		if got.err != nil || got.decision.GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Errorf("%s: %v / %v, want the holder's message ACCEPTED", where, got.err, got.decision)
		}
	}
	if got.err != nil && strings.Contains(got.err.Error(), "eyJ") {
		t.Errorf("%s: the error leaks a token: %q", where, got.err)
	}
}
