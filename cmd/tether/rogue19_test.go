package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesJobIdsThatPrintLikeAnotherJobsAreToldApart: a job id is any
// characters but control ones, and a terminal draws some as a blank or as
// nothing — a no-break or ideographic space, a Hangul filler, the braille
// blank, a variation selector after a letter, a space at the end — so a
// rogue holding "job-1" followed by one of them had `tether lease list`,
// `tether lease show` and `tether record show` print it exactly as the
// operator's "job-1". Each is now written out (\u00a0, \u3164, \x20), as the
// console writes it.
func TestARoguesJobIdsThatPrintLikeAnotherJobsAreToldApart(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	admin, parent, child := w.admin, w.parent, w.child
	lookalikes := map[string]string{
		"job-1\u00a0": `job-1\u00a0`,
		"job-1\u3000": `job-1\u3000`,
		"job-1\u3164": `job-1\u3164`,
		"job-1\u2800": `job-1\u2800`,
		"job-1\ufe0f": `job-1\ufe0f`,
		"job-1 ":      `job-1\x20`,
		" job-1":      `\x20job-1`,
	}
	w.holdJobs(t, append([]string{"job-1"}, keys(lookalikes)...)...)
	list := mustCLI(t, srv.URL, srv.Admin, "lease", "list", "--holder", child.Node.NodeId)
	for job, want := range lookalikes {
		if !strings.Contains(list, want) {
			t.Errorf("tether lease list does not tell %q from job-1 (want %s):\n%s", job, want, list)
		}
		show := mustCLI(t, srv.URL, srv.Admin, "lease", "show", job)
		if !strings.Contains(show, want) {
			t.Errorf("tether lease show %q does not write it %s:\n%s", job, want, show)
		}
	}
	// An emoji keeps its presentation selector.
	if got := printable("ok \u2764\ufe0f"); got != "ok \u2764\ufe0f" {
		t.Errorf("an emoji's variation selector is written out: %q", got)
	}

	term, err := parent.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
		NodeId: child.Node.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
		CancelAckTimeout: durationpb.New(0), ConfirmTimeout: durationpb.New(0), Reason: "test",
	}))
	if err != nil {
		t.Fatal(err)
	}
	testserver.WaitFor(t, time.Minute, "the termination's record", func() bool {
		_, err := admin.Supervisor.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{TerminationId: term.Msg.Termination.TerminationId}))
		return err == nil
	})
	rec := mustCLI(t, srv.URL, srv.Admin, "record", "show", term.Msg.Termination.TerminationId)
	for job, want := range lookalikes {
		if !strings.Contains(rec, want) {
			t.Errorf("tether record show does not tell %q from job-1 (want %s):\n%s", job, want, rec)
		}
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
