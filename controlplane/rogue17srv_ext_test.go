package controlplane_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// The seventeenth hostile pass on the server's resources.
//
// TestARoguesTerminationWatchesDoNotSlowEveryCommit: every WatchTermination
// stream opened a store watch of its own, and the store hands each commit's
// events to every open watch in turn (Badger: in the committer, under the
// hub's lock, before the commit's callers are answered; etcd: an etcd
// watch and a revision read each). An agent may watch the terminations it
// requested, so a rogue that stopped its own child with a day's window and
// then opened its lineage's whole share of streams on that one termination
// (5,000 by default) made every commit of the server — any tree's
// heartbeat, renewal, spawn — pay for 5,000 watches, for one request per
// stream. The supervisor now follows every termination with one store
// watch and hands each stream its termination's changes: the store's open
// watches do not grow with the streams, and each stream still gets every
// change of its termination, to its end.

// TestAToolServerTokenIsListedAndRevocableByItsID: every token minted
// through CreateToken is recorded, so that `tether token list` shows it and
// `tether token revoke ID` stops it — except a tool server's, which was
// minted unrecorded. Whoever held an admin token (a leaked one, before its
// rotation) could mint a tool-server token for a year under the name of a
// real gate — reporting that gate's calls ended or acknowledged, relaying
// agents' tokens, reading jobs' leases — and the recovery the README
// prescribes (rotate the admin token, then list what it minted and revoke
// those) found nothing: the token survived until its expiry or a rotation
// of the signing keys, unless someone still held its value. A tool
// server's token is now recorded like any other: listed (principal
// tool:<name>, kind tool, who minted it), revocable by its id, refused on
// its next call and its open streams ended.

// TestAnIPv6ClientCannotSpreadItsRequestsWithoutACredentialOverItsAddresses:
// the requests that carry no valid credential are bounded per source
// address (--anonymous-rate-limit), which is what keeps a flood of forged
// tokens from costing a signature verification each. An IPv6 client is
// given a /64 at least — 2^64 addresses it may send from — so keyed by the
// whole address the bound was none: each new address came with a fresh
// burst, and left a budget in the server's memory for a minute. An IPv6
// source is now budgeted by its /64 (an IPv4 one still by its address),
// and the refusal names the block.

// TestARogueCannotBuyTheDecodingOfALargeRequestForOneRequest: a request
// cost its caller one request of its budget whatever its size, up to
// --max-request-bytes (1 MiB), and the server decodes the whole message
// before a handler sees it: a Spawn of 100,000 labels took about 100 ms of
// CPU to decode and refuse, 1.5 KiB of gzip inflating to 1 MiB of one
// label repeated about 70 ms, where a small spawn costs under one (an
// agent so spent the server's CPU a hundred times faster than its budget
// said). A request's body now costs a request per 4 KiB past its first 4
// KiB, charged as it is read and before any of it is decoded, and a
// compressed one what a body of --max-request-bytes would, up front: the
// rogue's large request is refused from its lineage's budget, which it
// spent, and its next call waits for the budget to refill.

// storeWatches returns how many watches the server's store holds open.
func storeWatches(t *testing.T, srv *testserver.Server) int {
	t.Helper()
	counter, ok := srv.Store().(interface{ Watches() int })
	if !ok {
		t.Fatalf("the store %T does not count its watches", srv.Store())
	}
	return counter.Watches()
}

