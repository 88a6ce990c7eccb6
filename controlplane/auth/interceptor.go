package auth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/internal/fault"
)

// Interceptor authenticates every request and applies the Policy.
//
// It runs twice over, for defence in depth: as HTTP middleware (Gate), which
// decides from the headers alone — before the body is read or inflated —
// and as a Connect interceptor, which trusts the Gate's decision when the
// request came through it and decides itself otherwise.
type Interceptor struct {
	Issuer Issuer
	Policy Policy
	Now    func() time.Time
	// AgentActive returns the lineage (the root node id of the tree) of an
	// agent credential's node when the node may still act; an error
	// wrapping ErrRevoked when the node is terminated or unknown, or a
	// *connect.Error with the code to answer (an exited node:
	// FailedPrecondition), or an error internal/fault categorizes
	// Precondition, answered FailedPrecondition (a node refused because
	// an ancestor's record is written). Its context carries the procedure
	// (ProcedureFromContext).
	AgentActive func(ctx context.Context, nodeID string) (lineage string, err error)
	// Revoked reports whether a token id was revoked (tether token
	// revoke); nil: no token is. It is consulted on every call, cached
	// token or not; an error (the revocations cannot be read yet) refuses
	// the call as unavailable.
	Revoked func(ctx context.Context, tokenID string) (bool, error)
	// RevocationsChanged, when set with Revoked, returns a channel closed
	// at the next revocation: an open stream of an operator's or a tool
	// server's token is checked again then, and ends (Unauthenticated)
	// once its token is revoked, as its next call would be refused.
	RevocationsChanged func() <-chan struct{}
	// AgentEnded, when set, runs beside each of an agent's open streams:
	// it returns an error wrapping ErrRevoked once the agent's node is
	// terminated or unknown (the stream then ends Unauthenticated, as its
	// next call would be refused), a *connect.Error when the node may no
	// longer act for another reason (the stream ends with it: an exited
	// node's, FailedPrecondition), or nil when ctx ends first. Its context
	// carries the stream's procedure (ProcedureFromContext). An end it
	// reports after the stream's handler returned leaves the handler's
	// answer as it was.
	AgentEnded func(ctx context.Context, nodeID string) error
	// AfterFuncAt, when set, runs f once Now's clock reads at (at once
	// when it already does) and returns what stops it: an operator's or a
	// tool server's open stream then ends (Unauthenticated) when its token
	// expires, as its next call would be refused. An agent's stream
	// outlives its credential, which its heartbeats refresh; it ends with
	// its node (AgentEnded). Armed for the moment, not for the time left
	// as read (clock.AfterFuncAt): a clock moved between the reading and
	// the arming armed the end late by the move.
	AfterFuncAt func(at time.Time, f func()) (stop func() bool)
	// Limiter bounds the request rate of each budget (Principal.Budget);
	// nil: unlimited. Every message of a stream costs one request.
	Limiter *RateLimiter
	// Evidence are the procedures by which a tool server reports what
	// became of a call it already began (its end, its cancel
	// acknowledgement). A tool server is not charged for them: they are
	// bounded by the calls it began, which were charged, and refusing one
	// would leave a call the gate saw end in flight in the record — which a
	// rogue could bring about by spending a shared gate's budget.
	Evidence map[string]bool
	// Relayed are the procedures by which a tool server asks about what a
	// caller showed it: an agent's capability token (BeginCall), the job
	// a fenced side effect names (GetLease). The interceptor does not
	// charge a tool server for them: the handler does, once it knows whose
	// request it is — to the lineage of the agent whose token verified
	// (ChargeRelayed), to the tool server's budget for that job
	// (ChargeJob), or to the tool server's refusal budget for a token
	// that did not verify or a job that does not exist (ChargeRefused). A
	// gate asks about everything it is shown, so charging the gate would
	// let one rogue caller, sending made-up tokens or jobs or its own many
	// times, spend the gate's budget and have every agent's calls through
	// it refused.
	Relayed map[string]bool
	// Upkeep are the procedures by which an agent keeps itself accounted
	// for: its session and heartbeats, its lease ACKs (an offer the
	// lineage made it, due by a deadline), renewals, cancel
	// acknowledgements and completions, its tool calls' ends and cancel
	// acknowledgements, its exit confirmation. Once its lineage's budget is
	// spent they draw on its node's own small Reserve, so that one member
	// of a lineage spending the shared budget cannot starve another's
	// upkeep: let a lease lapse or an offer miss its ACK, end a session,
	// or keep a drained node's exit from being confirmed. Nil Reserve: no
	// reserve.
	Upkeep  map[string]bool
	Reserve *RateLimiter
	// Held are the procedures whose messages name a lease the agent may
	// hold (a job and its generation), and Holds says whether a decoded
	// message is upkeep of a lease the agent holds that the lease's own
	// allowance admits (taking from that allowance when it does). Once
	// its lineage's budget is spent, an agent's Held message is admitted
	// when Holds says so, before its node's Reserve is touched: the
	// reserve is per node, the leases a node holds are many, and the
	// lineage's offers paid for each. A message Holds does not admit
	// falls back on the Reserve (if Upkeep), then is refused with the
	// lineage's refusal.
	//
	// The Gate reads no body, so it admits a Held call (a stream: its
	// first message) owing, and the call is settled once its message is
	// decoded. A call that is not settled is refused and spends one of
	// its node's Owing; with them spent, the Gate refuses the node's Held
	// calls from its headers again, as it did without Holds. Nil Holds: no
	// message is admitted for the lease it names; nil Owing: none at the
	// Gate (a stream's later messages still are).
	Held  map[string]bool
	Holds func(ctx context.Context, p Principal, msg any) bool
	Owing *RateLimiter
	// Anonymous bounds, per source address (an IPv6 address's /64:
	// sourceOf), the requests that carry no valid credential (nil:
	// unlimited): a token that does not verify, and one that does but is
	// dead (revoked, or an agent's whose node is terminated, unknown or
	// exited). A credential to verify, or a dead one's node to read, is
	// paid for before the work (a live one given its payment back once
	// its node is read), so an address past it is refused before its next
	// credential is verified, and before a dead one's node is read
	// (again), however many it sends at once.
	Anonymous *RateLimiter
	// SharedConn, when set, reports whether a request's connection
	// carries other callers' calls as well, by its headers (a replica
	// forwarding its callers' calls to this one): a request refused
	// because its caller holds every connection it may (Bind:
	// ErrTooManyConnections) is refused alone, its connection kept,
	// where another's would be closed. The mark need not be trusted: a
	// caller that forges it keeps a connection that still counts for
	// whoever it is bound to, and one bound to nobody is closed by the
	// server's own pre-authentication bound.
	SharedConn func(h http.Header) bool
	// BoundBudget, when set, returns the rate budget (Principal.Budget)
	// of the caller the request's connection was first bound to (Bind: a
	// live credential's), or "" when it is bound to none. A request on a
	// bound connection pays for its credential's verification, or a dead
	// one's node read, from that caller's own Anonymous budget
	// ("bound:<budget>"), not from its address's: a rogue sharing the
	// address (a NAT) that spends the address's budget with tokens that
	// do not verify cannot keep an agent already connected from having
	// its refreshed credential verified (rogue32e test).
	BoundBudget func(ctx context.Context) string
	// MaxStreams bounds the streams one principal holds open at once
	// (0: unlimited). An open stream is cheap only while it is quiet; this
	// is what bounds the quiet ones.
	MaxStreams int
	// MaxLineageStreams bounds the streams an agent's lineage (its root
	// and every descendant together) holds open at once (0: unlimited), so
	// that a rogue spawning children that each hold MaxStreams holds no
	// more than its lineage's share. Past it, each node still opens up to
	// SignalReserve of its own Signals streams (its session, its signal
	// watch: what it hears its stop on), so that a member of the lineage
	// holding the share cannot keep a sibling from being told to stop, and
	// up to StreamReserve streams of other kinds (a lease Channel, a
	// watch), so that it cannot keep a sibling from its work either. A
	// stream takes from its node's reserve first, so the share is left to
	// the rest. A lineage so holds at most MaxLineageStreams and
	// SignalReserve+StreamReserve per node, each node a spawn it paid for.
	MaxLineageStreams int
	Signals           map[string]bool
	SignalReserve     int
	StreamReserve     int
	// BodyReserve: the Gate holds a request admitted from its headers
	// whose body has not all arrived (its handler waiting for it) to the
	// caller's MaxStreams, and an agent's to its lineage's
	// MaxLineageStreams, counted apart from streams; past the lineage's,
	// each node still has BodyReserve of its own, taken first (awaitBody).
	// The same bound, counted apart again, the answers of admitted unary
	// calls being written (TakeAnswer).
	BodyReserve int
	// BodyBytesPerRequest prices a request's body by its size (0: not):
	// one request of the caller's budget (charge, as the call itself is)
	// per BodyBytesPerRequest bytes past the first BodyBytesPerRequest,
	// taken as the body is read and before the bytes are handed on, so
	// that nothing past the budget is decoded. Decoding a message of many
	// small fields (a map of 100,000 labels) costs about a hundred times
	// what a small call does. A compressed body (compressed) is priced up
	// front at the most it may inflate to, MaxBodyBytes: its bytes on the
	// wire say nothing of what decoding it costs. A message of a
	// procedure of MessagesCharged (client streams, whose every message
	// is charged once decoded) is priced so, on its own, from the length
	// its envelope announces (pricedMessages). A tool server's Evidence
	// and Relayed procedures are not priced.
	BodyBytesPerRequest int
	MaxBodyBytes        int
	// AnswerBytesPerRequest prices a unary call's answer by its size (0:
	// not): a request of the caller's budget per AnswerBytesPerRequest
	// bytes past the first, beyond what the call paid with Spend or
	// SpendDone for its work, taken once the answer is built even past
	// what the budget has left, the answer sent all the same
	// (meter.priceAnswer). Streams' messages are not priced so.
	AnswerBytesPerRequest int
	MessagesCharged       map[string]bool
	// Bind, when set, is told of every request authenticated and
	// authorised, before its rate budget is charged: the server binds the
	// connection the request came on (its context says which) to the
	// caller. An error refuses the request, charging nothing; one wrapping
	// ErrTooManyConnections also closes the connection (the Gate's answer
	// carries Connection: close, which HTTP/2 turns into a GOAWAY) unless
	// shared (SharedConn said the connection carries other callers'
	// calls), which Bind is told so that its refusal says what happens.
	Bind func(ctx context.Context, p Principal, shared bool) error
	// Cache remembers verified tokens (nil: verify every request).
	Cache *TokenCache
	// RateLimited, if set, is told of each request the Limiter refused,
	// with its procedure (metrics; it must return quickly).
	RateLimited func(procedure string)
	// Refused, when set, observes every request the Gate refuses (it never
	// reaches the Connect interceptors, the observer's included).
	Refused func(ctx context.Context, procedure string, start time.Time, err error)

	streamsMu sync.Mutex
	streams   map[string]int // by principal
	lineages  map[string]lineageStreams
	reserved  map[string]nodeReserve // streams admitted from a node's reserves, by principal
	bodies    bodies                 // requests admitted whose bodies have not all arrived
	answers   bodies                 // admitted unary calls' answers being written (TakeAnswer)

	// agentStreams are the agents' open streams by the id of the
	// credential each was opened with, ended by EndRevokedStreams.
	agentStreamsMu sync.Mutex
	agentStreams   map[string]map[uint64]context.CancelCauseFunc
	agentStreamSeq uint64
}

