package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The fifth rogue pass: combinations the first four did not try. Each test
// plays one rogue through the real server (Badger on disk, HTTP/2, real
// JWTs, the manual clock).

// spendLineage has the rogue call GetNode on itself until its lineage's
// rate budget is spent (the manual clock refills nothing meanwhile).
func spendLineage(t *testing.T, rogue *testserver.Clients, self string) {
	t.Helper()
	for range 256 {
		_, err := rogue.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: self}))
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("the lineage's budget never ran out; the probe tests nothing")
}

// A rogue spends the rate budget its lineage shares (its root and every
// descendant share one, so that spawning children buys nothing) while its
// sibling works a lease and is then drained by the operator. The budget
// bounds what a lineage asks of the server; it must not let one member
// silence another's upkeep: were the sibling's heartbeat, renewals,
// completion and exit confirmation refused, its lease would lapse (a job
// frozen by a stranger to it), and the operator's drain would wait its
// whole window for an exit already done and record the sibling
// unaccounted. Each node has a small reserve of its own for that upkeep:
// the sibling's go through, and the rogue, its budget spent, gets nothing
// more for anything else.
func TestARogueThatSpendsItsLineagesBudgetCannotSilenceItsSiblingsUpkeep(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit, cfg.RateBurst = 1, 16 })
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "planner")
	rootC := srv.Clients(root.Credential)
	honest := spawn(t, rootC, root.Node.NodeId, "honest")
	rogue := spawn(t, rootC, root.Node.NodeId, "rogue")
	honestC, rogueC := srv.Clients(honest.Credential), srv.Clients(rogue.Credential)
	self := honest.Node.NodeId

	sess, err := openSession(t, honestC, self)
	if err != nil {
		t.Fatal(err)
	}
	offered, err := admin.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{JobId: "job-1", HolderIdentity: self, LeaseDuration: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := unary{honestC}.send(t, ack(offered.Msg.Lease))
	channel := openChannel(t, honestC)

	spendLineage(t, rogueC, rogue.Node.NodeId)
	if _, err := rogueC.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: rogue.Node.NodeId})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's next call: %v, want resource_exhausted (its reserve is for upkeep only)", err)
	}

	if err := sess.heartbeat(); err != nil {
		t.Fatalf("the sibling's heartbeat once the rogue spent the lineage's budget: %v", err)
	}
	if _, _, errText := (unary{honestC}).try(t, renew(l, 1)); errText != "" {
		t.Fatalf("the sibling's renew once the rogue spent the lineage's budget: %s", errText)
	}
	if _, _, errText := channel.try(t, renew(l, 2)); errText != "" {
		t.Fatalf("the sibling's renew on its lease channel once the rogue spent the lineage's budget: %s", errText)
	}
	term := terminate(t, admin, self, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	if _, _, errText := (unary{honestC}).try(t, complete(l, tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS)); errText != "" {
		t.Fatalf("the sibling's completion: %s", errText)
	}
	if _, err := honestC.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: self, Reason: "drained"})); err != nil {
		t.Fatalf("the drained sibling's exit confirmation once the rogue spent the lineage's budget: %v", err)
	}
	if n := getNode(t, admin, self); n.ExitConfirmedBy == "" {
		t.Fatalf("the sibling's exit is not confirmed: %v", n)
	}
	// The drain does not wait out its hour for an exit already confirmed.
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
}

// A rogue with a valid credential pads the headers of its requests: a
// stream it holds open keeps its headers for as long as it lives, and an
// agent may hold 256 streams, each of its children 256 more. Headers are
// bounded well below Go's default megabyte (a credential is at most 8 KiB):
// 512 KiB of padding is refused, over HTTP/1.1 with 431 before any handler
// runs and over HTTP/2 by the limit the server advertises; 16 KiB passes.
func TestARogueThatPadsItsHeadersIsRefused(t *testing.T) {
	srv := testserver.Start(t, testserver.WithClock(clock.NewManual(epoch)))
	root := register(t, srv.AdminClients(), "padder")
	ctx := context.Background()
	call := func(pad int) error {
		req := connect.NewRequest(&tetherv1.WhoAmIRequest{})
		req.Header().Set("X-Pad", strings.Repeat("a", pad))
		_, err := srv.Clients(root.Credential).Auth.WhoAmI(ctx, req)
		return err
	}
	if err := call(16 << 10); err != nil {
		t.Fatalf("a request with 16 KiB of headers: %v", err)
	}
	if err := call(512 << 10); err == nil {
		t.Fatal("HTTP/2: a request with 512 KiB of headers was served")
	}
	http1 := func(pad int) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/tether.v1.AuthService/WhoAmI", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+root.Credential)
		req.Header.Set("X-Pad", strings.Repeat("a", pad))
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := http1(16 << 10); got != http.StatusOK {
		t.Fatalf("HTTP/1.1 with 16 KiB of headers: %d, want 200", got)
	}
	if got := http1(512 << 10); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("HTTP/1.1 with 512 KiB of headers: %d, want 431", got)
	}
}

