package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// stormLease is one lease of the renew storm and what its renewer saw.
type stormLease struct {
	lease  *tetherv1.Lease
	holder int // index into the holders
	mu     sync.Mutex
	seq    uint64 // the last renew sequence sent
	acked  uint64 // the highest renew sequence acknowledged
	// accepted are the renew sequences answered ACCEPTED: each must have
	// its evidence row.
	accepted []uint64
	lastAt   time.Time // when the last acknowledgement arrived
	// since, when set, is the kill; firstSince the first acknowledgement
	// after it.
	since, firstSince time.Time
}

// mark starts timing the first acknowledgement after at.
func (l *stormLease) mark(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.since = at
}

func (l *stormLease) resumedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstSince
}

func (l *stormLease) next() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	return l.seq
}

// answer records an answer to renew seq; it reports a refusal.
func (l *stormLease) answer(seq uint64, d *tetherv1.Decision) error {
	acked := d.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED ||
		(d.GetOutcome() == tetherv1.Outcome_OUTCOME_DUPLICATE && d.GetAuditEvent() == tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW)
	if !acked {
		return fmt.Errorf("job %s renew %d: %s %s (%s)", l.lease.JobId, seq, d.GetOutcome(), d.GetAuditEvent(), d.GetReason())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked = max(l.acked, seq)
	l.lastAt = time.Now()
	if d.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
		l.accepted = append(l.accepted, seq)
	}
	if !l.since.IsZero() && l.firstSince.IsZero() {
		l.firstSince = l.lastAt
	}
	return nil
}

func (l *stormLease) state() (acked uint64, lastAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked, l.lastAt
}

