package lease_test

import (
	"math/rand"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

func TestZZProbe(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for run := 0; run < 200000; run++ {
		p := lease.DefaultPolicy()
		p.DefaultAckTimeout = 5 * time.Second
		p.MaxUnresolvedBound = time.Minute
		if r.Intn(2) == 0 {
			p.AckMiss = lease.AckMissReassign
		}
		now := epoch
		l, _, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: "j1", LeaseID: "L1", HolderIdentity: "w1", LeaseDuration: 10 * time.Second}, now, p)
		fresh := 1
		var hist []string
		for n := 0; n < 30; n++ {
			op, a, b, c := byte(r.Intn(256)), byte(r.Intn(16)), byte(r.Intn(256)), byte(r.Intn(256))
			now = now.Add(time.Duration(int8(a)) * 250 * time.Millisecond)
			m := decodeMessage(op, b, c, l, &fresh)
			post, d, _ := lease.Step(l, m, now, p)
			hist = append(hist, d.String())
			fail := func(why string) {
				t.Fatalf("%s\npre %+v\nmsg %#v at %s\npost %+v\n%s\n%v", why, l, m, now.Sub(epoch), post, d, hist)
			}
			acc := d.Outcome == lease.OutcomeAccepted
			c2, worker := lease.ClaimOf(m)
			if post.CancelAck && !post.CancelRequested {
				fail("ack without request")
			}
			if worker && acc && (c2.HolderIdentity != l.HolderIdentity || c2.Generation != l.Generation || c2.LeaseID != l.LeaseID) {
				fail("accepted foreign claim")
			}
			if worker && (post.CancelRequested != l.CancelRequested || post.Generation != l.Generation || post.HolderIdentity != l.HolderIdentity || post.LeaseID != l.LeaseID || post.FormerHolders != l.FormerHolders || post.ResolvedByCoordinator != l.ResolvedByCoordinator) {
				fail("worker changed coordinator fields")
			}
			if post.Generation == l.Generation && (l.CancelRequested || l.OwnershipConflict) && post.OwnershipConflict == l.OwnershipConflict && post.ExpiresAt.After(l.ExpiresAt) && !l.ExpiresAt.IsZero() {
				fail("expiry extended after cancel/conflict")
			}
			if l.State == lease.StateTerminal && worker && acc {
				if _, ok := m.(lease.CancelAck); !ok || l.ResolvedByCoordinator || l.TerminalResult != lease.ResultFailed || !now.Before(l.ExpiresAt) {
					fail("accepted worker message after end")
				}
			}
			if cm, ok := m.(lease.Complete); ok && acc && cm.Result == lease.ResultSuccess && (l.CancelRequested || l.OwnershipConflict) {
				fail("success after cancel/conflict")
			}
			if _, ok := m.(lease.Reassign); ok && acc && l.CancelRequested {
				fail("reassign after cancel")
			}
			if post.Generation == l.Generation && post.ProgressValue != l.ProgressValue {
				if _, ok := m.(lease.Progress); !ok || !acc {
					fail("progress changed by another message")
				}
			}
			if post.State == lease.StateActive && post.Generation == l.Generation && post.ExpiresAt.After(l.ExpiresAt) && l.State == lease.StateActive {
				switch m.(type) {
				case lease.Renew, lease.Recover:
				default:
					fail("expiry extended by " + m.Kind().String())
				}
			}
			if post.TerminalResult == lease.ResultSuccess && post.CancelAck {
				fail("success with cancel ack")
			}
			l = post
		}
	}
}
