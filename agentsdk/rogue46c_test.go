package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-sixth hostile pass on the LeaseWorker (letter C): a job
// accepted from an offer that names no lease duration (one its caller
// built by hand from the ids it was handed: job, lease, generation) took
// its window from whatever duration each accepted answer named. The
// forty-fourth pass bounded the answers' duration by the offer's, and left
// such an offer to the answers (design §11): a rogue path to the control
// plane, in front of a real embedded server, answers the job's first
// renewal with the real accepted answer and a day's duration in its lease,
// then withholds everything. The job's bound moved to a day past that
// renewal: cut off from its coordinator, deaf to a cancel request, it
// worked on past its 30-second lease's expiry for a day. The generation's
// duration is now fixed by the ACK's answer when the offer names none, as
// by the offer when it does.

// rogue46CPath relays the ACK, answers the first renewal of job `own` with
// the real answer and `forged` for its lease duration, and fails every
// request after that one as unreachable.
type rogue46CPath struct {
	next   http.RoundTripper
	own    string
	forged *durationpb.Duration

	forgedOnce, withheldOnce sync.Once
	didForge, didWithhold    chan struct{}
	cut                      atomic.Bool
	withheld                 atomic.Int32
}

func (p *rogue46CPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.cut.Load() {
		p.withheld.Add(1)
		p.withheldOnce.Do(func() { close(p.didWithhold) })
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New("rogue46c path: withheld")
	}
	own, err := peekOwn(r, "Renew", p.own, &tetherv1.RenewRequest{})
	if err != nil {
		return nil, err
	}
	if !own {
		return p.next.RoundTrip(r)
	}
	resp, err := relayForged(p.next, r, &tetherv1.RenewResponse{}, func(real *tetherv1.RenewResponse) {
		if real.Lease != nil {
			real.Lease.LeaseDuration = p.forged
		}
		// Every request after this one is withheld: the forged answer is
		// the last the job hears.
		p.cut.Store(true)
	})
	if p.cut.Load() {
		p.forgedOnce.Do(func() { close(p.didForge) })
	}
	return resp, err
}

func TestRogue46CAnOfferWithoutADurationDoesNotTakeAForgedWindow(t *testing.T) {
	ctx := context.Background()
	srv, _, root := embeddedRoot(t, "root")
	child := spawnChild(t, root, "worker")
	const jobID = "job-46c-own"
	path := &rogue46CPath{next: agentsdk.HTTP2Client(srv.URL).Transport, own: jobID, forged: durationpb.New(24 * time.Hour), didForge: make(chan struct{}), didWithhold: make(chan struct{})}
	conn := agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: path}))
	o, err := root.Conn().Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
		JobId: jobID, HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(30 * time.Second),
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The worker is handed the ids, not the lease: its caller builds the
	// offer it accepts, with no duration in it.
	handBuilt := &tetherv1.Lease{JobId: o.Msg.Lease.JobId, LeaseId: o.Msg.Lease.LeaseId, LeaseGeneration: o.Msg.Lease.LeaseGeneration}
	clk := clock.NewManual(time.Now().UTC())
	// Each renewal is given the interval to be answered: long enough for
	// the forged answer to reach the job.
	lw, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: conn, SpoolDir: t.TempDir(), Clock: clk, RenewEvery: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lw.Close() })
	job, d, err := lw.Accept(ctx, handBuilt, agentsdk.JobOptions{})
	if err != nil || d.GetAuditEvent() != tetherv1.AuditEvent_AUDIT_EVENT_ACKED {
		t.Fatalf("accept: %v %v", d, err)
	}
	// The renew loop's first renewal gets the forged answer (accepted, a
	// day's duration), and its next request is withheld: the loop acted
	// on the forged answer before it sent that one. The worker's clock has
	// not moved since the ACK.
	for _, c := range []chan struct{}{path.didForge, path.didWithhold} {
		select {
		case <-c:
		case <-job.Done():
			t.Fatalf("the job ended before the forged answer and the next renewal: %v", context.Cause(job.Context()))
		case <-time.After(20 * time.Second): // a guard, not a timing
			t.Fatal("the job never renewed")
		}
	}
	if l := job.Lease(); l.GetRenewSequence() != 1 || l.GetLeaseDuration().AsDuration() != 24*time.Hour {
		t.Fatalf("the forged answer never reached the job (its lease: renew seq %d, duration %s): the test proves nothing", l.GetRenewSequence(), l.GetLeaseDuration().AsDuration())
	}
	// Past the 30-second lease on the worker's clock, with no answer since
	// the forged one: nothing the coordinator accepted covers the job now.
	clk.Advance(31 * time.Second)
	select {
	case <-job.Done():
	case <-time.After(10 * time.Second): // a guard (ten renew ticks), not a timing
		t.Fatalf("the job works on 31 s after its last accepted renewal of a 30 s lease (%d request(s) withheld): its bound is the forged day's", path.withheld.Load())
	}
	if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseUnconfirmed) {
		t.Fatalf("the job ended with %v, want ErrLeaseUnconfirmed", cause)
	}
}