// TestARoguesTerminationWatchesDoNotSlowEveryCommit: see the file's header.
func TestARoguesTerminationWatchesDoNotSlowEveryCommit(t *testing.T) {
	const streams = 40
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) {
		cfg.Conn.MaxStreamsPerCaller = streams + 8
		cfg.Conn.MaxStreamsPerLineage = streams + 8
	})
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rogueC := srv.Clients(rogue.Credential)
	child := spawn(t, rogueC, rogue.Node.NodeId, "child")
	term := terminate(t, rogueC, child.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, 24*time.Hour, 24*time.Hour, 24*time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING) // waiting a day for the child's exit

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	// One watch of the operator's first, so that whatever the server
	// keeps for watching terminations at all is counted in the baseline.
	opStream, err := admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
	if err != nil || !opStream.Receive() {
		t.Fatalf("the operator's watch of %s: %v %v", term.TerminationId, err, opStream.Err())
	}
	defer opStream.Close()
	before := storeWatches(t, srv)

	type watch = *connect.ServerStreamForClient[tetherv1.WatchTerminationResponse]
	var watches []watch
	defer func() {
		for _, w := range watches {
			_ = w.Close()
		}
	}()
	for i := range streams {
		w, err := rogueC.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
		if err != nil {
			t.Fatalf("the rogue's watch %d: %v", i, err)
		}
		if !w.Receive() { // the first message: the stream is admitted and watching
			t.Fatalf("the rogue's watch %d: %v", i, w.Err())
		}
		watches = append(watches, w)
	}
	if got := storeWatches(t, srv); got > before {
		t.Fatalf("the rogue's %d watches of its own termination hold %d more store watches open (%d, from %d): every commit of the server pays for each", streams, got-before, got, before)
	}

	// Each stream still follows its termination to its end: the child's
	// exit, attested by its launcher, lets the drain finish.
	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: child.Node.NodeId, Reason: "the launcher saw it exit"})); err != nil {
		t.Fatalf("the launcher's confirmation of the child's exit: %v", err)
	}
	clk.Advance(time.Second)
	for i, w := range append([]watch{opStream}, watches...) {
		var last *tetherv1.Termination
		for w.Receive() {
			last = w.Msg().Termination
		}
		if err := w.Err(); err != nil {
			t.Fatalf("watch %d ended with %v", i, err)
		}
		if last.GetState() != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
			t.Fatalf("watch %d ended at %v, want its termination's end", i, last.GetState())
		}
	}
	testserver.WaitFor(t, 20*time.Second, "the store's watches to close with the streams", func() bool {
		return storeWatches(t, srv) < before
	})
}

// TestATerminationWatchSurvivesALaggedStoreWatch: the streams share the
// supervisor's one store watch of the terminations, so when that watch
// falls behind it is established again and each stream reads its
// termination afresh: a change made while it was down (here the exit
// confirmation the termination waits for) still reaches the watching
// stream, which ends with the termination's end, not with the lag.
func TestATerminationWatchSurvivesALaggedStoreWatch(t *testing.T) {
	b, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // after the server stops (cleanups run last-in first-out)
	st := &laggingStore{Store: b}
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.Store = st })
	admin := srv.AdminClients()
	root := register(t, admin, "worker")
	term := terminate(t, admin, root.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Minute, time.Hour)
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against a hang, not a timing
	defer cancel()
	watch, err := admin.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: term.TerminationId}))
	if err != nil || !watch.Receive() {
		t.Fatalf("the watch of %s: %v %v", term.TerminationId, err, watch.Err())
	}
	defer watch.Close()
	release := st.hold("supervisor.(*terminationWatches).follow") // the watch stays down until released
	if n := st.lag("supervisor.(*terminationWatches)"); n != 1 {
		t.Fatalf("lagged %d store watches of the terminations' streams, want their one", n)
	}
	if _, err := admin.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: root.Node.NodeId})); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	release()
	var last *tetherv1.Termination
	for watch.Receive() {
		last = watch.Msg().Termination
	}
	if err := watch.Err(); err != nil {
		t.Fatalf("the watch ended with %v, want the termination's end", err)
	}
	if last.GetState() != tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
		t.Fatalf("the watch ended at %v, want TERMINATED", last.GetState())
	}
}