// TestEtcdLeaderKilledDuringATerminationAndARenewStorm runs three `tether
// serve` processes on one etcd and kills (SIGKILL) the leader while a
// termination is waiting for exit confirmations and leases are being
// renewed as fast as the replicas answer — on the leader and through the
// followers, unary and on Channel streams — while agents register. Another
// replica becomes leader and finishes the termination with exactly one
// record, and nothing acknowledged is lost: every acknowledged renew is in
// its lease, every acknowledged registration is in the tree.
func TestEtcdLeaderKilledDuringATerminationAndARenewStorm(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	args := []string{"--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","), "--etcd-prefix", prefix,
		"--election-ttl", "2s", "--rate-limit", "0"}
	procs := map[string]*testserver.Process{}
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("replica-%d", i)
		procs[id] = testserver.StartProcess(t, t.TempDir(), append(args, "--replica-id", id)...)
		ids = append(ids, id)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, id := range ids {
				log, _ := os.ReadFile(filepath.Join(procs[id].DataDir, "serve.log"))
				t.Logf("%s's log:\n%s", id, log)
			}
		}
	})
	election := electionOf(t, cluster, prefix)
	ctx := context.Background()
	var leaderID string
	testserver.WaitFor(t, replicaWait, "a leader", func() bool {
		c, err := election.Current(ctx)
		leaderID = c.Identity
		return err == nil
	})
	urls := make([]string, len(ids))
	for i, id := range ids {
		urls[i] = procs[id].URL
	}
	hc := testserver.H2CClient()
	token := procs[ids[0]].Admin // valid on every replica: one key ring
	admin := func(i int) *testserver.Clients { return testserver.NewClients(hc, urls[i%len(urls)], token) }
	// Offers wait for the leader's coordinator to serve (a follower routes
	// them to it once it does).
	var storm []*stormLease
	holders := make([]*tetherv1.SpawnResponse, 4)
	stormRoot := register(t, admin(1), "storm")
	for h := range holders {
		holders[h] = spawn(t, admin(h), stormRoot.Node.NodeId, fmt.Sprintf("holder-%d", h))
	}
	offer := func(holder *tetherv1.SpawnResponse, job string, via int) *tetherv1.Lease {
		t.Helper()
		var resp *connect.Response[tetherv1.OfferResponse]
		testserver.WaitFor(t, replicaWait, "the leases to be served", func() bool {
			var err error
			resp, err = admin(via).Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holder.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
			return err == nil
		})
		l := resp.Msg.Lease
		ack, err := testserver.NewClients(hc, urls[via%len(urls)], holder.Credential).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
		if err != nil || ack.Msg.Decision.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("ack %s: %v %v", job, err, ack.Msg.GetDecision())
		}
		return ack.Msg.Lease
	}
	for i := range 32 {
		h := i % len(holders)
		storm = append(storm, &stormLease{lease: offer(holders[h], fmt.Sprintf("storm-%d", i), i), holder: h})
	}
	// The subtree the termination stops: a root, ten agents, two leases.
	doomedRoot := register(t, admin(0), "doomed")
	doomed := []string{doomedRoot.Node.NodeId}
	var doomedHolders []*tetherv1.SpawnResponse
	for i := range 10 {
		child := spawn(t, admin(i), doomed[i/3], fmt.Sprintf("doomed-%d", i))
		doomed = append(doomed, child.Node.NodeId)
		if i < 2 {
			doomedHolders = append(doomedHolders, child)
		}
	}
	for i, h := range doomedHolders {
		offer(h, fmt.Sprintf("doomed-job-%d", i), i)
	}

	// The storm: 16 leases renewed by unary calls, 16 on one Channel
	// stream per holder, each spread over all replicas, leader included;
	// on an error the renewer moves to the next replica, as a client
	// behind a load balancer would.
	stormCtx, stopStorm := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var refusals []error
	refused := func(err error) {
		errMu.Lock()
		refusals = append(refusals, err)
		errMu.Unlock()
	}
	pause := func() bool { // pacing between retries, not a wait for a condition
		select {
		case <-stormCtx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
			return true
		}
	}
	for i, l := range storm[:16] {
		wg.Go(func() {
			via := i
			for stormCtx.Err() == nil {
				c := testserver.NewClients(hc, urls[via%len(urls)], holders[l.holder].Credential)
				seq := l.next()
				callCtx, cancel := context.WithTimeout(stormCtx, 10*time.Second)
				resp, err := c.Lease.Renew(callCtx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.lease.JobId, LeaseId: l.lease.LeaseId, LeaseGeneration: l.lease.LeaseGeneration, RenewSequence: seq}))
				cancel()
				if err != nil {
					via++
					pause()
					continue
				}
				if err := l.answer(seq, resp.Msg.Decision); err != nil {
					refused(err)
				}
			}
		})
	}
	for h := range holders {
		var mine []*stormLease
		for _, l := range storm[16:] {
			if l.holder == h {
				mine = append(mine, l)
			}
		}
		wg.Go(func() {
			for via := h; stormCtx.Err() == nil; via++ {
				if err := renewOnChannel(stormCtx, hc, urls[via%len(urls)], holders[h].Credential, mine, refused); err != nil && !pause() {
					return
				}
			}
		})
	}
	// Registrations, through every replica.
	var spawnedMu sync.Mutex
	var spawned []string
	wg.Go(func() {
		for i := 0; stormCtx.Err() == nil; i++ {
			resp, err := admin(i).Agent.Spawn(stormCtx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: stormRoot.Node.NodeId, Name: fmt.Sprintf("late-%d", i)}))
			if err == nil {
				spawnedMu.Lock()
				spawned = append(spawned, resp.Msg.Node.NodeId)
				spawnedMu.Unlock()
			} else if !pause() {
				return
			}
		}
	})
	defer func() { stopStorm(); wg.Wait() }()
	testserver.WaitFor(t, replicaWait, "every lease to be renewed", func() bool {
		for _, l := range storm {
			if acked, _ := l.state(); acked < 3 {
				return false
			}
		}
		return true
	})

	// The termination: abort (no calls to wait for), then wait up to 5s
	// for exit confirmations that never come; kill the leader meanwhile.
	term, err := admin(2).Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: doomedRoot.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "kill test",
		CancelAckTimeout: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(5 * time.Second),
	}))
	if err != nil {
		t.Fatal(err)
	}
	termID := term.Msg.Termination.TerminationId
	state := func(via int) tetherv1.TerminationState {
		resp, err := admin(via).Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: termID}))
		if err != nil {
			return tetherv1.TerminationState_TERMINATION_STATE_UNSPECIFIED
		}
		return resp.Msg.Termination.State
	}
	testserver.WaitFor(t, replicaWait, "the termination to wait for exit confirmations", func() bool {
		return state(0) == tetherv1.TerminationState_TERMINATION_STATE_RECONCILING
	})
	// Kill whichever replica leads now (on a loaded machine the election
	// may have moved since the start).
	if c, err := election.Current(ctx); err != nil || procs[c.Identity] == nil {
		t.Fatalf("no leader to kill: %+v %v", c, err)
	} else {
		leaderID = c.Identity
	}
	procs[leaderID].Kill() // returns once the process is gone
	killedAt := time.Now()
	for _, l := range storm {
		l.mark(killedAt)
	}
	var survivors []int
	for i, id := range ids {
		if id != leaderID {
			survivors = append(survivors, i)
		}
	}
	if s := state(survivors[0]); s != tetherv1.TerminationState_TERMINATION_STATE_RECONCILING {
		t.Fatalf("the termination is %s at the kill; the test must kill the leader before the record", s)
	}

	testserver.WaitFor(t, replicaWait, "every lease to be renewed again after the kill", func() bool {
		for _, l := range storm {
			if _, at := l.state(); !at.After(killedAt) {
				return false
			}
		}
		return true
	})
	var all time.Time
	for _, l := range storm {
		if at := l.resumedAt(); at.After(all) {
			all = at
		}
	}
	t.Logf("after the leader was killed (election TTL 2s), every lease was renewed again within %v", all.Sub(killedAt).Round(time.Millisecond))
	testserver.WaitFor(t, replicaWait, "the termination to finish", func() bool {
		return state(survivors[0]) == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	stopStorm()
	wg.Wait()

	if c, err := election.Current(ctx); err != nil || c.Identity == leaderID {
		t.Fatalf("after the kill the election names %+v (%v)", c, err)
	}
	for _, err := range refusals {
		t.Error(err)
	}
	// Exactly one record, listing the whole subtree and its leases.
	var records []*tetherv1.ReconciliationRecord
	for page := ""; ; {
		resp, err := admin(survivors[0]).Supervisor.ListRecords(ctx, connect.NewRequest(&tetherv1.ListRecordsRequest{PageToken: page}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Records {
			if r.TerminationId == termID {
				records = append(records, r)
			}
		}
		if page = resp.Msg.NextPageToken; page == "" {
			break
		}
	}
	if len(records) != 1 {
		t.Fatalf("%d records of the termination, want exactly one", len(records))
	}
	if rec := records[0]; len(rec.Nodes) != len(doomed) || len(rec.Leases) != len(doomedHolders) {
		t.Fatalf("the record lists %d nodes and %d leases, want %d and %d", len(rec.Nodes), len(rec.Leases), len(doomed), len(doomedHolders))
	}
	// Delivered to the new leader's record sink, and to no other.
	delivered := func() (where []string) {
		for _, id := range ids {
			files, _ := filepath.Glob(filepath.Join(procs[id].DataDir, "records", "*.json"))
			for _, f := range files {
				if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), termID) {
					where = append(where, id)
				}
			}
		}
		return where
	}
	testserver.WaitFor(t, replicaWait, "the record to reach a sink", func() bool { return len(delivered()) > 0 })

	// Nothing acknowledged was lost: every lease has at least its highest
	// acknowledged renew sequence, and every accepted renew its evidence
	// row (a takeover that lost or overwrote a row would show here).
	for _, l := range storm {
		acked, _ := l.state()
		ev, err := admin(survivors[1]).Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.lease.JobId}))
		if err != nil {
			t.Fatalf("evidence of %s: %v", l.lease.JobId, err)
		}
		inEvidence := map[uint64]bool{}
		for i, row := range ev.Msg.Rows {
			if row.Row != uint64(i+1) {
				t.Fatalf("%s: evidence row %d is numbered %d", l.lease.JobId, i+1, row.Row)
			}
			if row.Message == "renew" && row.Decision.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
				inEvidence[row.RenewSequence] = true
			}
		}
		l.mu.Lock()
		for _, seq := range l.accepted {
			if !inEvidence[seq] {
				t.Errorf("%s: renew %d was accepted, and its evidence row is missing", l.lease.JobId, seq)
			}
		}
		l.mu.Unlock()
		c := testserver.NewClients(hc, urls[survivors[0]], holders[l.holder].Credential)
		got, err := c.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.lease.JobId}))
		if err != nil {
			t.Fatalf("get %s: %v", l.lease.JobId, err)
		}
		if got.Msg.Lease.RenewSequence < acked {
			t.Errorf("%s: renew %d was acknowledged, the lease says %d", l.lease.JobId, acked, got.Msg.Lease.RenewSequence)
		}
		if got.Msg.Lease.LeaseGeneration != l.lease.LeaseGeneration || got.Msg.Lease.State != tetherv1.LeaseState_LEASE_STATE_ACTIVE {
			t.Errorf("%s after the takeover: generation %d, %s", l.lease.JobId, got.Msg.Lease.LeaseGeneration, got.Msg.Lease.State)
		}
	}
	spawnedMu.Lock()
	defer spawnedMu.Unlock()
	if len(spawned) == 0 {
		t.Fatal("no registration was acknowledged during the storm")
	}
	for i, node := range spawned {
		if _, err := admin(survivors[i%len(survivors)]).Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: node})); err != nil {
			t.Errorf("acknowledged registration %s: %v", node, err)
		}
	}
	if where := delivered(); len(where) != 1 || where[0] == leaderID {
		t.Fatalf("the record was delivered by %v; want exactly once, by the new leader", where)
	}
	t.Logf("%d leases, %d registrations acknowledged during the storm", len(storm), len(spawned))
}

