package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/leader"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
	"github.com/tetherhq/tether/internal/store/etcdstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// replicaWait bounds the waits of the replica tests: an election, a
// takeover, a termination's timeouts.
const replicaWait = 30 * time.Second

// electionOf reads the leader election of the control plane under prefix.
func electionOf(t *testing.T, cluster *etcdlocal.Cluster, prefix string) *leader.Etcd {
	t.Helper()
	st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	return &leader.Etcd{Client: st.Client(), Prefix: st.MetadataPrefix("leader")}
}

// startReplicas runs n in-process control planes on one etcd keyspace and
// returns them with the one that leads (once its coordinator serves).
func startReplicas(t *testing.T, n int) (replicas []*testserver.Server, lead *testserver.Server, election *leader.Etcd) {
	t.Helper()
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	byID := map[string]*testserver.Server{}
	for i := range n {
		id := fmt.Sprintf("replica-%d", i)
		st := etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
		srv := testserver.Start(t, testserver.WithEtcdStore(st, id))
		replicas = append(replicas, srv)
		byID[id] = srv
	}
	election = electionOf(t, cluster, prefix)
	testserver.WaitFor(t, replicaWait, "a replica to lead and serve the leases", func() bool {
		c, err := election.Current(context.Background())
		if err != nil {
			return false
		}
		lead = byID[c.Identity]
		serving, _ := lead.Leases().Serving()
		return serving
	})
	return replicas, lead, election
}

func followersOf(replicas []*testserver.Server, lead *testserver.Server) []*testserver.Server {
	var out []*testserver.Server
	for _, r := range replicas {
		if r != lead {
			out = append(out, r)
		}
	}
	return out
}

// channelRenew sends one renew on a Channel stream and returns its answer.
func channelRenew(stream *connect.BidiStreamForClient[tetherv1.ChannelRequest, tetherv1.ChannelResponse], l *tetherv1.Lease, seq uint64) (*tetherv1.ChannelResponse, error) {
	err := stream.Send(&tetherv1.ChannelRequest{CorrelationId: seq, Message: &tetherv1.ChannelRequest_Renew{Renew: &tetherv1.RenewRequest{
		JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq,
	}}})
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return stream.Receive()
}

