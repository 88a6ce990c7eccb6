package agentsdk_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-third hostile pass on the Go SDK's LeaseWorker (letter V), the
// TypeScript worker's fix (rogue43S.test.ts) brought to Go: a rogue path
// to the control plane (a proxy that replays, caches or crosses answers)
// answers one job's renewals with another job's answers, in front of a
// real embedded server.
//
// A job judged an answer by its generation and state only. Generations
// count per job (every job's first is 1), so another job's answer of the
// same generation passed for the job's own: another job's accepted renewal
// moved the job's bound (it worked on with no renewal of its own accepted),
// and another job's cancel request had the job run its OnCancel and
// acknowledge a cancel the coordinator never asked of it.

// rogue43VPath is the hostile path: it relays everything, and answers the
// renewals of job `own` as swap says, from the real answer to them and the
// last real answer to a renewal of any other job. It counts the renewals
// and cancel acknowledgements of `own` that it saw.
type rogue43VPath struct {
	next http.RoundTripper
	own  string

	mu   sync.Mutex
	swap func(real, other *tetherv1.RenewResponse) *tetherv1.RenewResponse
	// forgeAck, when set, is the lease id the path puts in the answer to
	// the ACK of `own`.
	forgeAck string
	other    *tetherv1.RenewResponse

	renewals, cancelAcks atomic.Int32
}

func (p *rogue43VPath) RoundTrip(r *http.Request) (*http.Response, error) {
	renew := strings.HasSuffix(r.URL.Path, "/Renew")
	p.mu.Lock()
	forgeAck := p.forgeAck
	p.mu.Unlock()
	if forgeAck != "" && strings.HasSuffix(r.URL.Path, "/Ack") {
		return p.forgeAckAnswer(r, forgeAck)
	}
	if !renew && !strings.HasSuffix(r.URL.Path, "/CancelAck") {
		return p.next.RoundTrip(r)
	}
	body, err := peekBody(r)
	if err != nil {
		return nil, err
	}
	r.Header.Del("Accept-Encoding") // answers the path can read
	if !renew {
		var req tetherv1.LeaseServiceCancelAckRequest
		if proto.Unmarshal(body, &req) == nil && req.JobId == p.own {
			p.cancelAcks.Add(1)
		}
		return p.next.RoundTrip(r)
	}
	var req tetherv1.RenewRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	resp, err := p.next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(answer))
		if err != nil {
			return nil, err
		}
		if answer, err = io.ReadAll(zr); err != nil {
			return nil, err
		}
		resp.Header.Del("Content-Encoding")
	}
	var real tetherv1.RenewResponse
	if err := proto.Unmarshal(answer, &real); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if req.JobId != p.own {
		p.other = proto.Clone(&real).(*tetherv1.RenewResponse)
	} else {
		p.renewals.Add(1)
		if p.swap != nil {
			if swapped := p.swap(&real, p.other); swapped != nil {
				if answer, err = proto.Marshal(swapped); err != nil {
					p.mu.Unlock()
					return nil, err
				}
			}
		}
	}
	p.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	resp.ContentLength = int64(len(answer))
	resp.Header.Set("Content-Length", strconv.Itoa(len(answer)))
	return resp, nil
}

// forgeAckAnswer relays an ACK and puts leaseID in the lease of its
// answer.
func (p *rogue43VPath) forgeAckAnswer(r *http.Request, leaseID string) (*http.Response, error) {
	return relayForgedAck(p.next, r, func(a *tetherv1.AckResponse) {
		if a.Lease != nil {
			a.Lease.LeaseId = leaseID
		}
	})
}

// rogue43VWorld is a child agent holding two jobs of generation 1 on the
// embedded server through the rogue path: "job-43v-own" under a
// LeaseWorker (whose renew loop waits an hour: the test's renewals are its
// own), "job-43v-other" ACKed by hand.
type rogue43VWorld struct {
	root      *agentsdk.Agent
	conn      *agentsdk.Conn
	path      *rogue43VPath
	job       *agentsdk.Job
	onCancels atomic.Int32
	other     *tetherv1.Lease
}

func startRogue43VWorld(t *testing.T) *rogue43VWorld {
	t.Helper()
	return startRogue43VWorldWith(t, "")
}