// EndRevokedStreams ends, unauthenticated, every open stream of an agent
// opened with the credential tokenID, which was just revoked (its
// tombstone is in the set Revoked reads). The server calls it as its
// feed publishes a bearer token's revocation: an agent's stream is not
// woken at every revocation (its messages are checked one by one,
// meteredConn), and one that sent none — a session held open without a
// heartbeat, a signals stream — outlived its credential's revocation,
// counted as the node's session in its exit evidence. A map lookup;
// nothing for a token no agent's stream was opened with.
func (i *Interceptor) EndRevokedStreams(tokenID string) {
	i.agentStreamsMu.Lock()
	defer i.agentStreamsMu.Unlock()
	for _, cancel := range i.agentStreams[tokenID] {
		cancel(connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: token %s was revoked; the stream is over", ErrRevoked, tokenID)))
	}
	delete(i.agentStreams, tokenID)
}

// holdAgentStream registers an agent's open stream under the id of its
// credential for EndRevokedStreams, until the returned func is called.
func (i *Interceptor) holdAgentStream(tokenID string, cancel context.CancelCauseFunc) (release func()) {
	i.agentStreamsMu.Lock()
	defer i.agentStreamsMu.Unlock()
	if i.agentStreams == nil {
		i.agentStreams = map[string]map[uint64]context.CancelCauseFunc{}
	}
	i.agentStreamSeq++
	seq := i.agentStreamSeq
	held := i.agentStreams[tokenID]
	if held == nil {
		held = map[uint64]context.CancelCauseFunc{}
		i.agentStreams[tokenID] = held
	}
	held[seq] = cancel
	return func() {
		i.agentStreamsMu.Lock()
		defer i.agentStreamsMu.Unlock()
		if held := i.agentStreams[tokenID]; held != nil {
			delete(held, seq)
			if len(held) == 0 {
				delete(i.agentStreams, tokenID)
			}
		}
	}
}

// nodeReserve counts the streams a node holds from its own reserves, by
// kind: its Signals streams (of SignalReserve) and its others (of
// StreamReserve).
type nodeReserve [2]int

const (
	signalStream = 0
	otherStream  = 1
)

// lineageStreams counts a lineage's open streams: shared, those against
// MaxLineageStreams; all, those and its nodes' reserved ones.
type lineageStreams struct{ shared, all int }

var _ connect.Interceptor = (*Interceptor)(nil)

// RetryAfterHeader carries a rate-limit refusal's retry hint, in whole
// seconds (at least 1), as HTTP's Retry-After does; the message says it
// in words too.
const RetryAfterHeader = "Retry-After"

// Authenticate checks the request's credential and the procedure's rule and
// returns the context carrying the principal. It charges the principal's
// rate-limit budget.
func (i *Interceptor) Authenticate(ctx context.Context, procedure string, header http.Header) (context.Context, error) {
	return i.authenticate(ctx, procedure, header, "")
}

// MintAgent mints an agent credential for node (Issuer.MintAgent) and
// remembers it in the Cache as verified, so that its first call, often on
// a connection of its own (a spawned child's, a new root's), is not paid
// from its address's budget for requests without a valid credential: a
// rogue behind the same address (a NAT) that kept that budget spent with
// forged tokens kept every child spawned there from starting. lineage is
// the node's (the root of its tree): the token is kept in its lineage's
// share of the cache (TokenCache), so that a lineage spawning thousands of
// children does not push other lineages' tokens out.
func (i *Interceptor) MintAgent(nodeID, lineage string, now time.Time, ttl time.Duration) (token string, exp time.Time, err error) {
	return i.mintAgentAs(newTokenID(), nodeID, lineage, now, ttl)
}

// mintAgentAs is MintAgent's credential of id.
func (i *Interceptor) mintAgentAs(id, nodeID, lineage string, now time.Time, ttl time.Duration) (token string, exp time.Time, err error) {
	token, m, err := i.Issuer.mintedAs(id, AudienceAgent, nodeID, "", now, ttl)
	if err != nil {
		return "", time.Time{}, err
	}
	i.Cache.minted(token, m, lineage, now)
	return token, m.exp, nil
}

// RefreshAgent mints the fresh credential an agent's session hands out in
// place of p, the credential the session was opened with: of p's id (jti),
// so that a credential and every one refreshed from it are one line, which
// a revocation of any of them by value ends (the tombstone names the id;
// RevokeToken keeps it as long as a credential of the line minted before
// it may live). A fresh id each time left a credential the session handed
// out before the revocation of the one it replaced alive, and refreshed,
// for as long as the node ran: a rogue holding a leaked credential that
// had it refreshed once kept acting after the security team revoked the
// leaked one (rogue46e test). A credential without an id gets a new one.
func (i *Interceptor) RefreshAgent(p Principal, now time.Time, ttl time.Duration) (token string, exp time.Time, err error) {
	id := p.TokenID
	if id == "" {
		id = newTokenID()
	}
	return i.mintAgentAs(id, p.Subject, p.Lineage, now, ttl)
}

// MintOperator is Issuer.MintOperator, the token remembered as MintAgent's.
func (i *Interceptor) MintOperator(subject string, role Role, now time.Time, ttl time.Duration) (token, id string, exp time.Time, err error) {
	token, m, err := i.Issuer.minted(AudienceOperator, subject, role.String(), now, ttl)
	if err != nil {
		return "", "", time.Time{}, err
	}
	i.Cache.minted(token, m, "", now)
	return token, m.principal.TokenID, m.exp, nil
}

// MintToolServer is Issuer.MintToolServer, the token remembered as
// MintAgent's.
func (i *Interceptor) MintToolServer(name string, now time.Time, ttl time.Duration) (token, id string, exp time.Time, err error) {
	token, m, err := i.Issuer.minted(AudienceToolServer, name, "", now, ttl)
	if err != nil {
		return "", "", time.Time{}, err
	}
	i.Cache.minted(token, m, "", now)
	return token, m.principal.TokenID, m.exp, nil
}

// authenticate is Authenticate with the request's source address, which
// bounds the requests that fail authentication.
func (i *Interceptor) authenticate(ctx context.Context, procedure string, header http.Header, peer string) (context.Context, error) {
	now := i.Now()
	token, err := bearer(header)
	var p Principal
	// paid: the request was charged to its address's budget before its
	// credential was verified, or a dead one's node read (prepayAnonymous);
	// charged: its refusal is the address's to pay. A request paid for
	// and not refused so is given its payment back once it is found live
	// (or a dead one's read failed): what it costs is its caller's, or
	// nobody's.
	paid, charged := false, false
	// budget: the Anonymous budget the request pays (anonymousBudget),
	// found when first needed — a cached live credential needs none.
	var budget *anonymousBudget
	budgetOf := func() *anonymousBudget {
		if budget == nil {
			budget = i.anonymousBudget(ctx, peer)
		}
		return budget
	}
	defer func() {
		if paid && !charged {
			i.Anonymous.give(budget.key, 1)
		}
	}()
	anonymous := func(refusal error) error {
		if paid {
			charged = true
			return refusal
		}
		return i.chargeAnonymous(peer, budgetOf(), refusal)
	}
	if err == nil {
		var cached, dead bool
		if p, cached, dead = i.Cache.lookup(i.Issuer, token, now); !cached || dead {
			// A source that keeps failing is refused before the next
			// verification, or the next read a dead credential would
			// cost: a flood of bad tokens, or of a dead node's, costs a
			// map lookup each. The request pays before the work, not
			// after it: else every request arriving while others were
			// being verified found the budget unspent, and was verified
			// too, however many were in flight at once.
			if paid, err = i.prepayAnonymous(peer, budgetOf()); err != nil {
				return ctx, err
			}
		}
		if !cached {
			// Verified, it keeps its payment until it is found live (its
			// revocation, its node read) and is given it back then: given
			// back as it verified, every dead credential sent at once for
			// the first time had its node read while the others' were,
			// and was charged only after (rogue32e test).
			p, err = i.Cache.verify(i.Issuer, token, now)
		}
	}
	if err != nil {
		return ctx, anonymous(connect.NewError(connect.CodeUnauthenticated, err))
	}
	// A credential that verifies but is dead (a revoked token, a
	// terminated, unknown or exited node's) has no principal whose budget
	// its refusal could cost: it costs its address's, as a token that does
	// not verify does, and is remembered as dead, so that once the budget
	// is spent it is refused before its node is read again.
	dead := func(refusal error) error {
		i.Cache.markDead(token)
		return anonymous(refusal)
	}
	if i.Revoked != nil && p.TokenID != "" {
		revoked, err := i.Revoked(ctx, p.TokenID)
		if err != nil {
			return ctx, connect.NewError(connect.CodeUnavailable, fmt.Errorf("auth: cannot check the token's revocation: %w", err))
		}
		if revoked {
			return ctx, dead(connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: token %s was revoked", ErrRevoked, p.TokenID)))
		}
	}
	if p.IsAgent() && i.AgentActive != nil {
		lineage, err := i.AgentActive(WithProcedure(ctx, procedure), p.Subject)
		if err != nil {
			if errors.Is(err, ErrRevoked) {
				return ctx, dead(connect.NewError(connect.CodeUnauthenticated, err))
			}
			var ce *connect.Error
			if errors.As(err, &ce) {
				// The hook chose the code (an exited node:
				// FailedPrecondition); a node that may not act is dead.
				return ctx, dead(ce)
			}
			if fault.KindOf(err) == fault.Precondition {
				// A refusal the hook's layer worded (a node that never
				// had a session, its claiming ancestor's record written:
				// tree.ErrAncestorRecorded), not a read that failed.
				return ctx, dead(connect.NewError(connect.CodeFailedPrecondition, err))
			}
			refusal := connect.NewError(connect.CodeUnavailable, fmt.Errorf("auth: cannot check the agent's node: %w", err))
			// The read failed, often because the call was reset as it
			// read (on etcd every call reads its node): the call is
			// charged all the same, or a rogue's rapid resets would cost
			// its lineage nothing — to the lineage the token's node was
			// found in before (a node's lineage never changes), or, not
			// yet known, to the address's budget when the call was
			// abandoned.
			switch {
			case p.Lineage != "":
				if err := i.spend(p, 1); err != nil {
					return ctx, err
				}
			case ctx.Err() != nil:
				return ctx, anonymous(refusal)
			}
			return ctx, refusal
		}
		if p.Lineage == "" {
			i.Cache.setLineage(token, lineage)
		}
		p.Lineage = lineage
	}
	rule, ok := i.Policy[procedure]
	if !ok {
		// Not a procedure of this server (every one has a rule: the
		// policy test enforces it), so nothing is being withheld: the
		// authenticated caller is told so, as the mux would. The refusal
		// costs the caller a request of its budget, as an admitted call
		// does: refusals are not free work (not counted as RateLimited,
		// whose label is a procedure: this path is the caller's choice).
		if err := i.spend(p, 1); err != nil {
			return ctx, err
		}
		return ctx, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("%s is not a procedure of this server", procedure))
	}
	if !rule.Allows(p) {
		if err := i.spend(p, 1); err != nil {
			if i.RateLimited != nil {
				i.RateLimited(procedure)
			}
			return ctx, err
		}
		who := "role " + p.Role.String()
		switch p.Kind {
		case KindAgent:
			who = "agents"
		case KindToolServer:
			who = "tool servers"
		}
		return ctx, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%w: %s may not call %s", ErrDenied, who, procedure))
	}
	if i.Bind != nil {
		if err := i.Bind(ctx, p, i.sharedConn(header)); err != nil {
			return ctx, err
		}
	}
	if p.Kind == KindToolServer && (i.Evidence[procedure] || i.Relayed[procedure]) {
		return WithPrincipal(ctx, p), nil
	}
	if err := i.spend(p, 1); err != nil {
		if i.owe(p, procedure) {
			return context.WithValue(WithPrincipal(ctx, p), owedKey{}, err), nil
		}
		if err := i.reserve(p, procedure, 1, err); err != nil {
			if i.RateLimited != nil {
				i.RateLimited(procedure)
			}
			return ctx, err
		}
	}
	return WithPrincipal(ctx, p), nil
}

// owedKey marks the context of a Held call admitted owing: its value is
// the refusal it gets if it is not settled.
type owedKey struct{}

// owe reports whether an agent's Held call, its lineage's budget spent,
// may be admitted owing (Interceptor.Held), and takes one of its node's
// Owing if so.
func (i *Interceptor) owe(p Principal, procedure string) bool {
	if !p.IsAgent() || !i.Held[procedure] || i.Holds == nil || i.Owing == nil {
		return false
	}
	ok, _ := i.Owing.Allow(owingBudget(p))
	return ok
}

func owingBudget(p Principal) string { return "owing:" + p.ID() }

type procedureKey struct{}

// WithProcedure returns ctx carrying the procedure being called.
func WithProcedure(ctx context.Context, procedure string) context.Context {
	return context.WithValue(ctx, procedureKey{}, procedure)
}

// ProcedureFromContext returns the procedure WithProcedure stored, or "".
func ProcedureFromContext(ctx context.Context) string {
	s, _ := ctx.Value(procedureKey{}).(string)
	return s
}

// spend charges n requests to p's budget.
func (i *Interceptor) spend(p Principal, n int) error {
	ok, wait := i.Limiter.AllowN(p.Budget(), n)
	if ok {
		return nil
	}
	who := p.ID()
	if p.IsAgent() && p.Lineage != "" {
		who = fmt.Sprintf("lineage %s (%s shares it with its root and every descendant)", p.Lineage, p.ID())
	}
	if n > 1 {
		who = fmt.Sprintf("%s, for a batch of %d messages", who, n)
	}
	return rateLimited(who, wait)
}

// charge is spend, with an agent's Upkeep falling back on its node's
// Reserve once its lineage's budget is spent.
func (i *Interceptor) charge(p Principal, procedure string, n int) error {
	err := i.spend(p, n)
	if err == nil {
		return nil
	}
	return i.reserve(p, procedure, n, err)
}

// reserve admits n of an agent's Upkeep messages its lineage refused
// (refusal) from its node's Reserve, or returns the refusal.
func (i *Interceptor) reserve(p Principal, procedure string, n int, refusal error) error {
	if !p.IsAgent() || !i.Upkeep[procedure] || i.Reserve == nil {
		return refusal
	}
	if ok, _ := i.Reserve.AllowN("upkeep:"+p.ID(), n); ok {
		return nil
	}
	return refusal
}

// chargeFor charges one message, msg, of a call: once the lineage's
// budget is spent, a Held message Holds admits is admitted, then the
// node's Reserve is tried.
func (m *meter) chargeFor(ctx context.Context, msg any) error {
	i := m.i
	err := i.spend(m.p, 1)
	if err == nil {
		return nil
	}
	if m.holds(ctx, msg) {
		return nil
	}
	return i.reserve(m.p, m.procedure, 1, err)
}

// holds reports whether msg is a Held message Holds admits.
func (m *meter) holds(ctx context.Context, msg any) bool {
	i := m.i
	return m.p.IsAgent() && i.Held[m.procedure] && i.Holds != nil && i.Holds(ctx, m.p, msg)
}

// settle settles a call admitted owing, now that its message msg is
// decoded: Holds, then the node's Reserve; if neither admits it, it is
// refused, and the node's Owing keeps what it spent.
func (m *meter) settle(ctx context.Context, msg any) error {
	owed := m.owed
	m.owed = nil
	i := m.i
	if m.holds(ctx, msg) || i.reserve(m.p, m.procedure, 1, owed) == nil {
		i.Owing.give(owingBudget(m.p), 1)
		return nil
	}
	if i.RateLimited != nil {
		i.RateLimited(m.procedure)
	}
	return owed
}

// rateLimited is the refusal of a rate limit: resource_exhausted, the
// wait in the message, in a Retry-After header and in a RetryInfo detail.
func rateLimited(who string, wait time.Duration) error {
	if wait <= 0 {
		wait = time.Millisecond
	}
	err := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: rate limit for %s exceeded; retry in %s", who, wait.Round(time.Millisecond)))
	err.Meta().Set(RetryAfterHeader, strconv.Itoa(int(math.Max(1, math.Ceil(wait.Seconds())))))
	// The same hint for gRPC clients, which read google.rpc.RetryInfo.
	if detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); derr == nil {
		err.AddDetail(detail)
	}
	return err
}

