package main

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogueWorld is a root agent and its child "worker", the rogue, with the
// clients of each: the CLI's rogue tests print what the rogue wrote.
type rogueWorld struct {
	admin, parent, rogue *testserver.Clients
	child                *tetherv1.SpawnResponse
}

func startRogueWorld(t *testing.T, srv *testserver.Server) rogueWorld {
	t.Helper()
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	parent := srv.Clients(root.Msg.Credential)
	child, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	return rogueWorld{admin: admin, parent: parent, rogue: srv.Clients(child.Msg.Credential), child: child.Msg}
}

// holdJobs has the operator offer each job to the rogue, which acknowledges it.
func (w rogueWorld) holdJobs(t *testing.T, jobs ...string) {
	t.Helper()
	for _, job := range jobs {
		w.holdJob(t, job)
	}
}

// holdJob has the operator offer job to the rogue, which acknowledges it,
// and returns the lease the rogue holds.
func (w rogueWorld) holdJob(t *testing.T, job string) *tetherv1.Lease {
	t.Helper()
	ctx := context.Background()
	offered, err := w.admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: job, HolderIdentity: w.child.Node.NodeId}))
	if err != nil {
		t.Fatalf("offer %q: %v", job, err)
	}
	l := offered.Msg.Lease
	if _, err := w.rogue.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	return l
}
