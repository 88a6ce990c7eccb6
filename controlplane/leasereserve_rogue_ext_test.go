package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Job leases against a rogue sibling that spends the rate budget its
// lineage shares. Each node keeps a small reserve of its own for its
// upkeep (controlplane.UpkeepReserveRate, 2/s in bursts of 16), but that
// reserve is per node, not per lease: a sibling holding a hundred leases
// (default 30 s, renewed every 10 s) needs 10 renewals a second, and kept
// only about twenty alive — the rest expired although their holder renewed
// each in time, and its Progress reports were refused outright. A rogue
// could freeze any job of its lineage it was not party to. The upkeep of a
// lease the caller holds is now admitted from that lease's own allowance
// (controlplane.LeaseUpkeepAllowance messages per lease duration) once the
// lineage's budget is spent.

// leaseReserveWorld is a lineage of a root, an honest child holding many
// leases the operator offered it, and a rogue child.
type leaseReserveWorld struct {
	clk                   *clock.Manual
	srv                   *testserver.Server
	admin                 *testserver.Clients
	honest, rogue         *tetherv1.SpawnResponse
	honestC, rogueC       *testserver.Clients
	honestNode, rogueNode string
}

func newLeaseReserveWorld(t *testing.T) *leaseReserveWorld {
	t.Helper()
	clk := clock.NewManual(epoch)
	// 5 a second in bursts of 128 for the lineage and for the operator,
	// who offers the jobs.
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 5, 128 })
	admin := srv.AdminClients()
	root := register(t, admin, "planner")
	rootC := srv.Clients(root.Credential)
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	return &leaseReserveWorld{
		clk: clk, srv: srv, admin: admin, honest: honest, rogue: rogue,
		honestC: srv.Clients(honest.Credential), rogueC: srv.Clients(rogue.Credential),
		honestNode: honest.Node.NodeId, rogueNode: rogue.Node.NodeId,
	}
}

func (w *leaseReserveWorld) offer(t *testing.T, job, holder string) *tetherv1.Lease {
	t.Helper()
	r, err := w.admin.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder,
		LeaseDuration: durationpb.New(30 * time.Second), AckTimeout: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatalf("offer %s: %v", job, err)
	}
	return r.Msg.Lease
}

