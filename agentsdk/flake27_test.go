package agentsdk_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// exitPeer is a control plane's agent side as far as an agent's exit
// goes: WhoAmI and GetNode for Join, a session that opens and ends on the
// exit message (stored, the stream ended cleanly, as the control plane
// does; or not stored, the stream ended with broken's error, as when the
// control plane's replica went away or could not store the claim), and
// ConfirmExit, whose claims it keeps.
type exitPeer struct {
	tetherv1connect.UnimplementedAgentServiceHandler
	tetherv1connect.UnimplementedAuthServiceHandler
	broken error
	stored chan string // the claims stored, by either way
}

func (p *exitPeer) WhoAmI(context.Context, *connect.Request[tetherv1.WhoAmIRequest]) (*connect.Response[tetherv1.WhoAmIResponse], error) {
	return connect.NewResponse(&tetherv1.WhoAmIResponse{NodeId: "n-flake27"}), nil
}

func (p *exitPeer) GetNode(context.Context, *connect.Request[tetherv1.GetNodeRequest]) (*connect.Response[tetherv1.GetNodeResponse], error) {
	return connect.NewResponse(&tetherv1.GetNodeResponse{Node: &tetherv1.Node{NodeId: "n-flake27", Name: "flake27"}}), nil
}

func (p *exitPeer) Session(ctx context.Context, stream *connect.BidiStream[tetherv1.SessionRequest, tetherv1.SessionResponse]) error {
	if _, err := stream.Receive(); err != nil { // the hello
		return err
	}
	if err := stream.Send(&tetherv1.SessionResponse{Kind: &tetherv1.SessionResponse_Opened{Opened: &tetherv1.SessionOpened{Node: &tetherv1.Node{NodeId: "n-flake27"}}}}); err != nil {
		return err
	}
	for {
		msg, err := stream.Receive()
		if err != nil {
			return err
		}
		if exit := msg.GetExit(); exit != nil {
			if p.broken != nil {
				return p.broken
			}
			p.stored <- "session: " + exit.Reason
			return nil
		}
	}
}

func (p *exitPeer) ConfirmExit(_ context.Context, req *connect.Request[tetherv1.ConfirmExitRequest]) (*connect.Response[tetherv1.ConfirmExitResponse], error) {
	p.stored <- "ConfirmExit: " + req.Msg.Reason
	return connect.NewResponse(&tetherv1.ConfirmExitResponse{Node: &tetherv1.Node{NodeId: req.Msg.NodeId, State: tetherv1.NodeState_NODE_STATE_EXITED}}), nil
}

// TestFlakeAnExitClaimedOverASessionThatBreaksIsClaimedByCall: Exit hands
// the claim to the open session, behind its heartbeats, and returned nil
// once that session ended, however it ended. A session that broke as the
// claim went out (its replica going away, a control plane that could not
// store the claim and said so) ended with an error, the claim never
// stored: Exit said the agent had claimed its exit, Run stopped (the agent
// had exited), and the record said nobody confirmed the honest agent's
// exit. Whether the claim counted depended on which came first, the
// claim's arrival or the session's end. Exit now counts the claim made
// only when the session ended cleanly after it (the control plane's
// answer to a claim it stored); otherwise it claims by ConfirmExit, which
// the control plane answers (a claim already stored changes nothing).
func TestFlakeAnExitClaimedOverASessionThatBreaksIsClaimedByCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		broken error
		want   string
	}{
		{"stored", nil, "session: done"},
		{"broken", connect.NewError(connect.CodeUnavailable, errors.New("the replica went away before it stored the claim")), "ConfirmExit: done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := &exitPeer{broken: tc.broken, stored: make(chan string, 4)}
			mux := http.NewServeMux()
			mux.Handle(tetherv1connect.NewAgentServiceHandler(peer))
			mux.Handle(tetherv1connect.NewAuthServiceHandler(peer))
			url := startRawPeer(t, mux.ServeHTTP)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
			defer cancel()
			agent, err := agentsdk.Join(ctx, url, "flake27-credential", nil)
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- agent.Run(ctx) }()
			select {
			case <-agent.Opened():
			case <-ctx.Done():
				t.Fatal("the session never opened")
			}
			if err := agent.Exit(ctx, "done"); err != nil {
				t.Fatalf("Exit: %v", err)
			}
			var got []string
			for len(peer.stored) > 0 {
				got = append(got, <-peer.stored)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("Exit returned nil with the claims %q stored, want [%q]", got, tc.want)
			}
			select {
			case err := <-ran:
				if err != nil {
					t.Fatalf("Run after the exit: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("Run did not end after the exit")
			}
		})
	}
}

// TestFlakeAnExitClaimStoredAsTheSessionEndsIsClaimedOnce: Exit counts
// the claim made over the session when the session ended cleanly after
// the claim was sent. Whether it was sent was noted by the session's
// writer after its Send returned, and read when the session ended: a
// control plane that stored the claim and ended the session before the
// writer's note (a loaded machine, or one core) had the claim read as
// never sent, and Exit claimed again by ConfirmExit. The writer here is
// held, once it has sent the claim, until the session has ended.
func TestFlakeAnExitClaimStoredAsTheSessionEndsIsClaimedOnce(t *testing.T) {
	t.Cleanup(agentsdk.HoldExitSentUntilTheSessionEnds())
	peer := &exitPeer{stored: make(chan string, 4)}
	mux := http.NewServeMux()
	mux.Handle(tetherv1connect.NewAgentServiceHandler(peer))
	mux.Handle(tetherv1connect.NewAuthServiceHandler(peer))
	url := startRawPeer(t, mux.ServeHTTP)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a timing
	defer cancel()
	agent, err := agentsdk.Join(ctx, url, "flake28-credential", nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- agent.Run(ctx) }()
	select {
	case <-agent.Opened():
	case <-ctx.Done():
		t.Fatal("the session never opened")
	}
	if err := agent.Exit(ctx, "done"); err != nil {
		t.Fatalf("Exit: %v", err)
	}
	var got []string
	for len(peer.stored) > 0 {
		got = append(got, <-peer.stored)
	}
	if len(got) != 1 || got[0] != "session: done" {
		t.Fatalf("Exit returned nil with the claims %q stored, want only the session's", got)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run after the exit: %v", err)
	}
}
