//go:build linux

package mcpgate_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The thirty-eighth rogue pass against the MCP gateway (helper E).

// lingersTogether is a rogue stdio upstream, one of a few named by
// MCPGATE_ROGUE38E_NAME among MCPGATE_ROGUE38E_OF: it answers the
// gateway's handshake and its listing of one tool, then reads its input
// to its end, ignoring SIGTERM. At its input's end it creates the file
// eof-<name> in dir and stays until every one of the upstreams has
// (their inputs ended too), then creates all-<name> and exits. An
// upstream whose input ends only once it is gone (SIGKILL, one after
// the other) never creates its all- file.
func lingersTogether(dir string) {
	signal.Ignore(syscall.SIGTERM)
	name := os.Getenv("MCPGATE_ROGUE38E_NAME")
	of, _ := strconv.Atoi(os.Getenv("MCPGATE_ROGUE38E_OF"))
	in := bufio.NewReader(os.Stdin)
	answerHandshake(in, name, "put")
	_, _ = io.Copy(io.Discard, in)
	_ = os.WriteFile(filepath.Join(dir, "eof-"+name), nil, 0o600)
	for {
		ended, _ := filepath.Glob(filepath.Join(dir, "eof-*"))
		if len(ended) >= of {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(dir, "all-"+name), nil, 0o600)
	os.Exit(0)
}

// Rogue stdio upstreams cannot hold the gateway's Close, nor the reports
// it sends at its close, for the sum of their lingering. Closing a stdio
// upstream ends its input and gives its process the MCP SDK's 5 s to
// exit, then 5 s more after SIGTERM, then SIGKILL; the gateway closed its
// upstreams one after the other, so N upstreams that ignored their
// input's end and SIGTERM held Close for 10·N s, and the reports owed at
// the close (a revoked rogue's refusal after its claim of exit here) were
// sent only then: `tether mcp serve` stopped by a supervisor's SIGTERM
// with a grace shorter than that was killed with them unsent. The
// upstreams are now closed together (closeUpstreamsAtOnce at most), each
// one's input ended before any is waited for. (Fails, before that,
// because the upstreams, each waiting until every one's input has ended,
// were killed one by one, all but the last before the others' input
// ended: no all- file for them.)
func TestRogue38EStdioUpstreamsAreClosedTogetherAndTheCloseReportsStillSent(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := []string{"ra", "rb", "rc"}
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		for _, name := range names {
			c.Upstreams = append(c.Upstreams, mcpgate.Upstream{Name: name, Command: []string{exe}, Env: map[string]string{
				"MCPGATE_ROGUE38E_LINGERS": dir, "MCPGATE_ROGUE38E_NAME": name, "MCPGATE_ROGUE38E_OF": strconv.Itoa(len(names)),
			}})
		}
	})
	endpoint := serveGateway(t, gw)

	// A revoked rogue refused before its claim (reported then) and after
	// it, within its report's interval on the gateway's clock, which
	// stands: that report is sent at the close.
	revokeAtGateway(t, w, gw, token)
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping: %d; want 403", got)
	}
	claimAfterSessionEnd(t, w, self, credential)
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping after its claim: %d; want 403", got)
	}

	closeReturns(t, gw, "the gateway's Close with its lingering stdio upstreams")
	var killed []string
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dir, "all-"+name)); err != nil {
			killed = append(killed, name)
		}
	}
	if len(killed) > 0 {
		ended, _ := filepath.Glob(filepath.Join(dir, "eof-*"))
		t.Fatalf("upstreams %v were stopped before every upstream's input had ended (those ended: %d of %d): the gateway closed them one after the other, each waited for",
			killed, len(ended), len(names))
	}
	if got := nodeOf(t, w, self).Contradictions; len(got) == 0 {
		t.Fatal("the gateway closed its upstreams and never sent the rogue's refusal after its claim: the record reads its exit confirmed")
	}
}

// holdsUntilReleased is a rogue stdio upstream: it answers the gateway's
// handshake and its listing of one tool, then reads its input to its end
// (answering nothing: a call made to it stays in flight), ignoring
// SIGTERM. At its input's end it creates the file eof in dir and stays
// until the file release exists there, then creates released and exits.
func holdsUntilReleased(dir string) {
	signal.Ignore(syscall.SIGTERM)
	in := bufio.NewReader(os.Stdin)
	answerHandshake(in, "holds", "put")
	_, _ = io.Copy(io.Discard, in)
	_ = os.WriteFile(filepath.Join(dir, "eof"), nil, 0o600)
	for {
		if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(dir, "released"), nil, 0o600)
	os.Exit(0)
}

