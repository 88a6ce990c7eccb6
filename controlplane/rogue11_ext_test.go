package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The eleventh rogue pass: what the tenth left open. Each test plays one
// rogue through the real server (Badger on disk, real HTTP/2, real JWTs,
// the manual clock).

// streamEnd waits for a server stream to end and returns its error; a
// stream still open at the guard fails the test (the guard is against a
// hang, not a timing).
func streamEnd(t *testing.T, what string, receive func() error) error {
	t.Helper()
	ended := make(chan error, 1)
	go func() {
		for {
			if err := receive(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s is still open", what)
		return nil
	}
}

// TestARogueThatClaimsItsOwnExitLosesItsRevocationFeed: a rogue opens its
// revocation feed and a lease channel, then claims its own exit
// (ConfirmExit by itself, not terminated). From then on it may not act: a
// new call with its credential is refused. But its open streams were ended
// only with its node's termination, and an exited node is not terminated
// until an operator stops it: the feed went on serving its lineage's
// revocations to a node that said it was gone. The feed now ends,
// failed_precondition as a new call would. (Its lease channel stays open:
// each message on it is refused and kept as a contradiction, rogue2; its
// sessions' end is evidence weighed against its claim.)
func TestARogueThatClaimsItsOwnExitLosesItsRevocationFeed(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	root := register(t, admin, "rogue")
	rogue := srv.Clients(root.Credential)

	feed, ch := openFeedAndChannel(ctx, t, rogue)
	renewNone := func(seq uint64) *tetherv1.ChannelRequest {
		return &tetherv1.ChannelRequest{CorrelationId: seq, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{JobId: "job-none", LeaseId: "l_none", LeaseGeneration: 1, RenewSequence: seq}}}
	}
	if err := ch.Send(renewNone(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Receive(); err != nil {
		t.Fatalf("the rogue's channel: %v", err)
	}
	testserver.WaitFor(t, 20*time.Second, "the rogue's two streams to be counted", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 2
	})

	if _, err := rogue.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId, Reason: "done"})); err != nil {
		t.Fatalf("the rogue's claim of its own exit: %v", err)
	}
	if err := whoAmI(rogue); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a new call after the rogue's exit: %v, want failed_precondition", err)
	}

	feedErr := streamEnd(t, "the exited rogue's revocation feed", func() error {
		if feed.Receive() {
			return nil
		}
		return feed.Err()
	})
	if connect.CodeOf(feedErr) != connect.CodeFailedPrecondition {
		t.Fatalf("the exited rogue's revocation feed ended with %v, want failed_precondition", feedErr)
	}
	testserver.WaitFor(t, 20*time.Second, "the feed's stream slot to be given back", func() bool {
		return srv.OpenStreams("agent:"+root.Node.NodeId) == 1
	})
	if err := ch.Send(renewNone(2)); err != nil {
		t.Fatal(err)
	}
	if resp, err := ch.Receive(); err != nil || !strings.HasPrefix(resp.Error, connect.CodeFailedPrecondition.String()) {
		t.Fatalf("the exited rogue's message on its open channel: %v, %v; want refused failed_precondition", resp, err)
	}
}