// Any replica serves every LeaseService call: the followers forward to the
// leader with the caller's own credential, errors come back as the leader
// gave them, and when the leader goes, the next one serves the same leases
// (rebuilt from the store) and forwarded streams reconnect to it.
func TestEtcdReplicasServeEveryLeaseCall(t *testing.T) {
	replicas, lead, election := startReplicas(t, 3)
	followers := followersOf(replicas, lead)
	for _, f := range followers {
		if serving, _ := f.Leases().Serving(); serving {
			t.Fatal("a follower's lease coordinator serves")
		}
	}
	ctx := context.Background()
	// Any replica's admin token is valid on every replica (one key ring).
	admin := followers[0].Clients(lead.Admin)
	root := register(t, followers[1].AdminClients(), "owner")
	worker := spawn(t, followers[0].Clients(root.Credential), root.Node.NodeId, "worker")
	as := func(srv *testserver.Server) *testserver.Clients { return srv.Clients(worker.Credential) }

	offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatalf("offer through a follower: %v", err)
	}
	l := offer.Msg.Lease
	ack, err := as(followers[1]).Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration}))
	if err != nil {
		t.Fatalf("ack through the other follower: %v", err)
	}
	wantDecision(t, "ack", ack.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_ACKED)
	renew := func(srv *testserver.Server, seq uint64) *tetherv1.RenewResponse {
		t.Helper()
		resp, err := as(srv).Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq}))
		if err != nil {
			t.Fatalf("renew %d: %v", seq, err)
		}
		return resp.Msg
	}
	wantDecision(t, "renew on the leader", renew(lead, 1).Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	wantDecision(t, "renew through a follower", renew(followers[0], 2).Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	wantDecision(t, "a repeated renew through the other follower", renew(followers[1], 2).Decision, tetherv1.Outcome_OUTCOME_DUPLICATE, tetherv1.AuditEvent_AUDIT_EVENT_DUPLICATE_RENEW)

	// The Channel stream through a follower.
	stream := as(followers[1]).Lease.Channel(ctx)
	answer, err := channelRenew(stream, l, 3)
	if err != nil || answer.Error != "" {
		t.Fatalf("renew on a Channel through a follower: %v %q", err, answer.GetError())
	}
	wantDecision(t, "channel renew", answer.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
	_ = stream.CloseRequest()
	if _, err := stream.Receive(); !errors.Is(err, io.EOF) {
		t.Fatalf("the forwarded stream ended with %v after the client closed it, want EOF", err)
	}
	_ = stream.CloseResponse()

	// Reads through followers.
	got, err := as(followers[0]).Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
	if err != nil || got.Msg.Lease.RenewSequence != 3 {
		t.Fatalf("get through a follower: %v, renew sequence %d; want 3", err, got.Msg.GetLease().GetRenewSequence())
	}
	list, err := as(followers[1]).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{}))
	if err != nil || len(list.Msg.Leases) != 1 {
		t.Fatalf("list through a follower: %v, %d leases", err, len(list.Msg.GetLeases()))
	}
	ev, err := admin.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.JobId}))
	if err != nil || len(ev.Msg.Rows) != 6 {
		t.Fatalf("evidence through a follower: %v, %d rows (want offer, ack and four renews)", err, len(ev.Msg.GetRows()))
	}
	if _, err := followers[0].AdminClients().Lease.GetPolicy(ctx, connect.NewRequest(&tetherv1.GetPolicyRequest{})); err != nil {
		t.Fatalf("policy on a follower: %v", err)
	}
	// The leader's refusals come back as it gave them.
	_, err = as(followers[0]).Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{LeaseId: l.LeaseId, LeaseGeneration: 1, RenewSequence: 9}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "job_id") {
		t.Fatalf("a malformed renew through a follower: %v, want InvalidArgument naming job_id", err)
	}
	stranger := register(t, admin, "stranger")
	_, err = followers[1].Clients(stranger.Credential).Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a stranger reading the lease through a follower: %v, want PermissionDenied (the leader re-checks the caller)", err)
	}

	// A stream relayed to the leader, then the leader goes.
	relay := as(followers[0]).Lease.Channel(ctx)
	defer relay.CloseResponse()
	if answer, err := channelRenew(relay, l, 4); err != nil || answer.GetDecision().GetOutcome() != tetherv1.Outcome_OUTCOME_ACCEPTED {
		t.Fatalf("renew on a relayed stream: %v %v", err, answer)
	}
	old, _ := election.Current(ctx)
	lead.Stop() // resigns: another replica takes over at once
	var next *testserver.Server
	testserver.WaitFor(t, replicaWait, "another replica to lead and serve", func() bool {
		for _, f := range followers {
			if serving, _ := f.Leases().Serving(); serving {
				next = f
				return true
			}
		}
		return false
	})
	if c, err := election.Current(ctx); err != nil || c.Identity == old.Identity {
		t.Fatalf("after the leader stopped the election names %+v (%v)", c, err)
	}
	// The relayed stream ends with Unavailable (its leader is gone); the
	// client reconnects, to any replica.
	for seq := uint64(5); ; seq++ {
		answer, err := channelRenew(relay, l, seq)
		if err != nil {
			if connect.CodeOf(err) != connect.CodeUnavailable {
				t.Fatalf("the relayed stream ended with %v, want Unavailable", err)
			}
			break
		}
		if answer.Error == "" {
			t.Fatalf("the relayed stream answered renew %d after its leader stopped: %v", seq, answer)
		}
	}
	// A new stream through either remaining replica (the new leader, and
	// the follower that forwards to it) renews the same lease.
	seq := uint64(10)
	for _, via := range followers {
		stream := as(via).Lease.Channel(ctx)
		answer, err := channelRenew(stream, l, seq)
		if err != nil || answer.Error != "" {
			t.Fatalf("renew on a new stream through %s: %v %q", via.URL, err, answer.GetError())
		}
		wantDecision(t, "renew after the takeover", answer.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
		seq++
	}
	got, err = as(next).Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
	if err != nil || got.Msg.Lease.RenewSequence != seq-1 || got.Msg.Lease.LeaseGeneration != 1 {
		t.Fatalf("the lease after the takeover: %v %v", err, got.Msg.GetLease())
	}
}

