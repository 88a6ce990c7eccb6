package agentsdk

import (
	"context"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// ReportReady tells the control plane the agent is ready to take work. A
// rollout counts ready agents matching its target selector as
// replacements, so report only once the agent can really serve. It is
// idempotent.
func (a *Agent) ReportReady(ctx context.Context) error {
	_, err := a.conn.Agent.ReportReady(ctx, connect.NewRequest(&tetherv1.ReportReadyRequest{NodeId: a.NodeID()}))
	return err
}