// A rogue spawns a chain of descendants (it holds every credential), and
// once the operator drains the chain, has the deepest node and seven of its
// ancestors claim its exit: eight parties, the number of confirmations a
// node keeps. The launcher, which watched the process and attests its exit
// from outside, must still be heard: its attestation was dropped for want
// of room, so the workload's own words crowded out the only evidence from
// outside and the node could only be recorded unaccounted. The workload's
// claims have their room, and an operator's attestations theirs.
func TestARogueThatFillsAnExitsConfirmationsCannotCrowdOutTheLauncher(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk))
	admin := srv.AdminClients()
	ctx := context.Background()
	root := register(t, admin, "rogue")
	parent := root.Node.NodeId
	parentC := srv.Clients(root.Credential)
	var chain []*testserver.Clients
	var ids []string
	for i := range 8 {
		c := spawn(t, parentC, parent, fmt.Sprintf("link-%d", i))
		parent, parentC = c.Node.NodeId, srv.Clients(c.Credential)
		chain, ids = append(chain, parentC), append(ids, parent)
	}
	deepest := ids[len(ids)-1]
	term := terminate(t, admin, ids[0], tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Minute, time.Minute, time.Minute)
	for i, c := range chain {
		if _, err := c.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: deepest, Reason: fmt.Sprintf("claim %d", i)})); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: deepest, Reason: "process exited"})); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, admin, deepest)
	attested := false
	for _, c := range n.ExitConfirmations {
		attested = attested || c.Kind == "launcher"
	}
	if !attested {
		t.Fatalf("the launcher's attestation was not kept beside the workload's %d claims: %v", len(n.ExitConfirmations), n.ExitConfirmations)
	}
	for _, id := range ids[:len(ids)-1] {
		if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: id, Reason: "process exited"})); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	clk.Advance(2 * time.Minute)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	if got := nodeOutcomes(record(t, admin, term.TerminationId))[deepest]; got != tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED {
		t.Fatalf("the deepest node in the record: %v, want confirmed on the launcher's attestation", got)
	}
}

// A rogue fills its node's privilege slots with privileges of its own
// making before its operator registers the one that matters (a credential
// the operator handed it, with the hook that revokes it). The operator's
// registration must not be refused for room the agent took: a privilege
// never registered is never revoked when the agent is stopped. An agent's
// registrations and an operator's count apart against the bound.
func TestARogueThatFillsItsPrivilegeSlotsCannotKeepItsOperatorsOut(t *testing.T) {
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), testserver.AllowPrivilegeHooks("127.0.0.1"),
		func(cfg *controlplane.Config) { cfg.PrivilegeMaxPerNode = 3 })
	admin := srv.AdminClients()
	agent := register(t, admin, "rogue")
	self := agent.Node.NodeId
	rogue := srv.Clients(agent.Credential)
	ctx := context.Background()
	expires := clk.Now().Add(time.Hour)
	for i := range 3 {
		if err := registerPrivilege(ctx, rogue, self, fmt.Sprintf("junk-%d", i), "http://127.0.0.1:1/revoke", expires); err != nil {
			t.Fatal(err)
		}
	}
	if err := registerPrivilege(ctx, rogue, self, "junk-3", "http://127.0.0.1:1/revoke", expires); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the rogue's fourth privilege: %v, want resource_exhausted", err)
	}
	if err := registerPrivilege(ctx, admin, self, "db-credential", "http://127.0.0.1:1/revoke", expires); err != nil {
		t.Fatalf("the operator's privilege for the node whose slots the agent filled: %v", err)
	}
	for i := range 2 {
		if err := registerPrivilege(ctx, admin, self, fmt.Sprintf("op-%d", i), "http://127.0.0.1:1/revoke", expires); err != nil {
			t.Fatal(err)
		}
	}
	if err := registerPrivilege(ctx, admin, self, "op-2", "http://127.0.0.1:1/revoke", expires); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("the operator's fourth privilege: %v, want resource_exhausted (operators have their own bound)", err)
	}
}
