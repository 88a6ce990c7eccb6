package mcpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/clock"
)

// The thirty-fifth rogue pass against the MCP gateway (helper C).

// A rogue that claimed its exit cannot have its request after the claim go
// unseen by having the gateway killed while the request's report is owed.
// A report that did not land (the control plane out of reach to the
// gateway for a moment) is owed and sent again until it lands, but only
// from the gateway's memory: a gateway killed meanwhile (kill -9, the OOM
// killer, its machine lost; over stdio, the agent ends its own wrapper)
// lost the debt, and the record read the rogue's exit confirmed. With
// --owed-reports-file the gateway answers such a request only once its
// debt is written there, and the next gateway started on the file sends
// it. (Fails, by its guard, if the second gateway never reports the
// rogue: seen failing with the file's writing disabled.)
func TestRogue35COwedReportSurvivesTheGatewaysKill(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	cp := beginsLosingProxy(t, w.srv.URL)
	owed := filepath.Join(t.TempDir(), "owed.json")
	endpoint, stop := gatewayProcess(t, w, cp.url, owed)
	claimAfterSessionEnd(t, w, self, credential)

	// The rogue's ping after its claim, its report lost (and owed).
	cp.down.Store(true)
	if got := pingStatus(t, endpoint, token); got == http.StatusServiceUnavailable {
		t.Fatalf("the rogue's ping: %d, refused", got)
	}
	stop(syscall.SIGKILL)
	cp.down.Store(false)
	if got := nodeOf(t, w, self).Contradictions; len(got) > 0 {
		t.Fatalf("the rogue's lost report noted already: %v", got)
	}
	if b, err := os.ReadFile(owed); err != nil || !strings.Contains(string(b), self) {
		t.Fatalf("the owed reports file after the kill: %q %v, want the rogue's node", b, err)
	}
	if fi, err := os.Stat(owed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the owed reports file's mode: %v %v, want 0600 (it holds tokens)", fi, err)
	}

	// The gateway restarted on the same file, the control plane in reach.
	gatewayProcess(t, w, cp.url, owed)
	testserver.WaitFor(t, guardWait, "the restarted gateway to report the rogue at work after its claim", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
	testserver.WaitFor(t, guardWait, "the landed report to leave the owed reports file", func() bool {
		b, err := os.ReadFile(owed)
		return err == nil && !strings.Contains(string(b), self)
	})
}

// A rogue that claimed its exit cannot have its request after the claim go
// unseen by having the gateway shut down while the control plane is out of
// its reach. A gateway that closes sends each report still owed once more,
// and those that did not land then (the control plane out of reach, the
// gateway's credential refused) were only logged: a gateway drained or
// restarted during an outage lost the rogue's report for good. With
// --owed-reports-file they are left in the file, and the next gateway
// started on it sends them. (Fails, by its guard, if the second gateway
// never reports the rogue: seen failing with the file's writing disabled.)
func TestRogue35CReportFailingAtShutdownIsSentByTheNextGateway(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	cp := beginsLosingProxy(t, w.srv.URL)
	owed := filepath.Join(t.TempDir(), "owed.json")
	endpoint, stop := gatewayProcess(t, w, cp.url, owed)
	claimAfterSessionEnd(t, w, self, credential)

	cp.down.Store(true)
	if got := pingStatus(t, endpoint, token); got == http.StatusServiceUnavailable {
		t.Fatalf("the rogue's ping: %d, refused", got)
	}
	stop(syscall.SIGTERM) // Close: the report sent once more, and lost
	cp.down.Store(false)
	if got := nodeOf(t, w, self).Contradictions; len(got) > 0 {
		t.Fatalf("the rogue's lost report noted already: %v", got)
	}

	gatewayProcess(t, w, cp.url, owed)
	testserver.WaitFor(t, guardWait, "the next gateway to report the rogue at work after its claim", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}

// A rogue whose grant was revoked cannot have its refusal after its claim
// go unreported by knocking within its refusal report's interval and
// having the gateway lost before the interval's end. Such a refusal is
// answered at once and reported at the interval's end, from the gateway's
// memory only: a gateway killed within that second lost it. With an owed
// reports file the refusal is answered only once it is written there, and
// the next gateway started on the file reports it. (The first gateway is
// left standing, its clock stopped, as a killed one would be, and the
// second started on its file; fails, by its guard, if the second never
// reports the rogue: seen failing with the refusal's writing removed.)
func TestRogue35CRefusalWithinItsIntervalSurvivesTheGatewaysLoss(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	owed := filepath.Join(t.TempDir(), "owed.json")
	withFile := func(c *mcpgate.Config) { c.OwedReportsFile = owed }
	gw := gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, withFile)
	endpoint := serveGateway(t, gw)

	revokeAtGateway(t, w, gw, token)
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping: %d; want 403", got)
	}
	claimAfterSessionEnd(t, w, self, credential)
	// Refused after its claim, within its report's interval on the
	// gateway's clock (which stands): its report waits for the interval's
	// end, which this gateway never reaches.
	if got := pingStatus(t, endpoint, token); got != http.StatusForbidden {
		t.Fatalf("the revoked rogue's ping after its claim: %d; want 403", got)
	}
	if got := nodeOf(t, w, self).Contradictions; len(got) > 0 {
		t.Fatalf("the rogue's refusal after its claim reported already: %v", got)
	}
	gatewayOnClockWith(t, w, clock.NewManual(w.clk.Now()), nil, withFile)
	testserver.WaitFor(t, guardWait, "the next gateway to report the rogue at work after its claim", func() bool {
		return len(nodeOf(t, w, self).Contradictions) > 0
	})
}