func sourceBudget(peer string) string { return "addr:" + sourceOf(peer) }

// anonymousBudget is the budget of Anonymous a request without a valid
// credential pays: its connection's first bound caller's (BoundBudget),
// or else its source address's.
type anonymousBudget struct {
	key   string // in Anonymous
	bound string // the bound caller's budget, or ""
	peer  string
}

func (i *Interceptor) anonymousBudget(ctx context.Context, peer string) *anonymousBudget {
	if peer == "" {
		return &anonymousBudget{}
	}
	if i.BoundBudget != nil {
		if b := i.BoundBudget(ctx); b != "" {
			return &anonymousBudget{key: "bound:" + b, bound: b, peer: peer}
		}
	}
	return &anonymousBudget{key: sourceBudget(peer), peer: peer}
}

// refused is the refusal of a request past the budget.
func (b *anonymousBudget) refused(wait time.Duration) error {
	if b.bound != "" {
		return rateLimited(fmt.Sprintf("requests without a valid credential on a connection bound to %s", b.bound), wait)
	}
	return rateLimited(fmt.Sprintf("requests without a valid credential from %s", sourceOf(b.peer)), wait)
}

// prepayAnonymous charges a request from peer to its budget for requests
// without a valid credential (Anonymous, anonymousBudget) before its
// credential is verified, or a dead one's node read, and reports whether
// it did; once the budget is spent it refuses the request, charging
// nothing. Nothing is charged when peer is unknown ("": the request did
// not come through the Gate) or there is no budget.
func (i *Interceptor) prepayAnonymous(peer string, budget *anonymousBudget) (bool, error) {
	if peer == "" || i.Anonymous == nil || i.Anonymous.Rate <= 0 {
		return false, nil
	}
	if ok, wait := i.Anonymous.Allow(budget.key); !ok {
		return false, budget.refused(wait)
	}
	return true, nil
}