// A rogue stdio upstream cannot hold the reports the gateway owes at its
// close until its process is gone. Close waited for every upstream's
// process to exit (the MCP SDK's 5 s, 5 s more after SIGTERM, then
// SIGKILL) before it sent the reports owed: a `tether mcp serve` stopped
// by a supervisor that kills it within that time lost them, and the
// record read a revoked rogue's request after its claim of exit unseen.
// Those reports are now sent as the upstreams' processes are waited for.
// A call the gateway abandoned as it closed is recorded ended once its
// upstream's process is gone, as before, not sooner: the process may go
// on with the call until then. (Fails, before that, because the control
// plane did not hear of the rogue's refusal until the upstream, which
// waits for it, had been killed: it never saw its release; fails too if
// the call is recorded ended while the process is still there.)
func TestRogue38ECloseReportsDoNotWaitForAStdioUpstreamsExit(t *testing.T) {
	w := newWorld(t, "mcp:*")
	self, credential, token := rogueChild(t, w, time.Hour)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "holds", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE38E_HOLDS": dir}}}
	})
	t.Cleanup(func() { _ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o600) }) // should the test fail
	endpoint := serveGateway(t, gw)

	// The root agent's call in flight at the upstream, which never
	// answers it.
	cs := connectAgent(t, endpoint, w.grant.Token, nil)
	callCtx, leave := context.WithCancel(context.Background())
	t.Cleanup(leave)
	answered := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "put", Arguments: map[string]any{}})
		answered <- err
	}()
	openCalls := func() int {
		calls, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.agent.Node.NodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return len(calls.Msg.Calls)
	}
	testserver.WaitFor(t, guardWait, "the call to be begun", func() bool {
		select {
		case err := <-answered:
			t.Fatalf("the call to the upstream that never answers was answered: %v", err)
		default:
		}
		return openCalls() == 1
	})

	// A revoked rogue refused after its claim, within its report's
	// interval on the gateway's clock (which stands): reported at the
	// close.
	revokeAtGateway(t, w, gw, token)
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping: %d; want 403", got)
	}
	claimAfterSessionEnd(t, w, self, credential)
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping after its claim: %d; want 403", got)
	}

	done := make(chan struct{})
	go func() { gw.Close(); close(done) }()
	testserver.WaitFor(t, guardWait, "the close reports to land, or the gateway's Close to return", func() bool {
		if _, err := os.Stat(filepath.Join(dir, "eof")); err == nil && !closed(done) && openCalls() == 0 {
			t.Fatal("the call was recorded ended while its stdio upstream's process, which may go on with it, was still there")
		}
		return closed(done) || len(nodeOf(t, w, self).Contradictions) > 0
	})
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	recv(t, done, "the gateway's Close")
	if _, err := os.Stat(filepath.Join(dir, "released")); err != nil {
		t.Fatalf("the upstream was killed before the gateway's close reports landed (the rogue's contradictions: %v): they waited for the upstream's exit",
			nodeOf(t, w, self).Contradictions)
	}
	if got := openCalls(); got != 0 {
		t.Fatalf("the call abandoned at the gateway's close is still open in the ledger once Close returned (%d open)", got)
	}
}

// The same over stdio: a rogue stdio upstream that pinged the gateway far
// more often than its input pipe holds the answers of, and read none of
// them, had the gateway hold two goroutines (the SDK's handler, the
// write) and a timer for each answer past the pipe's, until the first
// write's ConnectTimeout ended the connection (for ever on a clock that
// does not move). The answers past MaxAnswersInFlight are now left
// unwritten, logged. (Fails, before that, by its guard: nothing is
// logged.)
func TestRogue38EStdioUpstreamCannotHaveTheGatewayHoldAnyNumberOfAnswers(t *testing.T) {
	w := newWorld(t, "mcp:*")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "full")
	logs := &logBuffer{}
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, func(c *mcpgate.Config) {
		c.Upstreams = []mcpgate.Upstream{{Name: "pings", Command: []string{exe}, Env: map[string]string{"MCPGATE_ROGUE37E_PINGS": marker}}}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	testserver.WaitFor(t, guardWait, "the gateway to be blocked writing its answers to the upstream", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	testserver.WaitFor(t, guardWait, "the gateway to leave the upstream's requests past its answers in flight unanswered", func() bool {
		return strings.Contains(logs.String(), "left unanswered")
	})
	closeReturns(t, gw, "the gateway's Close")
}
