package controlplane

import "github.com/tetherhq/tether/supervisor/lease/coordinator"

// HoldLeaseReadsBeforeTheRead makes every GetLease's and Evidence's lease
// read wait, after whether this control plane's coordinator serves was
// taken and before the read, until release is closed; held is sent on,
// without blocking, each time a read waits. A test so holds a read in the
// window between the check and the read (the leader losing its
// leadership in it). It returns the function that undoes it.
func HoldLeaseReadsBeforeTheRead(held chan<- struct{}, release <-chan struct{}) (undo func()) {
	beforeLeaseRead = func(*coordinator.Coordinator) {
		select {
		case held <- struct{}{}:
		default:
		}
		<-release
	}
	return func() { beforeLeaseRead = nil }
}