// chargeAnonymous charges the refusal of a request without a valid
// credential to its budget (Anonymous, anonymousBudget) and returns it,
// or the budget's refusal once it is spent.
func (i *Interceptor) chargeAnonymous(peer string, budget *anonymousBudget, refusal error) error {
	if peer == "" {
		return refusal
	}
	if ok, wait := i.Anonymous.Allow(budget.key); !ok {
		return budget.refused(wait)
	}
	return refusal
}

// SourceOf is sourceOf: the source address (an IPv4 address, an IPv6
// address's /64) of peer ("host:port"), as the budgets for requests
// without a valid credential key it.
func SourceOf(peer string) string { return sourceOf(peer) }

// sourceOf names the source a request without a valid credential is
// budgeted by: an IPv4 address, or an IPv6 address's /64 — the block one
// subscriber is given at least, all of whose addresses it may send from
// (keyed by the whole address, each of them would come with a fresh
// burst and leave a budget in memory for a minute).
func sourceOf(peer string) string {
	host := hostOf(peer)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip = ip.Unmap().WithZone(""); ip.Is4() {
		return ip.String()
	}
	block, err := ip.Prefix(64)
	if err != nil {
		return host
	}
	return block.String()
}

func hostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// Spend charges n more requests to the budget of the caller's principal:
// a stream message that carries a batch of n messages costs n, like n
// unary calls, and so does a unary call that does the work of n (a batch
// of n children). It is a no-op outside a call the Interceptor admitted.
func Spend(ctx context.Context, n int) error {
	m, ok := ctx.Value(meterKey{}).(*meter)
	if !ok || n <= 0 {
		return nil
	}
	if err := m.i.charge(m.p, m.procedure, n); err != nil {
		return err
	}
	m.paid += n
	return nil
}

