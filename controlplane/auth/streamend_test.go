package auth

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// agentStream is the least of an agent's stream the interceptor reads.
type agentStream struct{ connect.StreamingHandlerConn }

func (agentStream) Spec() connect.Spec {
	return connect.Spec{Procedure: "/tether.v1.AgentService/Session"}
}
func (agentStream) Peer() connect.Peer                 { return connect.Peer{Addr: "127.0.0.1:1"} }
func (agentStream) RequestHeader() http.Header         { return http.Header{} }
func (agentStream) Receive(any) error                  { return nil }
func (agentStream) ResponseHeader() http.Header        { return http.Header{} }
func (agentStream) ResponseTrailer() http.Header       { return http.Header{} }
func (agentStream) Send(any) error                     { return nil }
func (agentStream) Conn() connect.StreamingHandlerConn { return nil }

// TestFlakeAStreamThatEndedIsNotEndedAgainByItsNodesLaterEnd: a session
// whose handler has ended it (an agent's exit claim, stored, answered by
// the session's clean end) while the agent's node is still live. The
// stored claim lets the termination finish: the node is terminated a
// moment later, and the interceptor's watch beside the stream (AgentEnded)
// ends the stream's context. The interceptor read that end after the
// handler had returned and answered it instead of the handler's clean
// end: whether the agent heard its claim stored or "unauthenticated"
// depended on whether the termination was quicker than the handler's
// return. An end decided after the handler returned now leaves its answer
// alone.
func TestFlakeAStreamThatEndedIsNotEndedAgainByItsNodesLaterEnd(t *testing.T) {
	returned := make(chan struct{})
	watched := make(chan context.Context, 1)
	i := &Interceptor{
		Now: time.Now,
		AgentEnded: func(ctx context.Context, nodeID string) error {
			watched <- ctx
			select {
			case <-returned: // the node ends once the handler has returned
				return fmt.Errorf("%w: node %s is terminated", ErrRevoked, nodeID)
			case <-ctx.Done():
				return nil
			}
		},
	}
	var watchCtx context.Context
	afterStreamHandler = func() {
		close(returned)
		<-watchCtx.Done() // the watch has ended the stream's context
	}
	t.Cleanup(func() { afterStreamHandler = nil })
	ctx := context.WithValue(context.Background(), gateKey{}, Principal{Kind: KindAgent, Subject: "n_1"})
	err := i.WrapStreamingHandler(func(context.Context, connect.StreamingHandlerConn) error {
		watchCtx = <-watched
		return nil // the claim stored: the session's clean end
	})(ctx, agentStream{})
	if err != nil {
		t.Fatalf("the stream its handler ended cleanly ended with %v (%s), want its clean end", err, connect.CodeOf(err))
	}
}