// TestAToolServerTokenIsListedAndRevocableByItsID: see the file's header.
func TestAToolServerTokenIsListedAndRevocableByItsID(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	minted, err := admin.Auth.CreateToken(ctx, connect.NewRequest(&tetherv1.CreateTokenRequest{ToolServer: "shell-gate", Ttl: durationpb.New(controlplane.MaxOperatorTokenTTL)}))
	if err != nil {
		t.Fatal(err)
	}
	gate := srv.Clients(minted.Msg.Token)
	if err := whoAmI(gate); err != nil {
		t.Fatalf("the tool server's first call: %v", err)
	}

	info, ok := listTokens(t, admin, false)[minted.Msg.TokenId]
	if !ok {
		t.Fatalf("tether token list does not show the tool-server token %s the admin minted: nobody can find it to revoke it", minted.Msg.TokenId)
	}
	if info.Principal != "tool:shell-gate" || info.Kind != "tool" || info.CreatedBy != "operator:admin" || info.Role != tetherv1.Role_ROLE_UNSPECIFIED ||
		!info.ExpiresAt.AsTime().Equal(minted.Msg.ExpiresAt.AsTime()) {
		t.Fatalf("the tool-server token is listed as %v, want principal tool:shell-gate, kind tool, no role, created by operator:admin, expiring %s", info, minted.Msg.ExpiresAt.AsTime())
	}

	resp, err := admin.Auth.RevokeToken(ctx, connect.NewRequest(&tetherv1.RevokeTokenRequest{TokenId: minted.Msg.TokenId, Reason: "minted with the leaked admin token"}))
	if err != nil {
		t.Fatalf("revoking the tool-server token by its id: %v", err)
	}
	if resp.Msg.AlreadyRevoked || resp.Msg.Token.GetPrincipal() != "tool:shell-gate" {
		t.Fatalf("the revocation answered %v", resp.Msg)
	}
	wantLimit(t, "the revoked tool server's next call", whoAmI(gate), connect.CodeUnauthenticated, "revoked")
	if info := listTokens(t, admin, true)[minted.Msg.TokenId]; info.GetRevokedAt() == nil || info.RevokedBy != "operator:admin" {
		t.Fatalf("the revoked tool-server token is listed as %v, want revoked by operator:admin", info)
	}
}

// posingListener gives each connection it accepts the source address
// pose holds at that moment, as if the client had dialled from there.
type posingListener struct {
	net.Listener
	pose atomic.Pointer[net.TCPAddr]
}

func (l *posingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if a := l.pose.Load(); a != nil {
		return posingConn{Conn: c, remote: a}, nil
	}
	return c, nil
}

type posingConn struct {
	net.Conn
	remote net.Addr
}

func (c posingConn) RemoteAddr() net.Addr { return c.remote }

// TestAnIPv6ClientCannotSpreadItsRequestsWithoutACredentialOverItsAddresses:
// see the file's header.
func TestAnIPv6ClientCannotSpreadItsRequestsWithoutACredentialOverItsAddresses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	posing := &posingListener{Listener: ln}
	clk := clock.NewManual(epoch)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := controlplane.New(ctx, controlplane.Config{DataDir: t.TempDir(), Listen: ln.Addr().String(), Clock: clk, AnonymousRateLimit: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, posing) }()
	t.Cleanup(func() { cancel(); <-done; _ = srv.Close() })

	// from sends one request with a forged credential from addr, on a
	// connection of its own.
	from := func(addr string) error {
		posing.pose.Store(&net.TCPAddr{IP: net.ParseIP(addr), Port: 40000})
		return whoAmI(testserver.NewClients(testserver.H2CClient(), "http://"+ln.Addr().String(), "forged"))
	}
	// The burst of 2 from one /64, each request from another address.
	for _, addr := range []string{"2001:db8:1:2::a", "2001:db8:1:2:ffff:ffff:ffff:fffe"} {
		if err := from(addr); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("a forged credential from %s within the burst: %v, want unauthenticated", addr, err)
		}
	}
	wantLimit(t, "a third forged credential from the same /64, from yet another address", from("2001:db8:1:2::c"),
		connect.CodeResourceExhausted, "without a valid credential from 2001:db8:1:2::/64")
	// Another /64 has its own budget, and IPv4 sources are still each their
	// own (a /24 is many subscribers).
	for _, addr := range []string{"2001:db8:1:3::a", "192.0.2.1", "192.0.2.1", "192.0.2.2"} {
		if err := from(addr); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("a forged credential from %s, whose budget is its own: %v, want unauthenticated", addr, err)
		}
	}
	wantLimit(t, "a third forged credential from 192.0.2.1", from("192.0.2.1"), connect.CodeResourceExhausted, "without a valid credential from 192.0.2.1 exceeded")
}