// TestARogueRacingItsSubtreesStopMintsNothingThatOutlivesIt: a rogue
// node, holding a grant, fires everything that mints — Spawn, SpawnBatch,
// Delegate to its child, Refresh of its grant, a proposal of its own stop
// — from many goroutines released by one barrier, at the moment an
// operator aborts its tree. Repeated over several trees. Once the stop is
// terminated: every node acknowledged is in the record exactly once and
// nothing else is; every credential and grant token minted in the race is
// refused (a call with the credential unauthenticated, the token
// inactive); and a proposal of its own stop filed in the race, if it beat
// the stop, starts nothing once approved.
func TestARogueRacingItsSubtreesStopMintsNothingThatOutlivesIt(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	const rounds, workers, each = 3, 8, 12
	for round := 0; round < rounds; round++ {
		root := register(t, admin, fmt.Sprintf("tree-%d", round))
		rogueNode := spawn(t, admin, root.Node.NodeId, "rogue")
		kid := spawn(t, admin, rogueNode.Node.NodeId, "kid")
		rogue := srv.Clients(rogueNode.Credential)
		g := issueRoot(t, admin, rogueNode.Node.NodeId, time.Hour, "tool:*")

		var m raceMints
		refusedOK := func(op string, err error) {
			wantRefusedAs(t, op+" racing the stop", err, connect.CodeFailedPrecondition, connect.CodeUnauthenticated, connect.CodeNotFound, connect.CodePermissionDenied, connect.CodeResourceExhausted)
		}
		release, wait := raceOnRelease(workers, each, func(ctx context.Context, w, i int) {
			switch op := (w + i) % 5; op {
			case 0, 1, 2, 3:
				m.mint(ctx, rogue, op, rogueNode.Node.NodeId, kid.Node.NodeId, g.grant.GrantId, 3, refusedOK)
			case 4:
				_, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{NodeId: rogueNode.Node.NodeId, Reason: "racing", Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, DrainWindow: durationpb.New(time.Hour)}))
				if err != nil {
					refusedOK("ProposeStop", err)
				}
			}
		})
		release()
		term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
		wait()
		waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

		outcomes := nodeOutcomes(record(t, admin, term.TerminationId))
		for _, id := range m.nodes {
			if _, ok := outcomes[id]; !ok {
				t.Errorf("round %d: node %s, acknowledged in the race, is missing from the record", round, id)
			}
		}
		for id, o := range outcomes {
			if o == -1 {
				t.Errorf("round %d: node %s is listed twice", round, id)
			}
		}
		if len(outcomes) != len(m.nodes)+3 {
			t.Errorf("round %d: the record has %d nodes; want %d acknowledged + root, rogue, kid", round, len(outcomes), len(m.nodes))
		}
		for _, c := range m.creds {
			if err := whoAmI(srv.Clients(c)); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("round %d: a credential minted in the race, after the stop: %v, want unauthenticated", round, err)
			}
		}
		for _, tok := range m.tokens {
			if in := introspect(t, admin, tok); in.Active {
				t.Errorf("round %d: a grant token minted in the race is active after the stop", round)
			}
		}
		// A proposal filed before the stop began stays pending until decided
		// (docs/design.md §11); approving one now stops nothing again.
		pending, err := admin.Supervisor.ListProposals(context.Background(), connect.NewRequest(&tetherv1.ListProposalsRequest{State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pending.Msg.Proposals {
			_, err := admin.Supervisor.DecideProposal(context.Background(), connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: p.ProposalId, Approve: true, Reason: "test"}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("round %d: approving the dead rogue's leftover proposal %s: %v, want failed_precondition", round, p.ProposalId, err)
			}
		}
		t.Logf("round %d: %d nodes, %d credentials, %d grant tokens minted in the race; all covered", round, len(m.nodes), len(m.creds), len(m.tokens))
	}
}

