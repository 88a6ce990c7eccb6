package agentsdk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// A progress report the control plane refuses for rate (resource_exhausted)
// is spooled like one it could not be reached for, but the caller learns
// why: the error is ErrSpooled and the refusal, as the Python worker's
// Spooled carries it as its cause and the TypeScript worker throws it.
func TestLeaseWorkerSpooledRateLimitRefusalCarriesItsCause(t *testing.T) {
	clk := clock.NewManual(leaseEpoch) // the budget never refills: no timing in the test
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit = 3 })
	admin := agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP))
	ctx := context.Background()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rated"}))
	if err != nil {
		t.Fatal(err)
	}
	conn := agentsdk.Dial(srv.URL, root.Msg.Credential, agentsdk.WithHTTPClient(srv.HTTP))
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "rated-job", HolderIdentity: root.Msg.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	w, err := agentsdk.NewLeaseWorker(agentsdk.LeaseWorkerConfig{Conn: conn, SpoolDir: t.TempDir(), Clock: clk, RenewEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	job, _, err := w.Accept(ctx, offered.Msg.Lease, agentsdk.JobOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer job.Stop()
	for i := 0; i < 200; i++ {
		_, err = job.Progress(ctx, fmt.Sprintf("step %d", i))
		if err != nil {
			break
		}
	}
	if !errors.Is(err, agentsdk.ErrSpooled) {
		t.Fatalf("a rate-limited report: %v, want ErrSpooled", err)
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the spooled report's error %q does not carry the rate-limit refusal (code %v)", err, connect.CodeOf(err))
	}
}
