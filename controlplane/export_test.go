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