// TestARogueThatPicksAnotherTreesJobIdGetsNothingOfIt: job ids are chosen
// by the client and are one namespace for the whole server. A rogue in one
// tree offers a job under the id another tree's coordinator already uses,
// then tries to cancel it, and offers first under an id the other tree has
// not used yet. The collision gives it nothing of the other tree's job: its
// offer is refused (permission_denied, telling it to choose another id)
// with the job unchanged, and its cancel gets the one answer a stranger
// gets. An id it takes first is refused to the other tree in the same
// words: a squatted id costs the other tree a name, never a job (the
// namespace is shared — docs/design.md §11).
func TestARogueThatPicksAnotherTreesJobIdGetsNothingOfIt(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	ctx := context.Background()
	victimRoot := register(t, admin, "victim")
	victimWorker := spawn(t, admin, victimRoot.Node.NodeId, "worker")
	victim := srv.Clients(victimRoot.Credential)
	rogueRoot := register(t, admin, "rogue")
	rogueWorker := spawn(t, admin, rogueRoot.Node.NodeId, "worker")
	rogue := srv.Clients(rogueRoot.Credential)
	offer := func(c *testserver.Clients, job, holder string) (*tetherv1.OfferResponse, error) {
		resp, err := c.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder, LeaseDuration: durationpb.New(time.Minute)}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	getLease := func(job string) *tetherv1.Lease {
		resp, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: job}))
		if err != nil {
			t.Fatalf("get lease %s: %v", job, err)
		}
		return resp.Msg.Lease
	}

	if _, err := offer(victim, "nightly-build", victimWorker.Node.NodeId); err != nil {
		t.Fatalf("the victim's offer: %v", err)
	}
	before := getLease("nightly-build")
	_, err := offer(rogue, "nightly-build", rogueWorker.Node.NodeId)
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "choose another job id") {
		t.Fatalf("the rogue's offer under the victim's job id: %v, want permission_denied naming the remedy", err)
	}
	if strings.Contains(err.Error(), victimRoot.Node.NodeId) || strings.Contains(err.Error(), victimWorker.Node.NodeId) || strings.Contains(err.Error(), before.LeaseId) {
		t.Fatalf("the refusal names the other tree's job: %v", err)
	}
	_, err = rogue.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "nightly-build", Reason: "mine"}))
	_, errNone := rogue.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "no-such-job", Reason: "mine"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied || connect.CodeOf(errNone) != connect.CodePermissionDenied ||
		strings.ReplaceAll(err.Error(), "nightly-build", "X") != strings.ReplaceAll(errNone.Error(), "no-such-job", "X") {
		t.Fatalf("the rogue's cancel of the victim's job: %v; of no job: %v; want the same permission_denied", err, errNone)
	}
	after := getLease("nightly-build")
	if after.HolderIdentity != victimWorker.Node.NodeId || after.LeaseId != before.LeaseId || after.LeaseGeneration != before.LeaseGeneration || after.CancelRequested {
		t.Fatalf("the victim's job changed under the rogue's collision: %v, was %v", after, before)
	}

	// The rogue takes an id first: the victim is refused in the same words,
	// and the rogue's job is its own (the victim's worker is not its holder).
	if _, err := offer(rogue, "weekly-build", rogueWorker.Node.NodeId); err != nil {
		t.Fatalf("the rogue's offer under a fresh id: %v", err)
	}
	if _, err := offer(victim, "weekly-build", victimWorker.Node.NodeId); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "choose another job id") {
		t.Fatalf("the victim's offer under the id the rogue took: %v, want permission_denied naming the remedy", err)
	}
	if l := getLease("weekly-build"); l.HolderIdentity != rogueWorker.Node.NodeId {
		t.Fatalf("the squatted job's holder: %s, want the rogue's worker", l.HolderIdentity)
	}
	if _, err := offer(victim, "weekly-build-2", victimWorker.Node.NodeId); err != nil {
		t.Fatalf("the victim's offer under another id: %v", err)
	}
}

