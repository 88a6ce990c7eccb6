package controlplane

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/rollout"
)

// Rollout starts a rollout: operators only (the policy), since it drains
// agents across the whole tree.
func (h *supervisorService) Rollout(ctx context.Context, req *connect.Request[tetherv1.RolloutRequest]) (*connect.Response[tetherv1.RolloutResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	r, err := h.s.rollouts.Start(ctx, rollout.RolloutRequest{
		Selector: m.Selector, TargetSelector: m.TargetSelector,
		Batch: int(m.Batch), MaxUnavailable: int(m.MaxUnavailable),
		BatchDeadline:  durationOr(m.BatchDeadline, 0),
		DrainWindow:    durationOr(m.DrainWindow, supervisor.DefaultDrainWindow),
		ConfirmTimeout: durationOr(m.ConfirmTimeout, supervisor.DefaultConfirmTimeout),
		Description:    m.Description, RequestedBy: p.ID(),
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.RolloutResponse{Rollout: wire.Rollout(r)}), nil
}

func (h *supervisorService) GetRollout(ctx context.Context, req *connect.Request[tetherv1.GetRolloutRequest]) (*connect.Response[tetherv1.GetRolloutResponse], error) {
	r, err := h.s.rollouts.Get(ctx, req.Msg.RolloutId)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.GetRolloutResponse{Rollout: wire.Rollout(r)}), nil
}

func (h *supervisorService) ListRollouts(ctx context.Context, _ *connect.Request[tetherv1.ListRolloutsRequest]) (*connect.Response[tetherv1.ListRolloutsResponse], error) {
	rs, err := h.s.rollouts.List(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := make([]*tetherv1.Rollout, len(rs))
	for i, r := range rs {
		out[i] = wire.Rollout(r)
	}
	return connect.NewResponse(&tetherv1.ListRolloutsResponse{Rollouts: out}), nil
}

func (h *supervisorService) WatchRollout(ctx context.Context, req *connect.Request[tetherv1.WatchRolloutRequest], stream *connect.ServerStream[tetherv1.WatchRolloutResponse]) error {
	err := h.s.rollouts.Watch(ctx, req.Msg.RolloutId, func(r rollout.Rollout) error {
		return stream.Send(&tetherv1.WatchRolloutResponse{Rollout: wire.Rollout(r)})
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return toConnect(err)
}

func (h *supervisorService) decideRollout(ctx context.Context, rolloutID string, d rollout.RolloutDecision, reason string) (*tetherv1.Rollout, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	r, err := h.s.rollouts.Decide(ctx, rolloutID, d, reason, p.ID())
	if err != nil {
		return nil, toConnect(err)
	}
	return wire.Rollout(r), nil
}

func (h *supervisorService) PauseRollout(ctx context.Context, req *connect.Request[tetherv1.PauseRolloutRequest]) (*connect.Response[tetherv1.PauseRolloutResponse], error) {
	r, err := h.decideRollout(ctx, req.Msg.RolloutId, rollout.DecidePause, req.Msg.Reason)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tetherv1.PauseRolloutResponse{Rollout: r}), nil
}

func (h *supervisorService) ResumeRollout(ctx context.Context, req *connect.Request[tetherv1.ResumeRolloutRequest]) (*connect.Response[tetherv1.ResumeRolloutResponse], error) {
	r, err := h.decideRollout(ctx, req.Msg.RolloutId, rollout.DecideResume, "")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tetherv1.ResumeRolloutResponse{Rollout: r}), nil
}

func (h *supervisorService) AbortRollout(ctx context.Context, req *connect.Request[tetherv1.AbortRolloutRequest]) (*connect.Response[tetherv1.AbortRolloutResponse], error) {
	r, err := h.decideRollout(ctx, req.Msg.RolloutId, rollout.DecideAbort, req.Msg.Reason)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tetherv1.AbortRolloutResponse{Rollout: r}), nil
}

// ReportReady: an agent reports its own node ready, or an operator (its
// launcher) reports it. A rollout counts ready agents matching its target
// selector as replacements.
func (a *agentService) ReportReady(ctx context.Context, req *connect.Request[tetherv1.ReportReadyRequest]) (*connect.Response[tetherv1.ReportReadyResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	n, err := a.s.tree.ReportReady(ctx, req.Msg.NodeId, ownNodeOnly(p, "report only its own readiness", "node_id"))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tetherv1.ReportReadyResponse{Node: wire.Node(n)}), nil
}