// A rogue keeps its lineage's budget spent, round after round, while its
// sibling works a hundred leases — five times what its node's reserve
// kept alive — acking each, renewing each every 10 s of its 30 s lease and
// reporting progress on each, half unary and half on a lease channel, over
// four lease-renewal rounds (40 s: every lease would have expired once
// without its renewals). Every message is accepted, none expires, and the
// sibling's session heartbeats still go through on its node's reserve,
// which the leases no longer drain. Before the fix, the sibling's ACKs ran
// out after 32 (its budget-less reserve), its Progress reports were
// refused resource_exhausted at once, and most of its leases expired.
func TestARogueSpendingTheLineagesBudgetCannotFreezeASiblingsManyLeases(t *testing.T) {
	w := newLeaseReserveWorld(t)
	ctx := context.Background()
	const jobs = 100
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		leases[i] = w.offer(t, fmt.Sprintf("job-%03d", i), w.honestNode)
	}
	sess, err := openSession(t, w.honestC, w.honestNode)
	if err != nil {
		t.Fatal(err)
	}
	channel := openChannel(t, w.honestC)

	spendLineage(t, w.rogueC, w.rogueNode)
	if _, err := w.rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.rogueNode})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's next call: %v, want resource_exhausted", err)
	}
	via := func(i int) tryTransport {
		if i%2 == 0 {
			return unary{w.honestC}
		}
		return channel
	}
	for i, l := range leases {
		got, d, errText := via(i).try(t, ack(l))
		if errText != "" {
			t.Fatalf("the sibling's ACK of lease %d of %d, once the rogue spent the lineage's budget: %s", i+1, jobs, errText)
		}
		wantDecision(t, "the sibling's ACK", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
		leases[i] = got
	}
	for round := uint64(1); round <= 4; round++ {
		w.clk.Advance(10 * time.Second)
		// The rogue spends what the lineage's budget refilled.
		spendLineage(t, w.rogueC, w.rogueNode)
		if err := sess.heartbeat(); err != nil {
			t.Fatalf("round %d: the sibling's heartbeat: %v", round, err)
		}
		want := w.clk.Now().Add(30 * time.Second)
		for i, l := range leases {
			got, d, errText := via(i).try(t, renew(l, round))
			if errText != "" {
				t.Fatalf("round %d: the sibling's renewal of lease %d of %d (due in time), once the rogue spent the lineage's budget: %s", round, i+1, jobs, errText)
			}
			wantDecision(t, "the sibling's renewal", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
			if !got.ExpiresAt.AsTime().Equal(want) {
				t.Fatalf("round %d: lease %d renewed to %s, want %s", round, i+1, got.ExpiresAt.AsTime(), want)
			}
			// Progress the other way round: the unary Progress too.
			_, d, errText = via(i+1).try(t, progress(l, round, fmt.Sprintf("step %d", round)))
			if errText != "" {
				t.Fatalf("round %d: the sibling's progress on lease %d of %d: %s", round, i+1, jobs, errText)
			}
			wantDecision(t, "the sibling's progress", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
			leases[i] = got
		}
	}
	w.clk.Advance(10 * time.Second)
	list, err := w.admin.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: w.honestNode, PageSize: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Leases) != jobs {
		t.Fatalf("the sibling holds %d leases, want %d", len(list.Msg.Leases), jobs)
	}
	for _, l := range list.Msg.Leases {
		if l.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || l.LeaseGeneration != 1 || l.LeaseExpired || l.OwnershipConflict ||
			l.RenewSequence != 4 || l.ProgressSequence != 4 || !l.ExpiresAt.AsTime().After(w.clk.Now()) {
			t.Fatalf("a lease the sibling renewed in time, 50 s in: %v", l)
		}
	}
}

// The rogue gets nothing from the allowance of leases it does not hold: its
// budget spent, its renewals of its sibling's leases (which it may not
// touch) and of made-up jobs are refused resource_exhausted once its
// node's reserve is spent, unary and on a channel, change nothing, and buy
// it no other call. A lease it does hold gives it only that lease's
// allowance: a flood of renewals of it is accepted for the allowance and
// at most its node's reserve, then refused.
func TestARogueGainsNothingFromTheUpkeepAllowanceOfLeasesItDoesNotHold(t *testing.T) {
	w := newLeaseReserveWorld(t)
	ctx := context.Background()
	victim := w.offer(t, "victim", w.honestNode)
	victim, _ = unary{w.honestC}.send(t, ack(victim))
	own := w.offer(t, "own", w.rogueNode)

	spendLineage(t, w.rogueC, w.rogueNode)
	refused := 0
	for i := range 200 {
		target := victim
		if i%2 == 1 {
			target = &tetherv1.Lease{JobId: fmt.Sprintf("made-up-%d", i), LeaseId: victim.LeaseId, LeaseGeneration: 1}
		}
		_, _, errText := unary{w.rogueC}.try(t, renew(target, uint64(i+1)))
		switch {
		case strings.HasPrefix(errText, "resource_exhausted: "):
			refused++
		case strings.HasPrefix(errText, "permission_denied: ") && refused == 0:
			// its node's reserve, while it lasts: refused by the handler
		default:
			t.Fatalf("the rogue's renewal %d of a lease it does not hold: %q", i+1, errText)
		}
	}
	t.Logf("the rogue's 200 renewals of leases it does not hold: %d refused resource_exhausted, %d permission_denied (its node's reserve)", refused, 200-refused)
	if refused < 200-controlplane.UpkeepReserveBurst {
		t.Fatalf("only %d of the rogue's 200 renewals of leases it does not hold were refused resource_exhausted", refused)
	}
	ch := openChannel(t, w.rogueC)
	for i := range 64 {
		_, _, errText := ch.tryOrEnded(t, renew(victim, uint64(1000+i)))
		if strings.HasPrefix(errText, "resource_exhausted: ") {
			break
		}
		if !strings.HasPrefix(errText, "permission_denied: ") || i == 63 {
			t.Fatalf("the rogue's renewal %d, on its channel, of a lease it does not hold: %q", i+1, errText)
		}
	}
	if _, err := w.rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.rogueNode})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's GetNode after its renewals of others' leases: %v, want resource_exhausted", err)
	}
	got := (&leaseWorld{admin: w.admin}).get(t, "victim")
	if got.HolderIdentity != w.honestNode || got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.OwnershipConflict ||
		got.RenewSequence != 0 || !got.ExpiresAt.AsTime().Equal(victim.ExpiresAt.AsTime()) {
		t.Fatalf("the victim's lease after the rogue's renewals: %v", got)
	}

	// A lease the rogue holds: its allowance and its node's reserve (both
	// full again 5 s on: the refusals above spent what it may have
	// admitted owing, so that even the upkeep of its own lease was refused
	// from its headers), and no more.
	w.clk.Advance(5 * time.Second)
	spendLineage(t, w.rogueC, w.rogueNode)
	accepted := 0
	own, _, errText := unary{w.rogueC}.try(t, ack(own))
	if errText != "" {
		t.Fatalf("the rogue's ACK of its own lease: %s", errText)
	}
	accepted++
	for i := range 100 {
		_, _, errText := unary{w.rogueC}.try(t, renew(own, uint64(i+1)))
		switch {
		case errText == "":
			accepted++
		case strings.HasPrefix(errText, "resource_exhausted: "):
		default:
			t.Fatalf("the rogue's renewal %d of its own lease: %q", i+1, errText)
		}
	}
	t.Logf("the rogue's ACK and 100 renewals of the one lease it holds: %d accepted", accepted)
	if limit := controlplane.LeaseUpkeepAllowance + controlplane.UpkeepReserveBurst; accepted > limit || accepted < controlplane.LeaseUpkeepAllowance {
		t.Fatalf("the rogue had %d messages about its one lease accepted with its lineage's budget spent, want the lease's allowance (%d) and at most its node's reserve (%d) more",
			accepted, controlplane.LeaseUpkeepAllowance, controlplane.UpkeepReserveBurst)
	}
}

