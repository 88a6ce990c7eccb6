package lease_test

import (
	"fmt"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// A late renew from an expired generation never revives it: the new
// generation keeps authority and the stale message is recorded.
func ExampleStep() {
	p := lease.DefaultPolicy()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w1 := lease.Claim{JobID: "job-42", LeaseID: "lease-a", Generation: 1, HolderIdentity: "worker-1"}
	w2 := lease.Claim{JobID: "job-42", LeaseID: "lease-b", Generation: 2, HolderIdentity: "worker-2"}

	var l lease.Lease
	for _, step := range []struct {
		after time.Duration
		m     lease.Message
	}{
		{0, lease.Offer{JobID: "job-42", LeaseID: "lease-a", HolderIdentity: "worker-1", LeaseDuration: 30 * time.Second}},
		{1 * time.Second, lease.Ack{Claim: w1}},
		{31 * time.Second, lease.Tick{JobID: "job-42"}},
		{32 * time.Second, lease.Reassign{JobID: "job-42", LeaseID: "lease-b", HolderIdentity: "worker-2", LeaseDuration: 30 * time.Second}},
		{33 * time.Second, lease.Ack{Claim: w2}},
		{34 * time.Second, lease.Renew{Claim: w1, RenewSequence: 1}},
	} {
		var d lease.Decision
		l, d, _ = lease.Step(l, step.m, t0.Add(step.after), p)
		fmt.Printf("%-8s %-9s %-18s gen %d %s holds=%s\n", step.m.Kind(), d.Outcome, d.Event, l.Generation, l.State, l.HolderIdentity)
	}
	// Output:
	// offer    ACCEPTED  OFFERED            gen 1 OFFERED holds=worker-1
	// ack      ACCEPTED  ACKED              gen 1 ACTIVE holds=worker-1
	// tick     ACCEPTED  LEASE_EXPIRED      gen 1 EXPIRED holds=worker-1
	// reassign ACCEPTED  REASSIGNED         gen 2 OFFERED holds=worker-2
	// ack      ACCEPTED  ACKED              gen 2 ACTIVE holds=worker-2
	// renew    REJECTED  STALE_GENERATION   gen 2 ACTIVE holds=worker-2
}
