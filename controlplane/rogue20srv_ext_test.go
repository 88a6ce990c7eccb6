package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

// The nineteenth hostile pass over the control plane's RPC surface: a rogue
// agent holding a valid credential for its own node, against the real
// server.

// offerMany has c offer n jobs to holder, ids of the longest length the
// API takes, from a few callers at once; it returns the offered leases.
func offerMany(t *testing.T, c *testserver.Clients, holder, prefix string, n int) []*tetherv1.Lease {
	t.Helper()
	jobs := make([]string, n)
	leases := make([]*tetherv1.Lease, n)
	for i := range jobs {
		id := fmt.Sprintf("%s-%06d-", prefix, i)
		jobs[i] = id + strings.Repeat("x", lease.MaxIDBytes-len(id))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				resp, err := c.Lease.Offer(context.Background(), connect.NewRequest(&tetherv1.OfferRequest{
					JobId: jobs[i], HolderIdentity: holder, LeaseDuration: durationpb.New(5 * time.Minute),
				}))
				if err != nil {
					errs <- fmt.Errorf("offer %d: %w", i, err)
					return
				}
				leases[i] = resp.Msg.Lease
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return leases
}

// TestARogueHoldingManyJobsCannotStallItsStopOneCommitAtATime: a rogue R
// offers its child C thousands of jobs (each offer one request of its
// lineage's budget; a node's leases are not bounded) and its operator then
// aborts R. The termination cancels and finalises the leases its nodes
// hold, and it did so one job after another, each waiting for its own
// commit: some 2.5 commits in a row per job, so that 20,000 jobs (two
// seconds of the lineage's default rate) kept the operator's abort from
// its record for minutes, and a hundred thousand for an hour. The jobs are
// now judged together, each shard gathering them into its batches: the
// termination's lease work costs a few commits whatever the number of
// jobs, and the record still lists every lease CANCELLED (the holder
// never acknowledged them) but those the holder had completed, which it
// lists as the holder's report. Seen failing before the change: 4,095 commits
// for 2,000 jobs.
func TestARogueHoldingManyJobsCannotStallItsStopOneCommitAtATime(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	child := spawn(t, rogue, rogueNode.Node.NodeId, "holder")
	const n = 2000
	jobs := offerMany(t, rogue, child.Node.NodeId, "r20", n)
	// The holder does every tenth job before its stop.
	holder := srv.Clients(child.Credential)
	done := map[string]bool{}
	for i := 0; i < n; i += 10 {
		l := jobs[i]
		if _, err := holder.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
		if _, err := holder.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, Result: tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS})); err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		done[l.JobId] = true
	}

	before := srv.Leases().Stats().Commits
	term := terminate(t, admin, rogueNode.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second).TerminationId
	testserver.WaitFor(t, 5*time.Minute, "the rogue's termination to be recorded", func() bool { // a guard against a hang, not a timing
		clk.Advance(time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	commits := srv.Leases().Stats().Commits - before
	t.Logf("the termination's lease work: %d commits for %d jobs", commits, n)
	if commits > n/10 {
		t.Fatalf("the termination's lease work took %d commits for %d jobs, want a few: one job after another", commits, n)
	}
	listed := recordLeasesByJob(t, admin, term, 1000)
	for _, job := range jobs {
		got, ok := listed[job.JobId]
		switch {
		case !ok:
			t.Fatalf("job %.20s… is not in the record", job.JobId)
		case done[job.JobId]:
			if got.Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_COMPLETED || got.EndedBy != tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT || got.EndedByNodeId != child.Node.NodeId {
				t.Fatalf("job %.20s… is %v ended by %v %s in the record, want COMPLETED on its holder's report", job.JobId, got.Outcome, got.EndedBy, got.EndedByNodeId)
			}
		default:
			if got.Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED || got.EndedBy != tetherv1.LeaseEndedBy_LEASE_ENDED_BY_TERMINATION {
				t.Fatalf("job %.20s… is %v ended by %v in the record, want CANCELLED by the termination: the holder never acknowledged it", job.JobId, got.Outcome, got.EndedBy)
			}
		}
	}
	if len(listed) != n {
		t.Fatalf("the record lists %d leases, want the holder's %d", len(listed), n)
	}
}

// TestARogueHoldingManyJobsCannotMakeItsStopUnrecordable: nothing bounds
// how many leases a node holds (finished ones included), and a chunk of
// the record was one transaction with every lease its members held: some
// 20,000 jobs of the longest ids (one lineage's budget for a few seconds)
// made it larger than the store takes ("transaction too large"), and the
// rogue's termination retried for ever, never TERMINATED. The chunk now
// writes a page of the leases and the rest follow in parts of their own;
// here pages of 16 KiB (the default is 512 KiB) so that a few hundred jobs
// span many, through the real server: the termination is recorded and the
// record lists every lease once. Seen failing before the change: the
// record took 1 transaction (one part with every lease).
func TestARogueHoldingManyJobsCannotMakeItsStopUnrecordable(t *testing.T) {
	clk := clock.NewManual(epoch)
	var records atomic.Int64
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.TerminationLeasePage = 16 << 10
		cfg.TerminationFault = func(step string, _ int) {
			if step == "record" {
				records.Add(1)
			}
		}
	})
	admin := srv.AdminClients()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	child := spawn(t, rogue, rogueNode.Node.NodeId, "holder")
	const n = 600
	jobs := offerMany(t, rogue, child.Node.NodeId, "r20rec", n)
	term := terminate(t, admin, rogueNode.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second).TerminationId
	testserver.WaitFor(t, 5*time.Minute, "the rogue's termination to be recorded", func() bool { // a guard against a hang, not a timing
		clk.Advance(time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	// ~600 leases of ~400 bytes in pages of 16 KiB: some fifteen parts.
	if got := records.Load(); got < 10 {
		t.Fatalf("the record took %d transactions, want its leases in pages (at least 10)", got)
	}
	listed := recordLeasesByJob(t, admin, term, 100)
	for _, job := range jobs {
		got, ok := listed[job.JobId]
		switch {
		case !ok:
			t.Fatalf("job %.20s… is not in the record", job.JobId)
		case got.Outcome != tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED || got.HolderIdentity != child.Node.NodeId:
			t.Fatalf("job %.20s… is %v held by %s in the record, want CANCELLED, held by the holder", job.JobId, got.Outcome, got.HolderIdentity)
		}
	}
	if len(listed) != n {
		t.Fatalf("the record lists %d leases, want the holder's %d", len(listed), n)
	}
}

// recordLeasesByJob reads a termination's record page by page (pageSize
// rows a page) and returns its leases by job id, failing the test on a job
// listed twice.
func recordLeasesByJob(t *testing.T, admin *testserver.Clients, term string, pageSize int32) map[string]*tetherv1.RecordLease {
	t.Helper()
	listed := map[string]*tetherv1.RecordLease{}
	token := ""
	for {
		resp, err := admin.Supervisor.GetRecord(context.Background(), connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term, PageSize: pageSize, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.Msg.Record.Leases {
			if _, dup := listed[l.JobId]; dup {
				t.Fatalf("job %.20s… listed twice in the record", l.JobId)
			}
			listed[l.JobId] = l
		}
		if token = resp.Msg.NextPageToken; token == "" {
			return listed
		}
	}
}