// TestARogueCannotBuyTheDecodingOfALargeRequestForOneRequest: see the
// file's header.
func TestARogueCannotBuyTheDecodingOfALargeRequestForOneRequest(t *testing.T) {
	const rate = 50 // bursts of 100: less than a 1 MiB body's price
	clk := clock.NewManual(epoch)
	srv := testserver.Start(t, testserver.WithClock(clk), func(cfg *controlplane.Config) { cfg.RateLimit = rate })
	rogue := register(t, srv.AdminClients(), "rogue")
	rogueC := srv.Clients(rogue.Credential)
	ctx := context.Background()

	// post sends a Spawn's bytes as the Connect protocol does, compressed
	// or not, and returns the refusal.
	post := func(body []byte, encoding string) error {
		req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+tetherv1connect.AgentServiceSpawnProcedure, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/proto")
		req.Header.Set("Authorization", "Bearer "+rogue.Credential)
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		var e struct{ Code, Message string }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("the answer %d %q", resp.StatusCode, raw)
		}
		code := connect.CodeUnknown
		_ = code.UnmarshalText([]byte(e.Code))
		return connect.NewError(code, errors.New(e.Message))
	}
	labels := map[string]string{}
	for i := range 100_000 {
		labels[fmt.Sprintf("%x", i)] = ""
	}
	big, err := proto.Marshal(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "child", Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	err = post(big, "")
	wantLimit(t, "a Spawn of 100,000 labels (1 MiB) from a lineage with a burst of 100 requests", err, connect.CodeResourceExhausted,
		"costs a request per 4096 bytes", "lineage "+rogue.Node.NodeId)
	// The budget went on the body's first bytes: the rogue's next call waits.
	wantLimit(t, "the rogue's next call", whoAmI(rogueC), connect.CodeResourceExhausted, "lineage "+rogue.Node.NodeId)

	clk.Advance(time.Minute) // the budget refills
	// A few KiB of gzip that inflate to 1 MiB of one label repeated cost
	// what 1 MiB does, before they are inflated.
	entry, err := proto.Marshal(&tetherv1.SpawnRequest{Labels: map[string]string{"a": ""}})
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(bytes.Repeat(entry, (1<<20-64)/len(entry)))
	_ = zw.Close()
	wantLimit(t, fmt.Sprintf("%d bytes of gzip inflating to 1 MiB of one label", gz.Len()), post(gz.Bytes(), "gzip"), connect.CodeResourceExhausted,
		"a compressed request may inflate to", "lineage "+rogue.Node.NodeId)

	// An ordinary spawn, and one near the labels' bound, cost what they
	// did: the price is the budget, not a ban.
	if _, err := rogueC.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "child"})); err != nil {
		t.Fatalf("an ordinary spawn: %v", err)
	}
	full := map[string]string{}
	for i := range 32 {
		full[fmt.Sprintf("k%02d%s", i, strings.Repeat("k", 59))] = strings.Repeat("v", 63)
	}
	if _, err := rogueC.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogue.Node.NodeId, Name: "labelled", Labels: full})); err != nil {
		t.Fatalf("a spawn with 32 full labels (about 4 KiB): %v", err)
	}
}