// SpendDone is Spend for work already done, priced by what it turned out
// to be (a subtree read whole, a request per thousand nodes): the n
// requests are taken even when the budget has fewer left, which goes into
// debt and refills at its rate (RateLimiter.Owe), and the work is
// answered. Spend takes nothing when it refuses, so a price charged after
// the work and refused waived it: a rogue that kept its budget below that
// price had the work done for the one request its call took at the Gate
// (rogue26budget test). Refusing the work once done would save nothing,
// and a caller that retried when told to would be refused for ever.
func SpendDone(ctx context.Context, n int) {
	m, ok := ctx.Value(meterKey{}).(*meter)
	if !ok || n <= 0 {
		return
	}
	m.paid += n
	m.i.Limiter.Owe(m.p.Budget(), n)
}

// SpendMessages is Spend for a batch of n messages, msg(k) the k-th: once
// the lineage's budget is spent, each message is admitted on its own, as
// a call of its own would be — a Held message Holds admits from its
// lease's allowance (Interceptor.Held) — and the others, wherever they
// stand in the batch, are charged to the node's Reserve together: the
// batch is refused, and takes nothing from the Reserve, when it cannot
// cover them. A message Holds does not admit (a renewal of a generation
// superseded a moment before) used to have every message after it charged
// to the Reserve, so that one stale message in a batch of upkeep had the
// whole batch refused. The messages asked about are at most those Holds
// admits, which its node's bound limits, and the Reserve's burst, plus one.
func SpendMessages(ctx context.Context, n int, msg func(k int) any) error {
	m, ok := ctx.Value(meterKey{}).(*meter)
	if !ok || n <= 0 {
		return nil
	}
	err := m.i.spend(m.p, n)
	if err == nil {
		return nil
	}
	others := 0
	for k := range n {
		if m.holds(ctx, msg(k)) {
			continue
		}
		if others++; m.i.Reserve == nil || float64(others) > m.i.Reserve.Burst {
			return err // more than the Reserve could ever admit at once
		}
	}
	if others == 0 {
		return nil
	}
	return m.i.reserve(m.p, m.procedure, others, err)
}

// ChargeRelayed charges a call a tool server relayed (Interceptor.Relayed)
// to the budget of lineage, the lineage of agent (a principal id), whose
// capability token verified: the agent's call spends what its own calls
// would. The refusal names the lineage. It is a no-op outside a relayed
// call the Interceptor admitted.
func ChargeRelayed(ctx context.Context, lineage, agent string) error {
	m, ok := relayed(ctx)
	if !ok || lineage == "" {
		return nil
	}
	if ok, wait := m.i.Limiter.Allow("lineage:" + lineage); !ok {
		return m.refused(rateLimited(fmt.Sprintf("lineage %s (%s, whose capability token %s relayed, shares it with its root and every descendant)", lineage, agent, m.p.ID()), wait))
	}
	return nil
}

// ChargeJob charges a tool server's relayed read of job (a fence asking
// whether a generation was issued) to the tool server's budget for that
// job, apart from its own: a rogue caller that keeps naming a job, its own
// or another's, spends that job's reads at that tool server only. It is a
// no-op outside a relayed call the Interceptor admitted.
func ChargeJob(ctx context.Context, job string) error {
	m, ok := relayed(ctx)
	if !ok {
		return nil
	}
	if ok, wait := m.i.Limiter.Allow(m.p.Budget() + "/job:" + job); !ok {
		return m.refused(rateLimited(fmt.Sprintf("%s's reads of job %s", m.p.ID(), job), wait))
	}
	return nil
}

// ChargeRefused charges a relayed call whose capability token did not
// verify, or whose job does not exist (or whose request was refused
// before it was checked), to the tool server's refusal budget, apart from its own: a gate relaying garbage is
// bounded, and its own calls, and the valid tokens it relays, are not
// refused for it.
func ChargeRefused(ctx context.Context) error {
	m, ok := relayed(ctx)
	if !ok {
		return nil
	}
	if ok, wait := m.i.Limiter.Allow(refusalBudget(m.p)); !ok {
		return m.refused(refusalsLimited(m.p, wait))
	}
	return nil
}

// RefusalsSpent returns the refusal ChargeRefused would answer, without
// charging anything, when the tool server's refusal budget is spent; nil
// otherwise. A handler asks it before expensive work on a token that
// would likely be refused.
func RefusalsSpent(ctx context.Context) error {
	m, ok := relayed(ctx)
	if !ok {
		return nil
	}
	if limited, wait := m.i.Limiter.Exhausted(refusalBudget(m.p)); limited {
		return m.refused(refusalsLimited(m.p, wait))
	}
	return nil
}

func refusalBudget(p Principal) string { return p.Budget() + "/refused" }

func refusalsLimited(p Principal, wait time.Duration) error {
	return rateLimited(fmt.Sprintf("%s's requests refused (capability tokens that do not verify, jobs that do not exist, lease generations that may not act)", p.ID()), wait)
}

// relayed returns the meter of a relayed call a tool server made.
func relayed(ctx context.Context) (*meter, bool) {
	m, ok := ctx.Value(meterKey{}).(*meter)
	if !ok || m.p.Kind != KindToolServer || !m.i.Relayed[m.procedure] {
		return nil, false
	}
	return m, true
}

