package supervisor

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A proposal's reason may be as long as a termination's: the termination
// it starts carries the label and the reason cut to the bound, on a
// character boundary, so that its decision never fails on the proposer's
// words.
func TestAProposalsReasonFitsTheTerminationItStarts(t *testing.T) {
	for _, reason := range []string{"", "short", strings.Repeat("a", MaxReasonBytes), strings.Repeat("é", MaxReasonBytes/2)} {
		p := &StopProposal{ProposalID: "p_0123456789abcdefghjk", Reason: reason}
		got := proposalReason(p)
		label := "stop proposal p_0123456789abcdefghjk: "
		if len(got) > MaxReasonBytes || !utf8.ValidString(got) || !strings.HasPrefix(got, label) || !strings.HasPrefix(reason, strings.TrimPrefix(got, label)) {
			t.Errorf("reason of %d bytes: %q (%d bytes)", len(reason), got, len(got))
		}
		if len(label)+len(reason) <= MaxReasonBytes && got != label+reason {
			t.Errorf("a reason that fits was cut: %q", got)
		}
		if _, err := NewTermination("t_1", "n_1", ModeDrain, 0, 0, 0, got, "operator:x", t0); err != nil {
			t.Errorf("reason of %d bytes: %v", len(reason), err)
		}
	}
}