// renewOnChannel renews leases on one Channel stream to url, each in a
// closed loop (the next renew once the last was answered), until ctx ends
// or the stream breaks.
func renewOnChannel(ctx context.Context, hc *http.Client, url, credential string, leases []*stormLease, refused func(error)) error {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := testserver.NewClients(hc, url, credential).Lease.Channel(streamCtx)
	stop := context.AfterFunc(streamCtx, func() {
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
	})
	defer stop()
	sent := map[uint64]*stormLease{} // renew sequence per correlation id
	seqs := map[uint64]uint64{}
	var correlation uint64
	send := func(ls []*stormLease) error {
		var msgs []*tetherv1.ChannelRequest
		for _, l := range ls {
			correlation++
			seq := l.next()
			sent[correlation], seqs[correlation] = l, seq
			msgs = append(msgs, &tetherv1.ChannelRequest{CorrelationId: correlation, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{
				JobId: l.lease.JobId, LeaseId: l.lease.LeaseId, LeaseGeneration: l.lease.LeaseGeneration, RenewSequence: seq,
			}}})
		}
		first := msgs[0]
		first.Batch = msgs[1:]
		return stream.Send(first)
	}
	if err := send(leases); err != nil {
		return err
	}
	for ctx.Err() == nil {
		resp, err := stream.Receive()
		if err != nil {
			return err
		}
		var ready []*stormLease
		for _, a := range append([]*tetherv1.ChannelResponse{resp}, resp.Batch...) {
			l, seq := sent[a.CorrelationId], seqs[a.CorrelationId]
			if l == nil {
				return errors.New("an answer to nothing sent")
			}
			delete(sent, a.CorrelationId)
			delete(seqs, a.CorrelationId)
			// An error is a renew that was not judged (the coordinator
			// moved, and the stream ends next): it is renewed again with
			// the next sequence, like any other.
			if a.Error == "" {
				if err := l.answer(seq, a.Decision); err != nil {
					refused(err)
				}
			}
			ready = append(ready, l)
		}
		if len(ready) > 0 {
			if err := send(ready); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// TestEtcdKill9MidCommitKeepsEveryAcknowledgedEvidenceRow kills (SIGKILL)
// a `tether serve` on etcd while 24 leases renew in closed loops, so
// commits are in flight, after enough commits that the evidence rows have
// been packed (a commit's rows under one key of the evidence log, folded
// into packs under each job's key). After the restart every acknowledged
// renewal is there: each lease has at least its highest acknowledged
// sequence, each accepted renew its evidence row, the rows are numbered
// without a gap and read the same whole and page by page, and the leases
// go on.
func TestEtcdKill9MidCommitKeepsEveryAcknowledgedEvidenceRow(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("By design: -short skips the tests that run the real binary; make test and CI run them.")
	}
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	args := []string{"--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","), "--etcd-prefix", prefix,
		"--election-ttl", "2s", "--rate-limit", "0"}
	dir := t.TempDir()
	proc := testserver.StartProcess(t, dir, args...)
	hc := testserver.H2CClient()
	ctx := context.Background()
	admin := testserver.NewClients(hc, proc.URL, proc.Admin)
	root := register(t, admin, "kill")
	holders := []*tetherv1.SpawnResponse{spawn(t, admin, root.Node.NodeId, "h0"), spawn(t, admin, root.Node.NodeId, "h1")}
	var leases []*stormLease
	for i := range 24 {
		h := i % len(holders)
		job := fmt.Sprintf("kill-%d", i)
		var offered *connect.Response[tetherv1.OfferResponse]
		testserver.WaitFor(t, replicaWait, "the leases to be served", func() bool {
			var err error
			offered, err = admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: holders[h].Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
			return err == nil
		})
		l := offered.Msg.Lease
		ack, err := testserver.NewClients(hc, proc.URL, holders[h].Credential).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: job, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
		if err != nil || ack.Msg.Decision.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
			t.Fatalf("ack %s: %v %v", job, err, ack.Msg.GetDecision())
		}
		leases = append(leases, &stormLease{lease: ack.Msg.Lease, holder: h})
	}

	stormCtx, stopStorm := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var refusals []error
	for _, l := range leases {
		c := testserver.NewClients(hc, proc.URL, holders[l.holder].Credential)
		wg.Go(func() {
			for stormCtx.Err() == nil {
				seq := l.next()
				resp, err := c.Lease.Renew(stormCtx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.lease.JobId, LeaseId: l.lease.LeaseId, LeaseGeneration: l.lease.LeaseGeneration, RenewSequence: seq}))
				if err != nil {
					return // the kill
				}
				if err := l.answer(seq, resp.Msg.Decision); err != nil {
					errMu.Lock()
					refusals = append(refusals, err)
					errMu.Unlock()
				}
			}
		})
	}
	defer func() { stopStorm(); wg.Wait() }()
	// 40 renewals each: far more commits than the evidence log keeps, so
	// rows have been folded into packs when the kill comes.
	testserver.WaitFor(t, 2*time.Minute, "every lease to be renewed 40 times", func() bool {
		for _, l := range leases {
			if acked, _ := l.state(); acked < 40 {
				return false
			}
		}
		return true
	})
	proc.Kill() // the renewers have calls in flight: a commit is under way
	stopStorm()
	wg.Wait()
	for _, err := range refusals {
		t.Error(err)
	}

	// The store holds fewer evidence keys than rows: the rows were packed.
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	var keys int
	if err := st.View(ctx, func(tx store.ReadTxn) error {
		keys = 0
		return tx.Scan([]byte("leases/evidence/"), nil, func(_, _ []byte) error { keys++; return nil })
	}); err != nil {
		t.Fatal(err)
	}

	proc = testserver.StartProcess(t, dir, args...)
	admin = testserver.NewClients(hc, proc.URL, proc.Admin)
	rows := 0
	for _, l := range leases {
		acked, _ := l.state()
		whole, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.lease.JobId}))
		if err != nil {
			t.Fatalf("evidence of %s: %v", l.lease.JobId, err)
		}
		var paged []*tetherv1.EvidenceRow
		for token := ""; ; {
			resp, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.lease.JobId, PageSize: 7, PageToken: token}))
			if err != nil {
				t.Fatalf("evidence of %s from %q: %v", l.lease.JobId, token, err)
			}
			paged = append(paged, resp.Msg.Rows...)
			if token = resp.Msg.NextPageToken; token == "" {
				break
			}
		}
		if len(paged) != len(whole.Msg.Rows) {
			t.Fatalf("%s: %d rows page by page, %d whole", l.lease.JobId, len(paged), len(whole.Msg.Rows))
		}
		inEvidence := map[uint64]bool{}
		for i, row := range whole.Msg.Rows {
			if row.Row != uint64(i+1) || !proto.Equal(row, paged[i]) {
				t.Fatalf("%s: row %d is numbered %d, or differs page by page:\n%v\n%v", l.lease.JobId, i+1, row.Row, row, paged[i])
			}
			if row.Message == "renew" && row.Decision.GetOutcome() == tetherv1.Outcome_OUTCOME_ACCEPTED {
				inEvidence[row.RenewSequence] = true
			}
		}
		rows += len(whole.Msg.Rows)
		for _, seq := range l.accepted {
			if !inEvidence[seq] {
				t.Errorf("%s: renew %d was accepted, and its evidence row is missing after kill -9", l.lease.JobId, seq)
			}
		}
		got, err := admin.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.lease.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Msg.Lease.RenewSequence < acked {
			t.Errorf("%s: renew %d was acknowledged, the lease says %d after kill -9", l.lease.JobId, acked, got.Msg.Lease.RenewSequence)
		}
		// The lease goes on: the next sequence after every one sent.
		c := testserver.NewClients(hc, proc.URL, holders[l.holder].Credential)
		seq := l.next()
		testserver.WaitFor(t, replicaWait, "the restarted coordinator to serve", func() bool {
			resp, err := c.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.lease.JobId, LeaseId: l.lease.LeaseId, LeaseGeneration: l.lease.LeaseGeneration, RenewSequence: seq}))
			if err != nil {
				return false
			}
			if resp.Msg.Decision.Outcome != tetherv1.Outcome_OUTCOME_ACCEPTED {
				t.Fatalf("%s: renew %d after the restart: %v", l.lease.JobId, seq, resp.Msg.Decision)
			}
			return true
		})
	}
	// (How many rows share a key depends on how many share a commit.)
	if keys >= rows {
		t.Fatalf("%d evidence keys for %d rows: the rows were not packed", keys, rows)
	}
	t.Logf("%d rows under %d keys of the jobs' own", rows, keys)
}
