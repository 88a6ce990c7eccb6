package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-first hostile pass over the control plane's server and
// supervisor: a rogue agent holding a valid credential for its own node,
// against the real server.

// delegateMany has c delegate n grants from parent to holder, from a few
// callers at once, and returns their ids.
func delegateMany(t *testing.T, c *testserver.Clients, parent held, holder string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for w := range callers {
		wg.Go(func() {
			for i := w; i < n; i += callers {
				resp, err := c.Capability.Delegate(context.Background(), connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: parent.grant.GrantId, HolderNodeId: holder, Scopes: []string{"tool:shell"}}))
				if err != nil {
					errs <- fmt.Errorf("delegation %d: %w", i, err)
					return
				}
				ids[i] = resp.Msg.Grant.GrantId
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ids
}

// TestARogueHoldingManyGrantsCannotMakeItsStopUnrecordable: an agent may
// delegate many grants to its children (a request each). A
// termination listed every grant a chunk's members hold in one transaction
// twice over: the revocation's held index, and the record's part for the
// chunk (each grant as a privilege, and on the node's entry). Past the
// store's transaction bound both failed "transaction too large", and the
// termination retried the step for ever: the rogue's stop was never
// recorded and its operator read it revoking. Here Badger runs with its
// smallest memtable (8 MiB: transactions of about 1.2 MB), so ten thousand
// grants pass the bound that about eighty thousand pass at the default 64
// MiB. Seen failing before the change (the termination stayed in its
// revocation). The termination must be recorded, with every grant revoked
// and listed once.
func TestARogueHoldingManyGrantsCannotMakeItsStopUnrecordable(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = b })
	admin := srv.AdminClients()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	g := issueRoot(t, admin, rogueNode.Node.NodeId, 24*time.Hour, "tool:*")
	// Forty children of 250 grants each (a node holds at most 256 live
	// grants delegated by agents, --grant-max-per-node), all in one chunk.
	const n, holders = 10_000, 40
	var grants []string
	holderOf := map[string]bool{}
	var children []string
	for i := range holders {
		child := spawn(t, rogue, rogueNode.Node.NodeId, fmt.Sprintf("holder-%d", i))
		children = append(children, child.Node.NodeId)
		holderOf[child.Node.NodeId] = true
		grants = append(grants, delegateMany(t, rogue, g, child.Node.NodeId, n/holders)...)
	}

	term := terminate(t, admin, rogueNode.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second).TerminationId
	testserver.WaitFor(t, 5*time.Minute, "the rogue's termination to be recorded", func() bool { // a guard against a hang, not a timing
		clk.Advance(time.Second)
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	listed := recordGrants(t, admin, term, 500)
	for _, id := range grants {
		p, ok := listed[id]
		switch {
		case !ok:
			t.Fatalf("grant %s is not in the record", id)
		case p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED || !holderOf[p.NodeId]:
			t.Fatalf("grant %s is %v held by %s in the record, want revoked, held by a holder", id, p.Outcome, p.NodeId)
		}
	}
	// The children's grants and the rogue's root grant.
	if len(listed) != n+1 {
		t.Fatalf("the record lists %d grants, want the holders' %d and the rogue's 1", len(listed), n)
	}
	// Every grant is revoked in the store too.
	seen := 0
	for _, child := range children {
		for _, gr := range allGrants(t, admin, &tetherv1.ListGrantsRequest{HolderNodeId: child, PageSize: 1000}) {
			seen++
			if gr.State != tetherv1.GrantState_GRANT_STATE_REVOKED {
				t.Fatalf("grant %s is %v after its holder's termination, want revoked", gr.GrantId, gr.State)
			}
		}
	}
	if seen != n {
		t.Fatalf("the holders hold %d grants, want %d", seen, n)
	}
}

// recordGrants reads a termination's record page by page (pageSize rows a
// page) and returns its grants (privileges of kind "grant") by id, failing
// the test on a grant listed twice.
func recordGrants(t *testing.T, admin *testserver.Clients, term string, pageSize int32) map[string]*tetherv1.RecordPrivilege {
	t.Helper()
	listed := map[string]*tetherv1.RecordPrivilege{}
	token := ""
	for {
		resp, err := admin.Supervisor.GetRecord(context.Background(), connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term, PageSize: pageSize, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Msg.Record.Privileges {
			if p.Kind != "grant" {
				continue
			}
			if _, dup := listed[p.PrivilegeId]; dup {
				t.Fatalf("grant %s listed twice in the record", p.PrivilegeId)
			}
			listed[p.PrivilegeId] = p
		}
		if token = resp.Msg.NextPageToken; token == "" {
			return listed
		}
	}
}

// TestARogueWhoseChildrenFillTheirPrivilegeSlotsCannotMakeItsStopUnrecordable:
// a node holds at most 64 live privileges of its agents' registering, but a
// chunk of the record (up to a thousand nodes) listed, and decided, every
// privilege of its members in its one transaction: a rogue whose children
// each filled their slots made that transaction pass the store's bound and
// the termination retried it for ever. Here Badger runs with its smallest
// memtable (8 MiB: transactions of about 1.2 MB), so 80 children do what
// some 600 do at the default 64 MiB (and a thousand, a whole default
// chunk, at 64 each, pass it at any size). Seen failing before the change
// (the termination never recorded). The record must list every privilege
// once, revoked.
func TestARogueWhoseChildrenFillTheirPrivilegeSlotsCannotMakeItsStopUnrecordable(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	var revoked atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		revoked.Add(1)
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"), func(cfg *controlplane.Config) { cfg.Store = b })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	const children, slots = 80, 64
	specs := make([]*tetherv1.SpawnBatchChild, children)
	for i := range specs {
		specs[i] = &tetherv1.SpawnBatchChild{Name: fmt.Sprintf("child-%02d", i)}
	}
	batch, err := rogue.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: rogueNode.Node.NodeId, Children: specs}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, children)
	for _, child := range batch.Msg.Spawned {
		c := srv.Clients(child.Credential)
		wg.Go(func() {
			for i := range slots {
				resp, err := c.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
					NodeId: child.Node.NodeId, Kind: "lock", ExternalId: fmt.Sprintf("%s-%02d-%s", child.Node.NodeId, i, strings.Repeat("x", 200)),
					ExpiresAt: timestamppb.New(epoch.Add(time.Hour)), RevokeUrl: hook.URL + "/revoke",
				}))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				want[resp.Msg.PrivilegeId] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	term := terminate(t, admin, rogueNode.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, time.Second, time.Second).TerminationId
	testserver.WaitFor(t, 5*time.Minute, "the rogue's termination to be recorded", func() bool { // a guard against a hang, not a timing
		if revoked.Load() >= int64(len(want)) { // the clock moves once every hook answered, so none runs past its deadline
			clk.Advance(time.Second)
		}
		return getTermination(t, admin, term).State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED
	})
	seen := map[string]int{}
	token := ""
	for {
		resp, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term, PageSize: 500, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Msg.Record.Privileges {
			if p.Kind == "grant" {
				continue
			}
			seen[p.PrivilegeId]++
			if p.Outcome != tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED {
				t.Fatalf("privilege %s is %v in the record, want revoked", p.PrivilegeId, p.Outcome)
			}
		}
		if token = resp.Msg.NextPageToken; token == "" {
			break
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Fatalf("privilege %s is in the record %d times, want once", id, seen[id])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("the record lists %d privileges, the children registered %d", len(seen), len(want))
	}
}

// TestARogueCannotGrowItsPrivilegeListByLettingThemExpire: the bound on a
// node's privileges was on its live ones, and an expired one stayed listed
// for the node until a termination decided it: a rogue registering
// privileges that expire a second later could list any number on its node,
// each read again by its every registration and by its termination, and
// listed whole by ListPrivileges. Seen failing before the change (the
// node listed every privilege it ever registered). A registration now keeps
// only the newest 64 expired ones of its registrant's (as many as live).
func TestARogueCannotGrowItsPrivilegeListByLettingThemExpire(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "ops")
	rootC := srv.Clients(root.Credential)
	rogueNode := spawn(t, rootC, root.Node.NodeId, "rogue")
	rogue := srv.Clients(rogueNode.Credential)
	const rounds, slots = 4, 64
	for r := range rounds {
		for i := range slots {
			if _, err := rogue.Supervisor.RegisterPrivilege(ctx, connect.NewRequest(&tetherv1.RegisterPrivilegeRequest{
				NodeId: rogueNode.Node.NodeId, Kind: "lock", ExternalId: fmt.Sprintf("lock-%d-%02d", r, i),
				ExpiresAt: timestamppb.New(clk.Now().Add(time.Second)), RevokeUrl: "http://127.0.0.1:1/revoke",
			})); err != nil {
				t.Fatalf("round %d, privilege %d: %v", r, i, err)
			}
		}
		clk.Advance(2 * time.Second) // every privilege of the round expires
	}
	resp, err := admin.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: rogueNode.Node.NodeId}))
	if err != nil {
		t.Fatal(err)
	}
	// The last round's 64 and, at most, the 64 newest before them.
	if got := len(resp.Msg.Privileges); got > 2*slots {
		t.Fatalf("the rogue's node lists %d privileges after registering %d that expired, want at most %d", got, rounds*slots, 2*slots)
	}
	newest := map[string]bool{}
	for _, p := range resp.Msg.Privileges {
		newest[p.ExternalId] = true
	}
	for i := range slots {
		if id := fmt.Sprintf("lock-%d-%02d", rounds-1, i); !newest[id] {
			t.Fatalf("the newest privilege %s is not listed", id)
		}
	}
}
