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
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-third hostile pass on the Go SDK (letter L).

// A hostile element on a tool server's path holds the gate's WatchCancels
// stream open and silent. The stream carries cancel orders only, so its
// silence is what an honest control plane with nothing to cancel sends
// too: the gate waited on it for good, deaf to every cancel order even
// once the path was honest again. The agent being stopped had its tool run
// on past the cancel its abort ordered (and the abort recorded the gate's
// cancel unacknowledged). Now a gate with a call in flight opens its
// stream anew every agentsdk.CancelWatchRefresh (the control plane sends
// every pending order again on a new stream), and the handler is
// cancelled.
func TestRogue43LSilentCancelStreamDoesNotDeafenTheGate(t *testing.T) {
	defer agentsdk.SetCancelWatchRefresh(100 * time.Millisecond)()
	ctx := context.Background()
	w := startShellWorld(t)
	operator, agent := w.operator, w.agent
	// On the gate's path: its first WatchCancels stream held open, nothing
	// of it relayed.
	path := &silentPath{next: operator.HTTP.Transport, suffix: "/WatchCancels"}
	gate := agentsdk.NewToolGate(agentsdk.Dial(operator.BaseURL, w.gateToken, agentsdk.WithHTTPClient(&http.Client{Transport: path})), "shell-gate")
	t.Cleanup(gate.Close)
	<-gate.Ready()

	running := make(chan struct{})
	cancelled := make(chan error, 1)
	guard := make(chan struct{}) // closed at the test's end: a guard against the hang
	defer close(guard)
	called := make(chan error, 1)
	go func() {
		called <- gate.Call(ctx, w.rootToken, "shell", func(ctx context.Context) error {
			close(running)
			select {
			case <-ctx.Done():
				cancelled <- context.Cause(ctx)
				return ctx.Err()
			case <-guard:
				return errors.New("the test ended with the tool still running")
			}
		})
	}()
	<-running
	if _, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: agent.NodeID(), Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Hour), Reason: "rogue43l",
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, agentsdk.ErrCancelled) {
			t.Fatalf("the tool's context ended with %v, want ErrCancelled", cause)
		}
	case <-time.After(20 * time.Second): // a guard against the hang, not a timing
		t.Fatalf("the gate is deaf: its tool still running 20 s (200 refresh intervals) after its abort was ordered; %d WatchCancels stream(s) opened, the stalled one still waited on", path.opened.Load())
	}
	if err := <-called; !errors.Is(err, agentsdk.ErrCancelled) {
		t.Fatalf("Call returned %v, want ErrCancelled (the cancel acknowledged)", err)
	}
	if n := path.opened.Load(); n < 2 {
		t.Fatalf("the order heard on %d stream(s): the stalled one relayed it", n)
	}
}

// rogue43lRenewals counts the lease renewals on a worker's path the
// control plane refused with unauthenticated (401: a dead credential).
type rogue43lRenewals struct {
	next    http.RoundTripper
	refused atomic.Int32
}

func (c *rogue43lRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && strings.HasSuffix(r.URL.Path, "/Renew") && resp.StatusCode == http.StatusUnauthorized {
		c.refused.Add(1)
	}
	return resp, err
}

// The agent being stopped holds a job under a LeaseWorker, and its path to
// the control plane (a proxy's, a peer's) withholds its lease traffic while
// its node is aborted: the stop's cancel request never reaches the job, and
// the stop ends all the same (the operator confirms the exit, the record is
// written, the node's credential refused). Once the path is honest again
// every renewal is refused unauthenticated, and the worker logged each and
// went on: the job's work ran for its lease's whole window (here the
// policy's ten minutes) after its stop, as Agent.Run would have aborted the
// agent at the first such refusal. Now the renew loop ends the job on a
// dead credential (unauthenticated, permission_denied) as on a confirmed
// exit (failed_precondition).
func TestRogue43LLeaseWorkerStopsAJobWhoseCredentialIsDead(t *testing.T) {
	ctx := context.Background()
	srv, operator, root := embeddedRoot(t, "root")
	child := spawnChild(t, root, "worker")
	cut := &cuttable{next: agentsdk.HTTP2Client(srv.URL).Transport}
	renewals := &rogue43lRenewals{next: cut}
	conn := agentsdk.Dial(srv.URL, child.Credential, agentsdk.WithHTTPClient(&http.Client{Transport: renewals}))
	offered, err := root.Conn().Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
		JobId: "job-43l", HolderIdentity: child.Node.NodeId, LeaseDuration: durationpb.New(10 * time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: conn, SpoolDir: t.TempDir(), RenewEvery: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	job, _, err := w.Accept(ctx, offered.Msg.Lease, agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cut.disconnect() // the path withholds the worker's lease traffic
	term, err := operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(time.Second), ConfirmTimeout: durationpb.New(time.Second), Reason: "rogue43l",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, 30*time.Second, "the abort to terminate", func() bool {
		got, err := operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: term.Msg.Termination.TerminationId}))
		if err != nil {
			t.Fatal(err)
		}
		return got.Msg.Termination.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	if err := job.Context().Err(); err != nil {
		t.Fatalf("the job ended (%v) while its path withheld everything: the test proves nothing", context.Cause(job.Context()))
	}
	cut.cut.Store(false) // honest again
	const enough = 5
	testserver.WaitFor(t, 30*time.Second, "the job to end or its renewals to be refused", func() bool {
		select {
		case <-job.Done():
			return true
		default:
			return renewals.refused.Load() >= enough
		}
	})
	select {
	case <-job.Done():
	default:
		t.Fatalf("the job still works after its node's stop: %d renewals refused unauthenticated, its context %v", renewals.refused.Load(), job.Context().Err())
	}
	cause := context.Cause(job.Context())
	if !errors.Is(cause, agentsdk.ErrJobEnded) || connect.CodeOf(cause) != connect.CodeUnauthenticated {
		t.Fatalf("the job ended with %v, want ErrJobEnded carrying unauthenticated", cause)
	}
	// The path counts a refusal the server sent, and a renewal whose
	// answer came after its own timeout (one RenewEvery, on a loaded
	// machine) is one the worker never read: it ends at the first refusal
	// it reads, so a few may be counted, never the enough it kept working
	// through before.
	if n := renewals.refused.Load(); n >= enough {
		t.Fatalf("%d renewals refused before the job ended, want the first the worker read to end it", n)
	}
}
