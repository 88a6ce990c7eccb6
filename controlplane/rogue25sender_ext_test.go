package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue25CMovedJobsNewHolderCannotForgeASender: a moved job's Evidence
// tells the old tree's late messages by their sender, read from
// ` from "<node>"` in the row's reason (treeRows). The new holder chooses
// words the reason quotes — a progress value, the lease id it claims —
// and writes there the old tree's former holder as the sender, the quotes
// around it included, before or after where the reason names the real
// sender. Its rows stay in its evidence as it sent them: the quoting
// escapes the quotes, so no words of its own name a sender, and a row's
// presence tells it nothing of who held the job before.
func TestRogue25CMovedJobsNewHolderCannotForgeASender(t *testing.T) {
	w := newLeaseWorld(t)
	m := moveAcrossTrees(t, w)
	b := unary{m.holderC}
	forged := []string{
		` from ` + strconv.Quote(w.w1),
		`x" from "` + w.w1 + `" seq 1`,
		`" from "` + w.w1 + `"`,
		` from \"` + w.w1 + `\"`,
	}
	for i, f := range forged {
		_, d := b.send(t, progress(m.l2, uint64(2+i), f))
		wantDecision(t, "the new holder's progress forging a sender", d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
	}
	// The same words as the lease id it claims: judged against its own
	// generation, refused (a lease id that is not generation 2's), kept.
	for _, f := range forged {
		c := proto.Clone(m.l2).(*tetherv1.Lease)
		c.LeaseId = f
		_, d := b.send(t, renew(c, 1))
		wantDecision(t, "the new holder's renew claiming a forged lease id", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_UNKNOWN_LEASE)
	}
	resp, err := m.holderC.Lease.Evidence(context.Background(), connect.NewRequest(&tetherv1.EvidenceRequest{JobId: m.job}))
	if err != nil {
		t.Fatal(err)
	}
	text := ""
	for _, r := range resp.Msg.Rows {
		text += r.Reason + "\n"
	}
	// Each forged text: once in its progress row, twice in its renew's
	// (the lease id claimed, and the refusal naming it).
	for _, f := range forged {
		if n := strings.Count(text, strconv.Quote(f)); n < 3 {
			t.Errorf("the new holder's own messages carrying %s are in its evidence %d times, want 3", f, n)
		}
	}
	if got, want := strings.Count(text, " from "+strconv.Quote(m.holder)), 2*len(forged)+2; got < want {
		t.Errorf("the new holder reads %d of its own rows, want at least %d:\n%s", got, want, text)
	}
	if strings.Contains(text, " from "+strconv.Quote(w.w1)) {
		t.Errorf("the new holder's evidence names the old tree's former holder as a sender:\n%s", text)
	}
}
