package agentsdk_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth hostile pass, SDK parity (letter J): a rogue path to the
// control plane answers a job's ACK with the coordinator's accepted
// decision and no lease in it, in front of a real embedded server. The
// TypeScript worker refuses such an answer ("no lease in the answer") and
// the Python worker since this pass (AckRefused); the Go worker began the
// job on it, its Lease() nil and no window proved.

// rogue44JPath relays everything, and answers the ACK of job `own` with
// the real answer, its lease taken out.
type rogue44JPath struct {
	next http.RoundTripper
	own  string
}

func (p *rogue44JPath) RoundTrip(r *http.Request) (*http.Response, error) {
	own, err := peekOwn(r, "Ack", p.own, &tetherv1.AckRequest{})
	if err != nil {
		return nil, err
	}
	if !own {
		return p.next.RoundTrip(r)
	}
	return relayForgedAck(p.next, r, func(a *tetherv1.AckResponse) { a.Lease = nil })
}

func TestRogue44JAckAnswerWithoutALeaseIsRefused(t *testing.T) {
	ctx := context.Background()
	srv, _, root := embeddedRoot(t, "root")
	child := spawnChild(t, root, "worker")
	path := &rogue44JPath{next: agentsdk.HTTP2Client(srv.URL).Transport, own: "job-44j-own"}
	conn := agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: path}))
	o, err := root.Conn().Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
		JobId: "job-44j-own", HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	lw, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: conn, SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lw.Close() })
	job, d, err := lw.Accept(ctx, o.Msg.Lease, agentsdk.JobOptions{})
	if err == nil {
		t.Fatalf("the worker began the job on an ACK answer with no lease (decision %s, Lease() %v)", d.GetOutcome(), job.Lease())
	}
	if job != nil {
		t.Fatalf("Accept returned a job beside its error %v", err)
	}
	if !strings.Contains(err.Error(), "no lease in the answer") {
		t.Fatalf("the refusal reads %q, want it to say the answer had no lease", err)
	}
}