// A follower answers the point reads of the leases — GetLease and Evidence
// — from the store, without the leader: here the leader publishes an
// address nobody can reach, so everything the follower forwards fails with
// Unavailable (a renew, a list), while its reads answer at once what the
// leader answers, including a renew the leader acknowledged just before
// (the read is linearizable), and refuse a stranger exactly as the leader
// does.
func TestEtcdFollowerServesLeaseReadsWithoutTheLeader(t *testing.T) {
	cluster := etcdtest.Start(t)
	prefix := etcdtest.Prefix(t)
	open := func() *etcdstore.Etcd {
		return etcdtest.OpenStore(t, cluster, func(o *etcdstore.EtcdOptions) { o.Prefix = prefix })
	}
	unreachable := func(cfg *controlplane.Config) { cfg.Elector.(*leader.Etcd).Address = "http://127.0.0.1:1" }
	lead := testserver.Start(t, testserver.WithEtcdStore(open(), "replica-lead"), unreachable)
	testserver.WaitFor(t, replicaWait, "the first replica to lead and serve the leases", func() bool {
		serving, _ := lead.Leases().Serving()
		return serving
	})
	follower := testserver.Start(t, testserver.WithEtcdStore(open(), "replica-follower"))
	ctx := context.Background()

	admin := lead.AdminClients()
	root := register(t, admin, "owner")
	worker := spawn(t, lead.Clients(root.Credential), root.Node.NodeId, "worker")
	stranger := register(t, admin, "stranger")
	offer, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: worker.Node.NodeId, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l := offer.Msg.Lease
	onLead, onFollower := lead.Clients(worker.Credential), follower.Clients(worker.Credential)
	if _, err := onLead.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration})); err != nil {
		t.Fatal(err)
	}
	// The follower forwards what is judged, and cannot reach the leader.
	_, err = onFollower.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: 1}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a renew through the follower: %v, want Unavailable (its leader is unreachable)", err)
	}
	if _, err := follower.Clients(worker.Credential).Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a list through the follower: %v, want Unavailable (lists stay with the leader)", err)
	}

	for seq := uint64(1); seq <= 3; seq++ {
		resp, err := onLead.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: l.JobId, LeaseId: l.LeaseId, LeaseGeneration: l.LeaseGeneration, RenewSequence: seq}))
		if err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "renew on the leader", resp.Msg.Decision, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_RENEWED)
		// At once, no waiting: the follower's read sees the acknowledged
		// renew, and answers what the leader answers.
		got, err := onFollower.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
		if err != nil {
			t.Fatalf("get through the follower after renew %d: %v", seq, err)
		}
		want, err := onLead.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: l.JobId}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Msg.Lease.RenewSequence != seq || !proto.Equal(got.Msg.Lease, want.Msg.Lease) {
			t.Fatalf("after renew %d the follower reads %v, the leader %v", seq, got.Msg.Lease, want.Msg.Lease)
		}
	}
	for _, c := range []struct {
		who        string
		lead, here *testserver.Clients
	}{
		{"the holder", onLead, onFollower},
		{"an operator", admin, follower.Clients(lead.Admin)},
	} {
		want, err := c.lead.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.JobId, PageSize: 2}))
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.here.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.JobId, PageSize: 2}))
		if err != nil {
			t.Fatalf("evidence for %s through the follower: %v", c.who, err)
		}
		if !proto.Equal(got.Msg, want.Msg) || len(got.Msg.Rows) != 2 || got.Msg.NextPageToken == "" {
			t.Fatalf("evidence for %s: the follower answers %v, the leader %v", c.who, got.Msg, want.Msg)
		}
		rest, err := c.here.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: l.JobId, PageToken: got.Msg.NextPageToken}))
		if err != nil || len(rest.Msg.Rows) != 3 {
			t.Fatalf("the rest of the evidence for %s through the follower: %v, %d rows; want the three renews", c.who, err, len(rest.Msg.GetRows()))
		}
	}
	// Refusals are the leader's: a stranger, a job that does not exist,
	// a malformed id.
	for _, c := range []struct {
		what     string
		lead     *testserver.Clients
		follower *testserver.Clients
		job      string
	}{
		{"a stranger reading the lease", lead.Clients(stranger.Credential), follower.Clients(stranger.Credential), l.JobId},
		{"the holder reading a job that does not exist", onLead, onFollower, "job-nobody-offered"},
		{"an operator reading a job that does not exist", admin, follower.Clients(lead.Admin), "job-nobody-offered"},
		{"a malformed job id", onLead, onFollower, strings.Repeat("x", 4096)},
	} {
		_, want := c.lead.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: c.job}))
		_, got := c.follower.Lease.GetLease(ctx, connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: c.job}))
		if want == nil || connect.CodeOf(got) != connect.CodeOf(want) {
			t.Fatalf("%s: the follower answers %v, the leader %v", c.what, got, want)
		}
		_, want = c.lead.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: c.job}))
		_, got = c.follower.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: c.job}))
		if want == nil || connect.CodeOf(got) != connect.CodeOf(want) {
			t.Fatalf("%s, its evidence: the follower answers %v, the leader %v", c.what, got, want)
		}
	}
}