// refused tells the RateLimited hook of a refusal.
func (m *meter) refused(err error) error {
	if m.i.RateLimited != nil {
		m.i.RateLimited(m.procedure)
	}
	return err
}

type meterKey struct{}

type meter struct {
	i         *Interceptor
	p         Principal
	procedure string
	// owed: the call was admitted owing (Interceptor.Held), this is its
	// refusal; settle clears it.
	owed error
	// paid counts the requests the call was charged beyond its own (Spend,
	// SpendDone), which its answer's price (AnswerBytesPerRequest) counts
	// as paid. A unary call's meter is its goroutine's alone.
	paid int
}

// newMeter is the meter of a call admitted with ctx.
func (i *Interceptor) newMeter(ctx context.Context, p Principal, procedure string) *meter {
	owed, _ := ctx.Value(owedKey{}).(error)
	return &meter{i: i, p: p, procedure: procedure, owed: owed}
}

// sharedConn reports whether a request's headers say its connection
// carries other callers' calls (SharedConn).
func (i *Interceptor) sharedConn(h http.Header) bool {
	return i.SharedConn != nil && h != nil && i.SharedConn(h)
}

// gateKey marks a context whose request the Gate admitted.
type gateKey struct{}

// Gate is the Interceptor as HTTP middleware in front of the Connect
// handlers: it authenticates and authorises an RPC from its headers alone,
// before anything reads its body, so a request without a valid credential
// never has its body read or decompressed — a gzip bomb is refused for
// the price of a header lookup. Requests that are not RPCs (health,
// metrics, JWKS) pass through.
func (i *Interceptor) Gate(next http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !i.guards(r.URL.Path) || !errw.IsSupported(r) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		ctx, err := i.authenticate(r.Context(), r.URL.Path, r.Header, r.RemoteAddr)
		if err != nil {
			if i.Refused != nil {
				i.Refused(r.Context(), r.URL.Path, start, err)
			}
			// The body is never read: the server discards at most a little
			// of it and closes an HTTP/1.1 connection; HTTP/2 resets the
			// stream.
			if r.ProtoMajor == 1 || errors.Is(err, ErrTooManyConnections) && !i.sharedConn(r.Header) {
				w.Header().Set("Connection", "close")
			}
			_ = errw.Write(w, withoutHeaders(r), err)
			return
		}
		p, _ := FromContext(ctx)
		if err := i.priceBody(p, r); err != nil {
			if i.Refused != nil {
				i.Refused(r.Context(), r.URL.Path, start, err)
			}
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close")
			}
			_ = errw.Write(w, r, err)
			return
		}
		release, err := i.awaitBody(p, r)
		if err != nil {
			if i.Refused != nil {
				i.Refused(r.Context(), r.URL.Path, start, err)
			}
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close")
			}
			_ = errw.Write(w, r, err)
			return
		}
		if release != nil {
			defer release()
			r.Body = &awaitedBody{ReadCloser: r.Body, release: release}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, gateKey{}, p)))
	})
}

// refusalHeaders are the request headers connect's ErrorWriter reads to
// write a refusal (its content type and protocol version).
var refusalHeaders = []string{"Content-Type", "Connect-Protocol-Version"}

// withoutHeaders returns r for writing its refusal: a copy holding only
// the headers the refusal's writer reads, r's own emptied. The write may
// wait up to the write timeout for a client that grants no flow-control
// window, and a request's headers (up to --max-header-bytes, 64 KiB) were
// kept all that while: PreAuthRequests of them on each connection the
// server takes without a credential (rogue32e test).
func withoutHeaders(r *http.Request) *http.Request {
	h := make(http.Header, len(refusalHeaders))
	for _, k := range refusalHeaders {
		if v := r.Header.Get(k); v != "" {
			h.Set(k, strings.Clone(v))
		}
	}
	clear(r.Header)
	out := *r
	out.Header = h
	return &out
}

// priceBody prices an admitted request's body (BodyBytesPerRequest): a
// compressed one up front, refused if its price is; an uncompressed one as
// it is read (pricedBody); a client stream's message by message
// (pricedMessages).
func (i *Interceptor) priceBody(p Principal, r *http.Request) error {
	per, procedure := i.BodyBytesPerRequest, r.URL.Path
	if per <= 0 || (p.Kind == KindToolServer && (i.Evidence[procedure] || i.Relayed[procedure])) {
		return nil
	}
	if i.MessagesCharged[procedure] {
		r.Body = &pricedMessages{ReadCloser: r.Body, i: i, p: p, procedure: procedure, per: int64(per)}
		return nil
	}
	if compressed(r.Header) {
		n := (i.MaxBodyBytes - 1) / per
		if n <= 0 {
			return nil
		}
		return i.chargeSize(p, procedure, n, func() string {
			return fmt.Sprintf("a compressed request may inflate to %d bytes, which cost %d requests beside the call's own (one per %d bytes); send it uncompressed to pay for its size", i.MaxBodyBytes, n, per)
		})
	}
	r.Body = &pricedBody{ReadCloser: r.Body, i: i, p: p, procedure: procedure, per: int64(per), paid: int64(per)}
	return nil
}

// compressed reports whether a request's body, or the messages in it, may
// be compressed: Connect's unary and streaming headers and gRPC's.
func compressed(h http.Header) bool {
	for _, name := range []string{"Content-Encoding", "Connect-Content-Encoding", "Grpc-Encoding"} {
		if v := headerValue(h, name); v != "" && !strings.EqualFold(v, "identity") {
			return true
		}
	}
	return false
}

// headerValue is h.Get(key) for a key already in canonical form (a
// constant here), without Get's pass over the key to canonicalise it: the
// servers store every request header under its canonical key, as Get
// looks it up. Two to four lookups a call on the authenticated path.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// pricedBody charges its request's caller one request per `per` bytes
// read past the first `per`, before handing them on; once a charge is
// refused it reads nothing more, and the call fails with the refusal.
type pricedBody struct {
	io.ReadCloser
	i          *Interceptor
	p          Principal
	procedure  string
	per        int64
	read, paid int64
	err        error
}

func (b *pricedBody) Read(buf []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.ReadCloser.Read(buf)
	b.read += int64(n)
	// One at a time, so that a refusal leaves the budget spent on the
	// bytes read before it.
	for b.read > b.paid {
		if b.err = b.i.chargeSize(b.p, b.procedure, 1, func() string {
			return fmt.Sprintf("a request's body costs a request per %d bytes past the first %d, beside the call's own", b.per, b.per)
		}); b.err != nil {
			return 0, b.err
		}
		b.paid += b.per
	}
	return n, err
}

// pricedMessages charges a client stream's caller, for each message of
// the stream, one request per `per` bytes of it past the first `per`,
// taken one at a time once the message's envelope (a flags byte and its
// length, as Connect and gRPC both frame a stream) has arrived and before
// any of its bytes are handed on; a compressed message costs what one of
// MaxBodyBytes would. The message's own request is charged once it is
// decoded (meteredConn), as before. Once a charge is refused it reads
// nothing more, and the stream ends with the refusal.
type pricedMessages struct {
	io.ReadCloser
	i         *Interceptor
	p         Principal
	procedure string
	per       int64
	prefix    [5]byte
	got       int   // bytes of the current envelope's prefix read
	left      int64 // bytes of the current message still to hand on
	err       error
}

