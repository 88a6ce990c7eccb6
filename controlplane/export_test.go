package controlplane

import (
	"time"

	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// HoldLeaseReadsUntilServing makes every GetLease's store read wait, after
// it read and before its answer is judged, for the control plane's lease
// coordinator to serve (at most a minute): the read of a restarted control
// plane then always races its coordinator's start and loses. It returns
// the function that undoes it.
func HoldLeaseReadsUntilServing() (undo func()) {
	afterLeaseRead = func(c *coordinator.Coordinator) {
		deadline := time.After(time.Minute)
		for {
			serving, changed := c.Serving()
			if serving {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				return
			}
		}
	}
	return func() { afterLeaseRead = nil }
}

// HoldLeaseReadsUntilServingAndTell is HoldLeaseReadsUntilServing that
// also sends on held, without blocking, each time a read is held: a test
// then knows the read has read the store before it lets the coordinator
// start.
func HoldLeaseReadsUntilServingAndTell(held chan<- struct{}) (undo func()) {
	undo = HoldLeaseReadsUntilServing()
	hold := afterLeaseRead
	afterLeaseRead = func(c *coordinator.Coordinator) {
		select {
		case held <- struct{}{}:
		default:
		}
		hold(c)
	}
	return undo
}