// A rogue that claimed its exit cannot be served by a gateway that closes
// under its request. A closed gateway's handler refuses every request, but
// one already past that door as Close began went on: its report, sent
// after the reports were closed, was never sent, and the request was
// served — a rogue that held its body back until the gateway was closing
// (a restart, a drain) had an initialize answered, a session opened,
// unseen. A request that reaches the gateway's MCP server once the
// gateway is closed is now refused (CodeUnavailable). (Fails if the
// rogue's initialize is answered with a result.)
func TestRogue35CRequestPastTheDoorAsCloseBeginsIsNotServed(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"rogue","version":"1"}}}`
	status, answer := answerPastTheDoorAsCloseBegins(t, "", body)
	if strings.Contains(answer, `"result"`) || !strings.Contains(answer, fmt.Sprint(mcpgate.CodeUnavailable)) {
		t.Fatalf("the rogue's initialize past the door of a closing gateway: %d %s, want it refused (%d), not served unreported", status, answer, mcpgate.CodeUnavailable)
	}
}

// answerPastTheDoorAsCloseBegins: a rogue child whose exit is claimed
// sends half of a POST (its own header lines, each ending "\r\n", beside
// the usual ones; its body), waits for the gateway to read it past the
// door, closes the gateway, sends the rest, and returns the answer.
func answerPastTheDoorAsCloseBegins(t *testing.T, headers, body string) (int, string) {
	t.Helper()
	w := newWorld(t, "mcp:test/*")
	self, credential, token := rogueChild(t, w, time.Hour)
	gw := gatewayOnClock(t, w, clock.NewManual(w.clk.Now()), nil)
	endpoint := serveGateway(t, gw)
	claimAfterSessionEnd(t, w, self, credential)

	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n%sContent-Length: %d\r\n\r\n", u.Path, u.Host, token, headers, len(body))
	half := len(body) / 2
	if _, err := io.WriteString(conn, head+body[:half]); err != nil {
		t.Fatal(err)
	}
	// Past the door: the gateway reads the rest of its body.
	testserver.WaitFor(t, guardWait, "the gateway to read the rogue's body", func() bool {
		return gw.BodyBytesHeldForTest(self) > 0
	})
	gw.Close()
	if _, err := io.WriteString(conn, body[half:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(answer)
}

// losingProxy stands between a gateway process and the control plane
// (h2c, as the gateway speaks it), failing its BeginCall requests while
// down is set (503: the control plane out of reach to them).
type losingProxy struct {
	url  string
	down atomic.Bool
}

func beginsLosingProxy(t *testing.T, target string) *losingProxy {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(to) },
		Transport:     &http.Transport{Protocols: h2c},
		FlushInterval: -1,
	}
	p := &losingProxy{}
	both := new(http.Protocols)
	both.SetHTTP1(true)
	both.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: both, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.down.Load() && strings.HasSuffix(r.URL.Path, "/BeginCall") {
			http.Error(w, "losingProxy: the control plane is unreachable", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.url = "http://" + ln.Addr().String()
	return p
}

// gatewayProcess runs `tether mcp serve` in front of w's upstream, its
// control plane at cp and its owed reports in owed, and returns its
// endpoint and a stop that signals it and returns once it has exited.
func gatewayProcess(t *testing.T, w *world, cp, owed string) (endpoint string, stop func(os.Signal)) {
	t.Helper()
	dir := t.TempDir()
	credential := filepath.Join(dir, "gate.token")
	if err := os.WriteFile(credential, []byte(w.srv.ToolServerToken(t, gateID)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testserver.FreeAddr(t)
	logPath := filepath.Join(dir, "gateway.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	cmd := exec.Command(testserver.Binary(t), "--addr", cp, "mcp", "serve", "--listen", addr, "--log-level", "debug",
		"--gate-id", gateID, "--gate-token-file", credential, "--upstream-url", "test="+w.upstream, "--owed-reports-file", owed)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func(sig os.Signal) {
		_ = cmd.Process.Signal(sig)
		recv(t, exited, "the signalled tether mcp serve to exit")
	}
	t.Cleanup(func() { stop(syscall.SIGKILL) })
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
	return "http://" + addr + mcpgate.EndpointPath, stop
}