func (b *pricedMessages) Read(buf []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(buf) == 0 {
		return 0, nil
	}
	if b.left > 0 {
		if int64(len(buf)) > b.left {
			buf = buf[:b.left]
		}
		n, err := b.ReadCloser.Read(buf)
		b.left -= int64(n)
		return n, err
	}
	// An envelope's prefix: read no further than it, and price the
	// message it announces before handing the prefix on.
	if len(buf) > len(b.prefix)-b.got {
		buf = buf[:len(b.prefix)-b.got]
	}
	n, err := b.ReadCloser.Read(buf)
	copy(b.prefix[b.got:], buf[:n])
	if b.got += n; b.got < len(b.prefix) {
		return n, err
	}
	b.got = 0
	b.left = int64(binary.BigEndian.Uint32(b.prefix[1:]))
	size, why := b.left, fmt.Sprintf("a stream's message costs a request per %d bytes past the first %d, beside its own", b.per, b.per)
	if b.prefix[0]&1 != 0 && b.i.MaxBodyBytes > 0 {
		// Compressed: its length says nothing of what decoding it costs.
		size, why = int64(b.i.MaxBodyBytes), fmt.Sprintf("a compressed stream message may inflate to %d bytes, which cost a request per %d bytes past the first %d, beside its own; send it uncompressed to pay for its size", b.i.MaxBodyBytes, b.per, b.per)
	}
	for k := (size - 1) / b.per; k > 0; k-- {
		// A refusal is handed on with the prefix: the reader reading the
		// message after it gets the refusal, none of its bytes.
		if b.err = b.i.chargeSize(b.p, b.procedure, 1, func() string { return why }); b.err != nil {
			break
		}
	}
	return n, err
}

// chargeSize charges n requests for a body's or a message's size; a
// refusal is counted (RateLimited) and says, before the rate limit's
// words, why the size cost them.
func (i *Interceptor) chargeSize(p Principal, procedure string, n int, why func() string) error {
	err := i.charge(p, procedure, n)
	if err == nil {
		return nil
	}
	if i.RateLimited != nil {
		i.RateLimited(procedure)
	}
	return bodyPriced(err, why())
}

// bodyPriced is a refusal of a body's price: the rate limit's, its words
// first.
func bodyPriced(err error, why string) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	out := connect.NewError(ce.Code(), fmt.Errorf("%s: %s", why, ce.Message()))
	for k, v := range ce.Meta() {
		out.Meta()[k] = v
	}
	for _, d := range ce.Details() {
		out.AddDetail(d)
	}
	return out
}

// guards reports whether the Gate checks requests to path: every
// procedure of the policy, and anything else under a tether service (which
// the mux then answers 404 — to authenticated callers only). Other
// endpoints (gRPC health, health, metrics, JWKS) are public.
func (i *Interceptor) guards(path string) bool {
	if _, ok := i.Policy[path]; ok {
		return true
	}
	return strings.HasPrefix(path, "/tether.")
}

// Guards reports whether the Gate checks requests to path (the others are
// public endpoints, which no credential is asked for).
func (i *Interceptor) Guards(path string) bool { return i.guards(path) }

// admitted returns the principal the Gate admitted the request as, or
// authenticates it now (a handler mounted without the Gate).
func (i *Interceptor) admitted(ctx context.Context, procedure string, header http.Header, peer string) (context.Context, Principal, error) {
	if p, ok := ctx.Value(gateKey{}).(Principal); ok {
		return ctx, p, nil
	}
	ctx, err := i.authenticate(ctx, procedure, header, peer)
	if err != nil {
		return ctx, Principal{}, err
	}
	p, _ := FromContext(ctx)
	return ctx, p, nil
}

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, p, err := i.admitted(ctx, req.Spec().Procedure, req.Header(), req.Peer().Addr)
		if err != nil {
			return nil, err
		}
		m := i.newMeter(ctx, p, req.Spec().Procedure)
		if m.owed != nil {
			if err := m.settle(ctx, req.Any()); err != nil {
				return nil, err
			}
		}
		// A batch call (SpawnBatch) charges its further items with Spend.
		resp, err := next(context.WithValue(ctx, meterKey{}, m), req)
		if err != nil {
			return resp, err
		}
		m.priceAnswer(resp)
		return resp, nil
	}
}

