package wire

import (
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/rollout"
)

// Rollout is a rollout as the API carries it, with its counts.
func Rollout(r rollout.Rollout) *tetherv1.Rollout {
	out := &tetherv1.Rollout{
		RolloutId: r.ID, Selector: r.Selector, TargetSelector: r.TargetSelector,
		Batch: uint32(r.Batch), MaxUnavailable: uint32(r.MaxUnavailable),
		BatchDeadline: durationpb.New(r.BatchDeadline), DrainWindow: durationpb.New(r.DrainWindow), ConfirmTimeout: durationpb.New(r.ConfirmTimeout),
		State: rolloutStates[r.State], Reason: r.Reason, RequestedBy: r.RequestedBy, Description: r.Description,
		CreatedAt: timestamppb.New(r.CreatedAt), UpdatedAt: timestamppb.New(r.UpdatedAt),
		Counts: &tetherv1.RolloutCounts{
			Remaining: uint32(r.Remaining), Drained: uint32(r.Drained()),
			ReplacementsReady: uint32(r.Replacements(r.ReadyTarget)), Unavailable: uint32(r.Unavailable(r.ReadyTarget)),
			LeasesHandedOver: uint32(r.LeasesHandedOver()),
		},
	}
	for _, b := range r.Batches {
		if b.State() == rollout.BatchDone {
			out.Counts.BatchesDone++
		}
		out.Batches = append(out.Batches, &tetherv1.RolloutBatch{
			Index: uint32(b.Index), State: rolloutBatchStates[b.State()], NodeIds: b.NodeIDs,
			TerminationId: b.TerminationID, RecordId: b.RecordID,
			StartedAt: timestamppb.New(b.StartedAt), Deadline: timestamppb.New(b.Deadline),
			TerminatedAt: timestamp(b.TerminatedAt), ReplacedAt: timestamp(b.ReplacedAt), CompletedAt: timestamp(b.CompletedAt),
			LeasesHandedOver: uint32(b.LeasesHandedOver), LeasesNotHandedOver: b.LeasesNotHandedOver,
		})
	}
	return out
}

// rolloutStates and rolloutBatchStates are the API's names of a rollout's
// and a batch's states; a state not listed is UNSPECIFIED.
var (
	rolloutStates = map[rollout.RolloutState]tetherv1.RolloutState{
		rollout.RolloutRunning:   tetherv1.RolloutState_ROLLOUT_STATE_RUNNING,
		rollout.RolloutPaused:    tetherv1.RolloutState_ROLLOUT_STATE_PAUSED,
		rollout.RolloutCompleted: tetherv1.RolloutState_ROLLOUT_STATE_COMPLETED,
		rollout.RolloutAborted:   tetherv1.RolloutState_ROLLOUT_STATE_ABORTED,
	}
	rolloutBatchStates = map[rollout.BatchState]tetherv1.RolloutBatchState{
		rollout.BatchDraining:  tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DRAINING,
		rollout.BatchReplacing: tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_REPLACING,
		rollout.BatchDone:      tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_DONE,
		rollout.BatchReleased:  tetherv1.RolloutBatchState_ROLLOUT_BATCH_STATE_RELEASED,
	}
)
