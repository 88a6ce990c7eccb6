package agentsdk_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
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
	if !strings.HasSuffix(r.URL.Path, "/Ack") {
		return p.next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req tetherv1.AckRequest
	if err := proto.Unmarshal(body, &req); err != nil || req.JobId != p.own {
		return p.next.RoundTrip(r)
	}
	r.Header.Del("Accept-Encoding") // an answer the path can read
	resp, err := p.next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
		return resp, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var real tetherv1.AckResponse
	if err := proto.Unmarshal(answer, &real); err != nil {
		return nil, err
	}
	real.Lease = nil
	if answer, err = proto.Marshal(&real); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	resp.ContentLength = int64(len(answer))
	resp.Header.Set("Content-Length", strconv.Itoa(len(answer)))
	return resp, nil
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