// sendBatch sends msgs on the channel as one batched message (the first
// carries the rest) and returns each one's answer, in msgs' order.
func (c *channel) sendBatch(t *testing.T, msgs []*tetherv1.ChannelRequest) []*tetherv1.ChannelResponse {
	t.Helper()
	first := c.next + 1
	for _, m := range msgs {
		c.next++
		m.CorrelationId = c.next
	}
	carrier := msgs[0]
	carrier.Batch = msgs[1:]
	if err := c.stream.Send(carrier); err != nil {
		t.Fatalf("channel send: %v", err)
	}
	answers := make([]*tetherv1.ChannelResponse, len(msgs))
	for got := 0; got < len(msgs); {
		resp, err := c.stream.Receive()
		if err != nil {
			t.Fatalf("channel receive, %d of %d answers in: %v", got, len(msgs), err)
		}
		for _, a := range append([]*tetherv1.ChannelResponse{resp}, resp.Batch...) {
			k := a.CorrelationId - first
			if a.CorrelationId < first || k >= uint64(len(msgs)) || answers[k] != nil {
				t.Fatalf("an answer with correlation id %d", a.CorrelationId)
			}
			a.Batch = nil
			answers[k] = a
			got++
		}
	}
	return answers
}

// The same sibling, working its hundred leases over one lease channel in
// batches (a batch costs the lineage's budget one request per message):
// with the budget spent, a batch of ACKs, then a batch of renewals every
// 10 s, each naming a lease the sibling holds, is admitted from the
// leases' allowances, and none expires. Before the fix, the batch of
// ACKs was refused whole and the stream ended with the refusal.
func TestARogueSpendingTheLineagesBudgetCannotFreezeASiblingsBatchedLeases(t *testing.T) {
	w := newLeaseReserveWorld(t)
	const jobs = 100
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		leases[i] = w.offer(t, fmt.Sprintf("job-%03d", i), w.honestNode)
	}
	channel := openChannel(t, w.honestC)
	spendLineage(t, w.rogueC, w.rogueNode)

	work := func(what string, msg func(l *tetherv1.Lease) *tetherv1.ChannelRequest, event tetherv1.AuditEvent) {
		t.Helper()
		msgs := make([]*tetherv1.ChannelRequest, jobs)
		for i, l := range leases {
			msgs[i] = msg(l)
		}
		for i, a := range channel.sendBatch(t, msgs) {
			if a.Error != "" {
				t.Fatalf("%s: the sibling's message %d of %d in one batch, once the rogue spent the lineage's budget: %s", what, i+1, jobs, a.Error)
			}
			wantDecision(t, what, a.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, event)
			leases[i] = a.Lease
		}
	}
	work("ACKs", ack, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	for round := uint64(1); round <= 4; round++ {
		w.clk.Advance(10 * time.Second)
		spendLineage(t, w.rogueC, w.rogueNode)
		work(fmt.Sprintf("round %d", round), func(l *tetherv1.Lease) *tetherv1.ChannelRequest { return renew(l, round) }, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	}
	for _, l := range leases {
		if got := (&leaseWorld{admin: w.admin}).get(t, l.JobId); got.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE || got.RenewSequence != 4 || got.LeaseExpired {
			t.Fatalf("a lease the sibling renewed in time in batches, 40 s in: %v", got)
		}
	}
}

// Leases pile up: a lineage that offers itself jobs holds more and more,
// and each lease's allowance would add to what the rogue may send with
// its budget spent. A node's messages admitted from its leases'
// allowances are bounded too: a rogue holding 60 leases, each with an
// allowance of 10, floods ACKs and renewals of all of them and has at
// most LeaseUpkeepNodeBurst (500) admitted that way, and its node's
// reserve, before it is refused resource_exhausted.
func TestARoguesPiledUpLeasesBuyItNoMoreThanItsNodesBound(t *testing.T) {
	w := newLeaseReserveWorld(t)
	const jobs = 60
	leases := make([]*tetherv1.Lease, jobs)
	for i := range leases {
		leases[i] = w.offer(t, fmt.Sprintf("rogue-%02d", i), w.rogueNode)
	}
	spendLineage(t, w.rogueC, w.rogueNode)
	accepted, refused := 0, 0
	for seq := uint64(0); seq <= controlplane.LeaseUpkeepAllowance; seq++ {
		for i, l := range leases {
			m := renew(l, seq)
			if seq == 0 {
				m = ack(l)
			}
			got, _, errText := unary{w.rogueC}.try(t, m)
			switch {
			case errText == "":
				accepted++
				leases[i] = got
			case strings.HasPrefix(errText, "resource_exhausted: "):
				refused++
			default:
				t.Fatalf("the rogue's message about its own lease %d: %q", i+1, errText)
			}
		}
	}
	t.Logf("the rogue's %d ACKs and renewals of its %d leases: %d accepted, %d refused", accepted+refused, jobs, accepted, refused)
	if accepted < controlplane.LeaseUpkeepNodeBurst || accepted > controlplane.LeaseUpkeepNodeBurst+controlplane.UpkeepReserveBurst {
		t.Fatalf("the rogue had %d messages about its %d leases accepted with its lineage's budget spent, want its node's bound (%d) and at most its reserve (%d) more",
			accepted, jobs, controlplane.LeaseUpkeepNodeBurst, controlplane.UpkeepReserveBurst)
	}
}
