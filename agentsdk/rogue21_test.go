package agentsdk_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The twenty-first hostile pass on the Go SDK: the control plane as a peer
// that holds its answers (a real HTTP/2 server on loopback, startRawPeer);
// a framework author's LeaseWorker.Close (rogue21lease_test.go); a rogue
// caller at a fence (rogue21fence_test.go); a hostile peer's cancel orders
// at a gate (rogue21gate_test.go).

// answerProto writes msg as a Connect unary answer.
func answerProto(w http.ResponseWriter, msg proto.Message) {
	b, err := proto.Marshal(msg)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/proto")
	w.Write(b)
}

// A Go unary call took its deadline only from its caller's context: one
// without a deadline (context.Background(), what Join's and Spawn's
// callers usually pass) waited for as long as the control plane held its
// answer, where the TypeScript and Python calls end at 30 s. The Conn now
// gives such a call DefaultTimeout, and the Connect protocol carries it to
// the server (Connect-Timeout-Ms); a context's own deadline comes first,
// longer or shorter, and streams carry none.
func TestRogue21AUnaryCallCarriesTheConnsDeadlineByDefault(t *testing.T) {
	timeouts := make(chan string, 8)
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/WhoAmI"):
			timeouts <- r.Header.Get("Connect-Timeout-Ms")
			answerProto(w, &tetherv1.WhoAmIResponse{NodeId: "n-rogue21"})
		case strings.HasSuffix(r.URL.Path, "/WatchCancels"):
			timeouts <- r.Header.Get("Connect-Timeout-Ms")
			w.Header().Set("Content-Type", "application/connect+proto")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // held open
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	})
	conn := agentsdk.Dial(url, "rogue21-token")
	if _, err := conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatal(err)
	}
	// A deadline derived from 30 s at the call: (0, 30000] ms when sent.
	if ms, err := strconv.Atoi(<-timeouts); err != nil || ms <= 0 || ms > 30_000 {
		t.Fatalf("a unary call without a deadline was sent with Connect-Timeout-Ms %d (%v), want one of at most 30 s", ms, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if _, err := conn.Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatal(err)
	}
	if ms, err := strconv.Atoi(<-timeouts); err != nil || ms <= 30_000 {
		t.Fatalf("a call whose context has an hour was sent with Connect-Timeout-Ms %d (%v): the context's deadline comes first", ms, err)
	}
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	stream, err := conn.Tool.WatchCancels(sctx, connect.NewRequest(&tetherv1.WatchCancelsRequest{GateId: "rogue21-gate"}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if got := <-timeouts; got != "" {
		t.Fatalf("a stream was given a deadline (Connect-Timeout-Ms %s): streams are meant to stay open", got)
	}
}

// WithTimeout(0) sends unary calls without a deadline, as before.
func TestRogue21WithTimeoutZeroGivesNone(t *testing.T) {
	timeouts := make(chan string, 1)
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		timeouts <- r.Header.Get("Connect-Timeout-Ms")
		answerProto(w, &tetherv1.WhoAmIResponse{NodeId: "n-rogue21"})
	})
	conn := agentsdk.Dial(url, "rogue21-token", agentsdk.WithTimeout(0))
	if _, err := conn.Auth.WhoAmI(context.Background(), connect.NewRequest(&tetherv1.WhoAmIRequest{})); err != nil {
		t.Fatal(err)
	}
	if got := <-timeouts; got != "" {
		t.Fatalf("WithTimeout(0) sent Connect-Timeout-Ms %s", got)
	}
}

// A control plane that takes the calls of an agent's life and never
// answers them: Join's, Spawn's and ConfirmExit's (Exit without a session)
// end at the connection's timeout with deadline_exceeded, their contexts
// having none; an agent registered by an operator's Conn keeps that Conn's
// timeout.
func TestRogue21AnAgentsCallsEndAtTheConnsTimeoutAgainstAControlPlaneThatNeverAnswers(t *testing.T) {
	node := &tetherv1.Node{NodeId: "n-rogue21", Name: "rogue21"}
	url := startRawPeer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/WhoAmI"):
			answerProto(w, &tetherv1.WhoAmIResponse{NodeId: node.NodeId})
		case strings.HasSuffix(r.URL.Path, "/GetNode") && r.Header.Get("Authorization") == "Bearer held-join":
			<-r.Context().Done() // accepted, never answered
		case strings.HasSuffix(r.URL.Path, "/GetNode"):
			answerProto(w, &tetherv1.GetNodeResponse{Node: node})
		case strings.HasSuffix(r.URL.Path, "/RegisterRoot"):
			answerProto(w, &tetherv1.RegisterRootResponse{Node: node, Credential: "rogue21-credential"})
		case strings.HasSuffix(r.URL.Path, "/Spawn"), strings.HasSuffix(r.URL.Path, "/ConfirmExit"):
			<-r.Context().Done()
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	})
	ctx := context.Background()
	short := agentsdk.WithTimeout(200 * time.Millisecond)
	// The calls the peer answers carry a deadline of their own, which the
	// connection's timeout leaves alone: a loaded machine answering one of
	// them in more than 200 ms (seen once in 240 runs at load 8) is not
	// the call this test is about. Those never answered have none.
	answered, cancel := context.WithTimeout(ctx, time.Minute) // a bound on an answered call, not a timing
	defer cancel()

	if _, err := agentsdk.Join(ctx, url, "held-join", nil, short); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("a Join whose GetNode is never answered: %v, want deadline_exceeded", err)
	}
	agent, err := agentsdk.Join(answered, url, "rogue21-credential", nil, short)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Spawn(ctx, "child", nil); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("a Spawn never answered: %v, want deadline_exceeded", err)
	}
	if err := agent.Exit(ctx, "done"); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("an Exit (ConfirmExit) never answered: %v, want deadline_exceeded", err)
	}
	operator := agentsdk.Dial(url, "rogue21-operator", short)
	root, err := agentsdk.RegisterRoot(answered, operator, "root", nil)
	if err != nil {
		t.Fatal(err)
	}
	if root.Conn().Timeout() != 200*time.Millisecond {
		t.Fatalf("a root registered over a Conn with a 200ms timeout has %v", root.Conn().Timeout())
	}
	if _, err := root.Spawn(ctx, "child", nil); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("a registered root's Spawn never answered: %v, want deadline_exceeded", err)
	}
}
