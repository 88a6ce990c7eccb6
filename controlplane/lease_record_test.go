package controlplane

import (
	"testing"

	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRecordOutcome: how the record reports a finalized lease. A declared
// result wins over the lease having run out; a lease that ran out without
// one is EXPIRED; a holder's own final report is COMPLETED.
func TestRecordOutcome(t *testing.T) {
	for _, c := range []struct {
		l    lease.Lease
		want supervisor.LeaseOutcome
	}{
		{lease.Lease{State: lease.StateTerminal, TerminalResult: lease.ResultUnresolved, LeaseExpired: true}, supervisor.LeaseOutcomeUnresolved},
		{lease.Lease{State: lease.StateTerminal, TerminalResult: lease.ResultCancelled, LeaseExpired: true}, supervisor.LeaseOutcomeCancelled},
		{lease.Lease{State: lease.StateTerminal, TerminalResult: lease.ResultFailed, LeaseExpired: true}, supervisor.LeaseOutcomeExpired},
		{lease.Lease{State: lease.StateExpired}, supervisor.LeaseOutcomeExpired},
		{lease.Lease{State: lease.StateTerminal, TerminalResult: lease.ResultSuccess}, supervisor.LeaseOutcomeCompleted},
		{lease.Lease{State: lease.StateTerminal, TerminalResult: lease.ResultFailed}, supervisor.LeaseOutcomeCompleted},
		{lease.Lease{State: lease.StateActive}, supervisor.LeaseOutcomeUnresolved},
	} {
		if got := recordOutcome(c.l); got != c.want {
			t.Errorf("%s %s expired=%v: %s, want %s", c.l.State, c.l.TerminalResult, c.l.LeaseExpired, got, c.want)
		}
	}
}
