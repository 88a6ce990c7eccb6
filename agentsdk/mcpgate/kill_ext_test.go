package mcpgate_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The gateway is killed (kill -9) with a call in flight: nobody
// acknowledges the abort's cancel order, and the record shows the call
// unresolved (cancel_unacknowledged), never completed.
func TestGatewayKilledMidCallLeavesTheCallUnresolved(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	credential := filepath.Join(t.TempDir(), "gate.token")
	if err := os.WriteFile(credential, []byte(w.srv.ToolServerToken(t, gateID)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testserver.FreeAddr(t)
	logPath := filepath.Join(t.TempDir(), "gateway.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(testserver.Binary(t), "--addr", w.srv.URL, "mcp", "serve", "--listen", addr,
		"--gate-id", gateID, "--gate-token-file", credential, "--upstream-url", "test="+w.upstream)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); recv(t, exited, "the killed tether mcp serve to exit") })
	testserver.WaitFor(t, guardWait, "tether mcp serve to answer", func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("tether mcp serve exited early:\n%s", log)
		default:
		}
		resp, err := http.Get("http://" + addr + mcpgate.MetadataPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	cs := connectAgent(t, "http://"+addr+mcpgate.EndpointPath, w.grant.Token, nil)
	done := startSlow(t, cs, w.events.Started("k"), "k")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	recv(t, exited, "exited")
	if err := recv(t, done, "done"); err == nil {
		t.Fatal("the agent's call succeeded through a killed gateway")
	}

	term := terminate(t, w, tetherv1.TerminationMode_TERMINATION_MODE_ABORT, 0, 5*time.Second)
	testserver.WaitFor(t, guardWait, "the cancel order to be pending", func() bool {
		return waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_ABORTING).Progress.GetAcksPending() == 1
	})
	w.clk.Advance(6 * time.Second)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	confirmExit(t, w)
	waitState(t, w, term.TerminationId, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	calls := callsByTool(t, recordOf(t, w, term.TerminationId))
	if len(calls) != 1 || len(calls["test/slow"]) != 1 || calls["test/slow"][0].Resolution != tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED {
		t.Fatalf("record: %v, want the slow call cancel_unacknowledged", calls)
	}
}
