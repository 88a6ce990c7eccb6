package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fourth hostile pass on the LeaseWorker (letter A), the Python
// worker's fix of the pass (test_rogue44a_a_forged_lease_duration_*)
// brought to Go: a rogue path to the control plane forges the lease
// duration in the answer to a job's ACK, in front of a real embedded
// server.
//
// A job took its renew interval (a third of the duration) from the ACK's
// answer and its window from each accepted answer's duration. One forged
// answer naming a day had the job, its path honest from then on, renew
// every 8 hours: never again within its lease, deaf to its cancel request,
// working on past its lease's expiry at the coordinator for as long.

// rogue44APath relays everything, and answers the ACK of job `own` with
// the real answer, duration in its lease. It counts the renewals of `own`.
type rogue44APath struct {
	next     http.RoundTripper
	own      string
	duration *durationpb.Duration
	renewals atomic.Int32
}

func (p *rogue44APath) RoundTrip(r *http.Request) (*http.Response, error) {
	ack, renew := strings.HasSuffix(r.URL.Path, "/Ack"), strings.HasSuffix(r.URL.Path, "/Renew")
	if !ack && !renew {
		return p.next.RoundTrip(r)
	}
	body, err := peekBody(r)
	if err != nil {
		return nil, err
	}
	if renew {
		var req tetherv1.RenewRequest
		if proto.Unmarshal(body, &req) == nil && req.JobId == p.own {
			p.renewals.Add(1)
		}
		return p.next.RoundTrip(r)
	}
	var req tetherv1.AckRequest
	if err := proto.Unmarshal(body, &req); err != nil || req.JobId != p.own {
		return p.next.RoundTrip(r)
	}
	return relayForgedAck(p.next, r, func(a *tetherv1.AckResponse) {
		if a.Lease != nil {
			a.Lease.LeaseDuration = p.duration
		}
	})
}

// The answer to the job's ACK with a longer lease duration in it than the
// offer's (a day's, the largest a duration holds): the job, on the
// worker's default renew interval, still hears its cancel request at its
// first renewal.
func TestRogue44AForgedLeaseDurationDoesNotDeafenTheJob(t *testing.T) {
	for _, forged := range []struct {
		name     string
		duration *durationpb.Duration
	}{
		{"a day", durationpb.New(24 * time.Hour)},
		{"the largest", &durationpb.Duration{Seconds: 315576000000}},
	} {
		t.Run(forged.name, func(t *testing.T) {
			ctx := context.Background()
			srv, _, root := embeddedRoot(t, "root")
			child := spawnChild(t, root, "worker")
			path := &rogue44APath{next: agentsdk.HTTP2Client(srv.URL).Transport, own: "job-44a-own", duration: forged.duration}
			conn := agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: path}))
			o, err := root.Conn().Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
				JobId: "job-44a-own", HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(6 * time.Second),
			}))
			if err != nil {
				t.Fatal(err)
			}
			lw, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: conn, SpoolDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lw.Close() })
			var onCancels atomic.Int32
			job, _, err := lw.Accept(ctx, o.Msg.Lease, agentsdk.JobOptions{OnCancel: func(*tetherv1.Lease) { onCancels.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := root.Conn().Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: "job-44a-own", Reason: "rogue44a"})); err != nil {
				t.Fatal(err)
			}
			// A guard against the deaf job (ten of its renew intervals),
			// not a timing.
			select {
			case <-job.Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("the job never heard its cancel request: %d renewal(s) sent in 20 s of a 6 s lease", path.renewals.Load())
			}
			if cause := context.Cause(job.Context()); !errors.Is(cause, agentsdk.ErrLeaseCancelled) {
				t.Fatalf("the job ended with %v, want ErrLeaseCancelled", cause)
			}
			if n := onCancels.Load(); n != 1 {
				t.Fatalf("OnCancel ran %d time(s), want 1", n)
			}
		})
	}
}