// TestARogueRacingItsTreesStopLeavesNoLiveLease: a rogue coordinator
// offers jobs to its child, and the child acknowledges each, from many
// goroutines released by one barrier, at the moment an operator aborts
// the tree. Repeated over several trees. Once the stop is terminated, no
// lease offered in the race is still live: each is terminal (the
// termination reconciled it) or was never granted, and the child's renew
// of any of them is refused.
func TestARogueRacingItsTreesStopLeavesNoLiveLease(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	const rounds, workers, each = 3, 8, 6
	for round := 0; round < rounds; round++ {
		root := register(t, admin, fmt.Sprintf("tree-%d", round))
		rogueNode := spawn(t, admin, root.Node.NodeId, "coordinator")
		worker := spawn(t, admin, rogueNode.Node.NodeId, "worker")
		rogue, workerC := srv.Clients(rogueNode.Credential), srv.Clients(worker.Credential)
		var (
			mu     sync.Mutex
			leases []*tetherv1.Lease
		)
		refusedOK := func(op string, err error) {
			wantRefusedAs(t, op+" racing the stop", err, connect.CodeFailedPrecondition, connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeNotFound, connect.CodeAborted)
		}
		release, wait := raceOnRelease(workers, each, func(ctx context.Context, w, i int) {
			resp, err := rogue.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: fmt.Sprintf("race-%d-%d-%d", round, w, i), HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(5 * time.Minute)}))
			if err != nil {
				refusedOK("Offer", err)
				return
			}
			l := resp.Msg.Lease
			mu.Lock()
			leases = append(leases, l)
			mu.Unlock()
			if _, err := workerC.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
				refusedOK("Ack", err)
			}
		})
		release()
		term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 0, 0)
		wait()
		waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
		live := 0
		for _, l := range leases {
			resp, err := admin.Lease.GetLease(context.Background(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
			if err != nil {
				t.Fatalf("get lease %s: %v", l.JobId, err)
			}
			if st := resp.Msg.Lease.State; st != tetherv1.LeaseState_LEASE_STATE_TERMINAL {
				live++
				t.Errorf("round %d: job %s, offered in the race, is %v after the stop", round, l.JobId, st)
			}
			_, err = workerC.Lease.Renew(context.Background(), connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1}))
			if err == nil {
				t.Errorf("round %d: the dead worker renewed job %s after the stop", round, l.JobId)
			}
		}
		t.Logf("round %d: %d leases offered in the race, %d live after the stop", round, len(leases), live)
	}
}

// TestARogueRacingItsAncestorsRevokeMintsNoLiveGrant: a rogue delegates
// from the grant its parent gave it to its own child, and refreshes that
// grant, from many goroutines released by one barrier, while the parent
// revokes the grant. Repeated over several trees. Once the revocation is
// answered, every token minted in the race — delegated or refreshed — is
// inactive, and a delegation asked after it is refused.
func TestARogueRacingItsAncestorsRevokeMintsNoLiveGrant(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	const rounds, workers, each = 3, 8, 10
	for round := 0; round < rounds; round++ {
		root := register(t, admin, fmt.Sprintf("tree-%d", round))
		rogueNode := spawn(t, admin, root.Node.NodeId, "rogue")
		kid := spawn(t, admin, rogueNode.Node.NodeId, "kid")
		parent, rogue := srv.Clients(root.Credential), srv.Clients(rogueNode.Credential)
		gRoot := issueRoot(t, admin, root.Node.NodeId, time.Hour, "tool:*")
		gRogue := delegate(t, parent, gRoot, rogueNode.Node.NodeId, "tool:*")
		var (
			mu     sync.Mutex
			tokens []string
		)
		firstMint := make(chan struct{})
		var once sync.Once
		release, wait := raceOnRelease(workers, each, func(ctx context.Context, w, i int) {
			var tok string
			var err error
			if (w+i)%2 == 0 {
				var resp *connect.Response[tetherv1.DelegateResponse]
				resp, err = rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gRogue.grant.GrantId, HolderNodeId: kid.Node.NodeId, Scopes: []string{"tool:shell"}}))
				if err == nil {
					tok = resp.Msg.Token
				}
			} else {
				var resp *connect.Response[tetherv1.RefreshResponse]
				resp, err = rogue.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: gRogue.grant.GrantId}))
				if err == nil {
					tok = resp.Msg.Token
				}
			}
			if err != nil {
				wantRefusedAs(t, "minting racing the revocation", err, connect.CodeFailedPrecondition, connect.CodePermissionDenied, connect.CodeNotFound)
				return
			}
			mu.Lock()
			tokens = append(tokens, tok)
			mu.Unlock()
			once.Do(func() { close(firstMint) })
		})
		release()
		go func() { wait(); once.Do(func() { close(firstMint) }) }() // no mint at all: the revocation still comes
		<-firstMint                                                  // the revocation lands among the mints, never before them all
		if _, err := revokeGrant(parent, gRogue.grant.GrantId); err != nil {
			t.Fatalf("the parent's revocation: %v", err)
		}
		wait()
		for _, tok := range tokens {
			if in := introspect(t, admin, tok); in.Active {
				t.Errorf("round %d: a token minted in the race is active after the revocation (grant %s)", round, in.Grant.GetGrantId())
			}
		}
		if _, err := rogue.Capability.Delegate(context.Background(), connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: gRogue.grant.GrantId, HolderNodeId: kid.Node.NodeId, Scopes: []string{"tool:shell"}})); err == nil {
			t.Errorf("round %d: a delegation from the revoked grant after the revocation succeeded", round)
		}
		t.Logf("round %d: %d tokens minted in the race, all inactive after the revocation", round, len(tokens))
	}
}

