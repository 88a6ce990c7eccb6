package controlplane

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor"
)

// TestFinishedTerminationIsReadWithoutDecoding: the check for a stop
// requested passes over a stored termination unread only when it is
// finished — a termination in every other phase, with phase timings,
// a reason that quotes a finished termination's JSON, and several roots,
// is decoded and judged.
func TestFinishedTerminationIsReadWithoutDecoding(t *testing.T) {
	epoch := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	term, err := supervisor.NewTermination("t_x", "n_x", supervisor.ModeDrain, time.Minute, time.Minute, time.Minute, `"phase":5 and "phase": 5`, "operator:admin", epoch)
	if err != nil {
		t.Fatal(err)
	}
	term.Roots = []string{"n_x", "n_y"}
	for _, phase := range []supervisor.Phase{supervisor.PhaseRequested, supervisor.PhaseDraining, supervisor.PhaseAborting, supervisor.PhaseReconciling, supervisor.PhaseTerminated} {
		term.Phase = phase
		term.Phases = append(term.Phases, supervisor.PhaseTiming{Phase: phase, StartedAt: epoch})
		if phase == supervisor.PhaseTerminated {
			term.Phases = term.Phases[:len(term.Phases)-1] // never listed
		}
		v, err := json.Marshal(term)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := finishedTermination(v), phase == supervisor.PhaseTerminated; got != want {
			t.Fatalf("phase %v: passed over unread %v, want %v\n%s", phase, got, want, v)
		}
	}
}
