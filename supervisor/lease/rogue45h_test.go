package lease_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// TestRogue45HRenewReasonIsWhatFmtWrote holds the accepted renewal's
// reason, now built without fmt (every renewal is judged there), to the
// bytes fmt.Sprintf wrote before, for ids a holder may choose: quotes,
// backslashes, control characters, DEL, non-ASCII, the longest; and for
// times with and without a fraction, trailing zeros and the zero time of
// an unset expiry cannot reach it (an ACTIVE lease has one).
func TestRogue45HRenewReasonIsWhatFmtWrote(t *testing.T) {
	ids := []string{
		"lease-7f3a9c01d2e4b6a8", "w", `a"b`, `back\slash`, "tab\there", "nul\x00", "del\x7f", "bell\a",
		"é", "日本語", "\u2028sep", "emoji 🙂", strings.Repeat("x", lease.MaxIDBytes), strings.Repeat("\x01", lease.MaxIDBytes),
		"  spaced  ", "%s %q %d", "\ufeff", "\U0010ffff",
	}
	rng := rand.New(rand.NewPCG(45, 8))
	for range 200 {
		b := make([]byte, 1+rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(128))
		}
		ids = append(ids, string(b))
	}
	p := lease.DefaultPolicy()
	starts := []time.Time{
		time.Date(2026, 12, 7, 14, 26, 44, 0, time.UTC),
		time.Date(2026, 12, 7, 14, 26, 44, 120000000, time.UTC),
		time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.FixedZone("x", 3600)),
		time.Date(1999, 12, 31, 23, 59, 59, 1, time.UTC),
	}
	checked := 0
	for k, id := range ids {
		holder := ids[(k*7+3)%len(ids)]
		at := starts[k%len(starts)]
		claim := lease.Claim{JobID: "job-45h", LeaseID: id, Generation: 1, HolderIdentity: holder}
		l, d, _ := lease.Step(lease.Lease{}, lease.Offer{JobID: claim.JobID, LeaseID: id, HolderIdentity: holder, LeaseDuration: 30 * time.Second}, at, p)
		if d.Outcome != lease.OutcomeAccepted {
			continue // an id the lease machine refuses never reaches a renewal
		}
		if l, d, _ = lease.Step(l, lease.Ack{Claim: claim}, at, p); d.Outcome != lease.OutcomeAccepted {
			t.Fatalf("ack %q: %s", id, d.Reason)
		}
		for seq := uint64(1); seq <= 3; seq++ {
			now := at.Add(time.Duration(seq) * 1500 * time.Microsecond)
			was := l.ExpiresAt
			next, d, _ := lease.Step(l, lease.Renew{Claim: claim, RenewSequence: seq << (seq * 20)}, now, p)
			if d.Outcome != lease.OutcomeAccepted {
				t.Fatalf("renew %q: %s", id, d.Reason)
			}
			want := fmt.Sprintf("%s accepted at %s: expiry %s -> %s",
				fmt.Sprintf("renew %s seq %d", fmt.Sprintf("gen %d lease %q from %q", claim.Generation, claim.LeaseID, claim.HolderIdentity), seq<<(seq*20)),
				now.UTC().Format(time.RFC3339Nano), was.UTC().Format(time.RFC3339Nano), next.ExpiresAt.UTC().Format(time.RFC3339Nano))
			if d.Reason != want {
				t.Fatalf("renew of lease %q from %q:\n got %q\nwant %q", id, holder, d.Reason, want)
			}
			// A refused renewal describes the message the same way.
			_, r, _ := lease.Step(next, lease.Renew{Claim: claim, RenewSequence: 0}, now, p)
			if r.Outcome != lease.OutcomeRejected {
				t.Fatalf("renew seq 0 of %q accepted", id)
			}
			_, r, _ = lease.Step(next, lease.Renew{Claim: claim, RenewSequence: seq << (seq * 20)}, now, p)
			if !strings.HasPrefix(r.Reason, fmt.Sprintf("renew gen %d lease %q from %q seq %d repeats", claim.Generation, id, holder, seq<<(seq*20))) {
				t.Fatalf("duplicate renew of %q: %q", id, r.Reason)
			}
			l = next
			checked++
		}
	}
	if checked < 3*len(ids)/2 {
		t.Fatalf("only %d renewals of %d ids judged", checked, len(ids))
	}
}