// priceAnswer charges a unary call's answer by its size
// (AnswerBytesPerRequest): a request per AnswerBytesPerRequest bytes past
// the first, less what the call already paid beyond its own request (a
// listing's price per thousand nodes read, a batch's further items). The
// answer is built, and may follow a change the call made, so it is
// answered and its price taken even past what the budget has left
// (SpendDone): the caller's next calls wait for the debt to refill. A
// listing whose size the caller shapes (the stop rules in effect along a
// chain of its nodes, kilobytes each) answered megabytes for one request
// (rogue26answer test).
func (m *meter) priceAnswer(resp connect.AnyResponse) {
	per := m.i.AnswerBytesPerRequest
	if per <= 0 || resp == nil {
		return
	}
	msg, ok := resp.Any().(proto.Message)
	if !ok {
		return
	}
	size := proto.Size(msg)
	if price := (size-1)/per - m.paid; size > per && price > 0 {
		m.paid += price
		m.i.Limiter.Owe(m.p.Budget(), price)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor: after admission,
// the stream takes one of the principal's MaxStreams slots until it ends,
// and every message after the first costs one request of its budget (the
// first was paid for when the stream opened).
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, p, err := i.admitted(ctx, conn.Spec().Procedure, conn.RequestHeader(), conn.Peer().Addr)
		if err != nil {
			return err
		}
		release, err := i.openStream(p, conn.Spec().Procedure)
		if err != nil {
			return err
		}
		defer release()
		// Operators' and tool servers' streams end with their token (its
		// revocation or its expiry); an agent's with its node (its
		// credential dies with it), so that thousands of sessions need not
		// wake at every grant revocation.
		if i.Revoked != nil && i.RevocationsChanged != nil && p.TokenID != "" && !p.IsAgent() {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			go i.endOnRevocation(ctx, p.TokenID, cancel)
		}
		if i.AfterFuncAt != nil && !p.IsAgent() && !p.ExpiresAt.IsZero() {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			// Refused from ExpiresAt+Leeway on, like a call (TokenCache).
			stop := i.AfterFuncAt(p.ExpiresAt.Add(Leeway), func() {
				cancel(&ended{connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: expired at %s; the stream is over", ErrBadCredential, p.ExpiresAt.UTC().Format(time.RFC3339)))})
			})
			defer stop()
		}
		// An agent's stream outlives its credential's expiry (its session
		// refreshes it), but not the credential's revocation (tether
		// token revoke, by value): each message it sends is checked as a
		// call is (meteredConn), the first one after the revocation
		// ending the stream, and a stream that sends none is ended as the
		// revocation is published here (EndRevokedStreams), without
		// waking every stream at each revocation. Unchecked, a session a
		// revoked credential had opened went on acknowledging its
		// heartbeats and handed out a fresh credential, of another id,
		// that every call took (rogue45b test).
		var revokedNow func(context.Context) error
		if p.IsAgent() && i.Revoked != nil && p.TokenID != "" {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			revokedNow = func(ctx context.Context) error {
				revoked, err := i.Revoked(ctx, p.TokenID)
				switch {
				case err != nil:
					refusal := connect.NewError(connect.CodeUnavailable, fmt.Errorf("auth: cannot check the token's revocation: %w", err))
					cancel(&ended{refusal})
					return refusal
				case revoked:
					refusal := connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: token %s was revoked; the stream is over", ErrRevoked, p.TokenID))
					cancel(refusal)
					return refusal
				}
				return nil
			}
			// Held for EndRevokedStreams, then checked again: a
			// revocation that reached the set between the admission's
			// check and the hold ended no stream here. (The set holds a
			// revocation before its publication ends the streams held.)
			defer i.holdAgentStream(p.TokenID, cancel)()
			if err := revokedNow(ctx); err != nil {
				return err
			}
		}
		if p.IsAgent() && i.AgentEnded != nil {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			go func() {
				err := i.AgentEnded(WithProcedure(ctx, conn.Spec().Procedure), p.NodeID())
				var ce *connect.Error
				switch {
				case errors.Is(err, ErrRevoked):
					cancel(connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w; the stream is over", err)))
				case errors.As(err, &ce):
					cancel(&ended{ce}) // the hook chose the code (an exited node: FailedPrecondition)
				}
			}()
		}
		m := i.newMeter(ctx, p, conn.Spec().Procedure)
		// The stream's end is what ended its context before its handler
		// returned; once the handler has returned, its answer stands. A
		// session ended cleanly on the exit claim it stored lets the
		// termination finish, and the node's end a moment later (the watch
		// above) turned that clean end into a refusal whenever it came
		// before this line read the cause.
		// (A context of its own: the watches' goroutines read ctx.)
		streamCtx, finish := context.WithCancelCause(ctx)
		err = next(context.WithValue(streamCtx, meterKey{}, m), &meteredConn{StreamingHandlerConn: conn, m: m, ctx: streamCtx, revoked: revokedNow})
		finish(nil)
		if afterStreamHandler != nil {
			afterStreamHandler()
		}
		cause := context.Cause(streamCtx)
		if errors.Is(cause, ErrRevoked) {
			return cause
		}
		if e, ok := cause.(*ended); ok {
			return e.err
		}
		return err
	}
}

// afterStreamHandler, set by tests only, runs once a stream's handler has
// returned, before the stream's end is decided.
var afterStreamHandler func()

// ended is the cause of a stream's end that AgentEnded chose the code of.
type ended struct{ err *connect.Error }

func (e *ended) Error() string { return e.err.Error() }

// endOnRevocation cancels a stream's context, with the refusal as its
// cause, once the stream's token is revoked.
func (i *Interceptor) endOnRevocation(ctx context.Context, tokenID string, cancel context.CancelCauseFunc) {
	for {
		changed := i.RevocationsChanged()
		revoked, err := i.Revoked(ctx, tokenID)
		if err != nil {
			return // the stream's context ended, or the feed stopped (and with it the server)
		}
		if revoked {
			cancel(connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: token %s was revoked; the stream is over", ErrRevoked, tokenID)))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// openStream takes a stream slot of p, and of its node's reserve (of
// signal streams for a Signals procedure, of other streams otherwise) or,
// that spent, of its lineage's share.
func (i *Interceptor) openStream(p Principal, procedure string) (release func(), err error) {
	lineage := ""
	if p.IsAgent() && i.MaxLineageStreams > 0 {
		lineage = p.Lineage
	}
	if i.MaxStreams <= 0 && lineage == "" {
		return func() {}, nil
	}
	key := p.ID()
	i.streamsMu.Lock()
	defer i.streamsMu.Unlock()
	if i.MaxStreams > 0 && i.streams[key] >= i.MaxStreams {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: %s already has %d open streams, the limit per caller; close one first", key, i.MaxStreams))
	}
	kind, reserve, what, hint := otherStream, i.StreamReserve, "streams", " (each node may still open its own signal stream)"
	if i.Signals[procedure] {
		kind, reserve, what, hint = signalStream, i.SignalReserve, "signal streams", ""
	}
	reserved := false
	if lineage != "" {
		reserved = i.reserved[key][kind] < reserve
		if !reserved && i.lineages[lineage].shared >= i.MaxLineageStreams {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("auth: lineage %s (%s shares it with its root and every descendant) already holds %d open streams, the limit per lineage (tether serve --max-streams-per-lineage), and %s already has its own %d %s beside them; close one first%s", lineage, key, i.MaxLineageStreams, key, reserve, what, hint))
		}
	}
	if i.streams == nil {
		i.streams = map[string]int{}
		i.lineages = map[string]lineageStreams{}
		i.reserved = map[string]nodeReserve{}
	}
	i.streams[key]++
	if lineage != "" {
		n := i.lineages[lineage]
		n.all++
		if reserved {
			own := i.reserved[key]
			own[kind]++
			i.reserved[key] = own
		} else {
			n.shared++
		}
		i.lineages[lineage] = n
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			i.streamsMu.Lock()
			defer i.streamsMu.Unlock()
			if i.streams[key]--; i.streams[key] <= 0 {
				delete(i.streams, key)
			}
			if lineage == "" {
				return
			}
			if reserved {
				own := i.reserved[key]
				if own[kind]--; own == (nodeReserve{}) {
					delete(i.reserved, key)
				} else {
					i.reserved[key] = own
				}
			}
			n := i.lineages[lineage]
			n.all--
			if !reserved {
				n.shared--
			}
			if n.all <= 0 {
				delete(i.lineages, lineage)
			} else {
				i.lineages[lineage] = n
			}
		})
	}, nil
}

// OpenStreams returns how many streams principal (its ID) holds open.
func (i *Interceptor) OpenStreams(principal string) int {
	i.streamsMu.Lock()
	defer i.streamsMu.Unlock()
	return i.streams[principal]
}

// OpenLineageStreams returns how many streams the agents of lineage (its
// root's node id) hold open, the streams of their nodes' reserves included.
func (i *Interceptor) OpenLineageStreams(lineage string) int {
	i.streamsMu.Lock()
	defer i.streamsMu.Unlock()
	return i.lineages[lineage].all
}

// meteredConn charges every received message after the first (paid for
// when the stream opened, or settled when it arrives if the stream was
// admitted owing).
type meteredConn struct {
	connect.StreamingHandlerConn
	m        *meter
	ctx      context.Context
	received int
	// revoked, when set (an agent's stream), returns the refusal once the
	// credential the stream was opened with is revoked, and ends the
	// stream with it.
	revoked func(context.Context) error
}

// Receive charges a message once it has arrived (a stream waiting quietly
// for its next message costs nothing); a message over the budget is
// dropped unhandled and ends the stream with the refusal. An agent's
// message is first checked against its credential's revocation, as its
// call would be: one of a revoked credential is dropped unhandled and
// unpaid, and ends the stream unauthenticated.
func (c *meteredConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if c.revoked != nil {
		if err := c.revoked(c.ctx); err != nil {
			return err
		}
	}
	c.received++
	switch {
	case c.received == 1 && c.m.owed != nil:
		return c.m.settle(c.ctx, msg)
	case c.received > 1:
		return c.m.chargeFor(c.ctx, msg)
	}
	return nil
}

func bearer(h http.Header) (string, error) {
	v := headerValue(h, "Authorization")
	if v == "" {
		return "", ErrNoCredential
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: Authorization header must be \"Bearer <token>\"", ErrBadCredential)
	}
	return strings.TrimSpace(token), nil
}