// raceOnRelease starts workers goroutines that wait for release and then
// call op each times (w the worker, i the call), so that their calls race
// whatever the test does right after release; wait returns once all have
// returned.
func raceOnRelease(workers, each int, op func(ctx context.Context, w, i int)) (release, wait func()) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range each {
				op(context.Background(), w, i)
			}
		})
	}
	return func() { close(start) }, wg.Wait
}

// wantRefusedAs reports err unless its code is one of codes: a move racing
// a stop may be refused, in the ways named, and must not fail otherwise.
func wantRefusedAs(t *testing.T, what string, err error, codes ...connect.Code) {
	t.Helper()
	if !slices.Contains(codes, connect.CodeOf(err)) {
		t.Errorf("%s: %v", what, err)
	}
}

// raceMints keeps what a rogue was given while it raced its stop: the
// nodes it spawned, their credentials, and the grant tokens delegated or
// refreshed; each must be covered by the stop afterwards.
type raceMints struct {
	mu     sync.Mutex
	nodes  []string // acknowledged spawns
	creds  []string // credentials minted for them
	tokens []string // grant tokens minted (delegations, refreshes)
}

// mint makes one of the rogue's minting calls through c, chosen by op: 0
// Spawn under parentID, 1 SpawnBatch of batch children, 2 Delegate of
// grantID to kidID, 3 Refresh of grantID. What is acknowledged is kept;
// a refusal goes to refused.
func (m *raceMints) mint(ctx context.Context, c *testserver.Clients, op int, parentID, kidID, grantID string, batch int, refused func(op string, err error)) {
	switch op {
	case 0:
		resp, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parentID, Name: "racer"}))
		if err != nil {
			refused("Spawn", err)
			return
		}
		m.mu.Lock()
		m.nodes, m.creds = append(m.nodes, resp.Msg.Node.NodeId), append(m.creds, resp.Msg.Credential)
		m.mu.Unlock()
	case 1:
		var children []*tetherv1.SpawnBatchChild
		for i := 1; i <= batch; i++ {
			children = append(children, &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("b%d", i)})
		}
		resp, err := c.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: parentID, Children: children}))
		if err != nil {
			refused("SpawnBatch", err)
			return
		}
		m.mu.Lock()
		for _, s := range resp.Msg.Spawned {
			m.nodes, m.creds = append(m.nodes, s.Node.NodeId), append(m.creds, s.Credential)
		}
		m.mu.Unlock()
	case 2:
		resp, err := c.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: grantID, HolderNodeId: kidID, Scopes: []string{"tool:shell"}}))
		if err != nil {
			refused("Delegate", err)
			return
		}
		m.mu.Lock()
		m.tokens = append(m.tokens, resp.Msg.Token)
		m.mu.Unlock()
	case 3:
		resp, err := c.Capability.Refresh(ctx, connect.NewRequest(&tetherv1.RefreshRequest{GrantId: grantID}))
		if err != nil {
			refused("Refresh", err)
			return
		}
		m.mu.Lock()
		m.tokens = append(m.tokens, resp.Msg.Token)
		m.mu.Unlock()
	}
}