// startRogue43VWorldWith starts the world with the path putting forgeAck
// (when not empty) in the answer to the own job's ACK.
func startRogue43VWorldWith(t *testing.T, forgeAck string) *rogue43VWorld {
	t.Helper()
	ctx := context.Background()
	srv, _, root := embeddedRoot(t, "root")
	child := spawnChild(t, root, "worker")
	w := &rogue43VWorld{root: root, path: &rogue43VPath{next: agentsdk.HTTP2Client(srv.URL).Transport, own: "job-43v-own"}}
	w.conn = agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: w.path}))
	offer := func(job string) *tetherv1.Lease {
		o, err := root.Conn().Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
			JobId: job, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute),
		}))
		if err != nil {
			t.Fatal(err)
		}
		return o.Msg.Lease
	}
	own, other := offer("job-43v-own"), offer("job-43v-other")
	if own.LeaseGeneration != other.LeaseGeneration {
		t.Fatalf("generations %d and %d: the test proves nothing", own.LeaseGeneration, other.LeaseGeneration)
	}
	if _, err := w.conn.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{
		JobId: other.JobId, LeaseId: other.LeaseId, LeaseGeneration: other.LeaseGeneration, SentAt: timestamppb.Now(),
	})); err != nil {
		t.Fatal(err)
	}
	w.other = other
	w.path.forgeAck = forgeAck
	lw, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: w.conn, SpoolDir: t.TempDir(), RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lw.Close() })
	w.job, _, err = lw.Accept(ctx, own, agentsdk.JobOptions{OnCancel: func(*tetherv1.Lease) { w.onCancels.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// renewOther renews the other job by hand through the path, which keeps
// the answer.
func (w *rogue43VWorld) renewOther(t *testing.T, seq uint64) {
	t.Helper()
	if _, err := w.conn.Lease.Renew(context.Background(), connect.NewRequest(&tetherv1.RenewRequest{
		JobId: w.other.JobId, LeaseId: w.other.LeaseId, LeaseGeneration: w.other.LeaseGeneration, RenewSequence: seq, SentAt: timestamppb.Now(),
	})); err != nil {
		t.Fatal(err)
	}
}

// checkLost checks the job ended as lost, naming what the answer named,
// and kept its own lease.
func (w *rogue43VWorld) checkLost(t *testing.T, what string, names string) {
	t.Helper()
	ctx := w.job.Context()
	if ctx.Err() == nil {
		t.Fatalf("the job ran on after answers with %s lease (%d renewal(s) answered so)", what, w.path.renewals.Load())
	}
	cause := context.Cause(ctx)
	if !errors.Is(cause, agentsdk.ErrLeaseLost) || errors.Is(cause, agentsdk.ErrLeaseUnconfirmed) {
		t.Fatalf("the job ended with %v, want ErrLeaseLost", cause)
	}
	if !strings.Contains(cause.Error(), "the answer names "+names) {
		t.Fatalf("the job's cause %q does not name %s", cause, names)
	}
	<-w.job.Done()
	if l := w.job.Lease(); l.JobId != "job-43v-own" || l.LeaseId == w.other.LeaseId || l.LeaseId == "lease-43v-forged" {
		t.Fatalf("the job keeps job %q lease %q as its own", l.JobId, l.LeaseId)
	}
}

// Another job's accepted renewal of the same generation, replayed for the
// job's: it ends the job as lost, and its lease is not taken.
func TestRogue43VLeaseWorkerTakesNoOtherJobsRenewal(t *testing.T) {
	ctx := context.Background()
	w := startRogue43VWorld(t)
	w.renewOther(t, 1)
	w.path.mu.Lock()
	w.path.swap = func(_, other *tetherv1.RenewResponse) *tetherv1.RenewResponse { return other }
	w.path.mu.Unlock()
	for range 2 {
		if w.job.Context().Err() != nil {
			break
		}
		if _, err := w.job.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.checkLost(t, "another job's", `job "job-43v-other"`)
	if n := w.path.renewals.Load(); n != 1 {
		t.Fatalf("%d renewals sent, want 1: the job ran on after an answer that was not its own", n)
	}
}

// The job's own answer with another lease of the job in it: it ends the
// job as lost, and that lease is not taken.
func TestRogue43VLeaseWorkerTakesNoOtherLeasesRenewal(t *testing.T) {
	ctx := context.Background()
	w := startRogue43VWorld(t)
	w.path.mu.Lock()
	w.path.swap = func(real, _ *tetherv1.RenewResponse) *tetherv1.RenewResponse {
		forged := proto.Clone(real).(*tetherv1.RenewResponse)
		forged.Lease.LeaseId = "lease-43v-forged"
		return forged
	}
	w.path.mu.Unlock()
	for range 2 {
		if w.job.Context().Err() != nil {
			break
		}
		if _, err := w.job.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.checkLost(t, "another lease's", `lease "lease-43v-forged"`)
	if n := w.path.renewals.Load(); n != 1 {
		t.Fatalf("%d renewals sent, want 1: the job ran on after an answer that was not its own", n)
	}
}

// Another job's cancel request, replayed for the job's renewal: the job
// runs no OnCancel and acknowledges nothing, and ends as lost.
func TestRogue43VLeaseWorkerRunsNoOtherJobsCancel(t *testing.T) {
	ctx := context.Background()
	w := startRogue43VWorld(t)
	if _, err := w.root.Conn().Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: w.other.JobId, Reason: "rogue43v"})); err != nil {
		t.Fatal(err)
	}
	w.renewOther(t, 1)
	w.path.mu.Lock()
	if !w.path.other.GetLease().GetCancelRequested() {
		w.path.mu.Unlock()
		t.Fatal("the other job's answer carries no cancel request: the test proves nothing")
	}
	w.path.swap = func(_, other *tetherv1.RenewResponse) *tetherv1.RenewResponse { return other }
	w.path.mu.Unlock()
	if _, err := w.job.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	<-w.job.Done()
	if n, acks := w.onCancels.Load(), w.path.cancelAcks.Load(); n != 0 || acks != 0 {
		t.Fatalf("another job's cancel request ran OnCancel %d time(s) and was acknowledged %d time(s) for the job; want 0 and 0", n, acks)
	}
	w.checkLost(t, "another job's", `job "job-43v-other"`)
	got, err := w.root.Conn().Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: "job-43v-own"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Lease.CancelRequested || got.Msg.Lease.CancelAck {
		t.Fatalf("the coordinator's lease of the job: cancel requested %v, acknowledged %v; want neither", got.Msg.Lease.CancelRequested, got.Msg.Lease.CancelAck)
	}
}

// The answer to the job's ACK with another lease of the job in it: the
// job ends as lost before it begins, and that lease is not taken.
func TestRogue43VLeaseWorkerTakesNoOtherLeasesAck(t *testing.T) {
	w := startRogue43VWorldWith(t, "lease-43v-forged")
	w.checkLost(t, "another lease's", `lease "lease-43v-forged"`)
	if n := w.path.renewals.Load(); n != 0 {
		t.Fatalf("%d renewals sent after an ACK answer that was not the job's own, want 0", n)
	}
}
