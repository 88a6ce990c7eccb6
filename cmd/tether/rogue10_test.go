package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/controlplane"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestARoguesInvisibleCharactersAreShownToTheOperator: the lease module
// refuses control characters in a job id but not the invisible ones — a
// zero-width space, a word joiner, a right-to-left override, a line
// separator — so a rogue can hold "job-1\u200b" beside the operator's
// "job-1" (two jobs that print alike), or a job id that reverses the rest of
// the line it is printed on. It holds such jobs, never acknowledges its
// termination and is left UNACCOUNTED; it also writes them into a stop
// proposal's reason. `tether record show`, `tether lease list`, `tether
// lease show` and `tether proposal ls` print each invisible character
// escaped (\u200b, \u202e), so the two jobs read differently and no line is
// reordered.
func TestARoguesInvisibleCharactersAreShownToTheOperator(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	w := startRogueWorld(t, srv)
	admin, parent, child, rogue := w.admin, w.parent, w.child, w.rogue
	lookalike := "job-1\u200b"
	reversing := "job-2\u202e\u2060\u2028\ufeff\u00ad"
	w.holdJobs(t, "job-1", lookalike, reversing)
	if _, err := rogue.Agent.ProposeStop(ctx, connect.NewRequest(&tetherv1.ProposeStopRequest{Condition: "calls>=1000", Reason: "stop " + reversing + " not " + lookalike})); err != nil {
		t.Fatal(err)
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
	invisible := func(r rune) bool {
		return r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp))
	}
	for _, args := range [][]string{
		{"record", "show", term.Msg.Termination.TerminationId},
		{"lease", "list", "--holder", child.Node.NodeId},
		{"lease", "show", lookalike},
		{"lease", "show", reversing},
		{"proposal", "ls"},
	} {
		out := mustCLI(t, srv.URL, srv.Admin, args...)
		if !strings.Contains(out, "job-") {
			t.Fatalf("tether %s does not show the rogue's job at all:\n%s", strings.Join(args, " "), out)
		}
		if i := strings.IndexFunc(out, invisible); i >= 0 {
			t.Errorf("tether %s prints the rogue's invisible character %q to the terminal:\n%q", strings.Join(args, " "), []rune(out[i:])[0], out)
		}
	}
	if out := mustCLI(t, srv.URL, srv.Admin, "record", "show", term.Msg.Termination.TerminationId); !strings.Contains(out, `job-1\u200b`) || !strings.Contains(out, `job-2\u202e`) {
		t.Errorf("tether record show does not name the rogue's jobs so that they read apart from job-1:\n%s", out)
	}
}

// TestARogueCannotNameAChildLikeAnotherNodesID: the console's tree and the
// CLI's tree and record lines show a node's name first, and an operator
// finds a node by its id. A rogue that names its child after another node's
// id ("n_…", the worker it wants stopped in its place) — or after any other
// kind of Tether id — is refused with invalid_argument, and nothing is
// spawned; `tether agent ls` shows no such name.
func TestARogueCannotNameAChildLikeAnotherNodesID(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	root, err := admin.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "root"}))
	if err != nil {
		t.Fatal(err)
	}
	parent := srv.Clients(root.Msg.Credential)
	victim, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "worker"}))
	if err != nil {
		t.Fatal(err)
	}
	rogueNode, err := parent.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: root.Msg.Node.NodeId, Name: "rogue"}))
	if err != nil {
		t.Fatal(err)
	}
	rogue := srv.Clients(rogueNode.Msg.Credential)
	for _, name := range []string{victim.Msg.Node.NodeId, "g_00000000000000000000", "t_abcdefghjkmnpqrstvwx"} {
		_, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogueNode.Msg.Node.NodeId, Name: name}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "id") {
			t.Errorf("a child named %q: got %v, want invalid_argument saying a name may not look like an id", name, err)
		}
		if _, err := rogue.Agent.SpawnBatch(ctx, connect.NewRequest(&tetherv1.SpawnBatchRequest{ParentNodeId: rogueNode.Msg.Node.NodeId, Children: []*tetherv1.SpawnBatchChild{{Name: name}}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("a batch child named %q: got %v, want invalid_argument", name, err)
		}
	}
	out := mustCLI(t, srv.URL, srv.Admin, "agent", "ls")
	if strings.Count(out, victim.Msg.Node.NodeId) != 1 {
		t.Errorf("tether agent ls shows the victim's id more than once:\n%s", out)
	}
	// A name that only starts like one is a name.
	if _, err := rogue.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: rogueNode.Msg.Node.NodeId, Name: "n_helper"})); err != nil {
		t.Errorf("a child named n_helper: %v", err)
	}
}

// syncBuffer is a log sink the server's goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestARoguesTextInTheServersLogIsPrintable: the server logs a refusal
// with its error, and the error quotes what the caller sent — here a job id
// the rogue fills with a zero-width space, a word joiner and a byte-order
// mark (the lease module refuses control characters in an id, not these).
// Through `tether serve`'s own logger, text or JSON (--log-format), each
// log line stays one line and shows those characters escaped.
func TestARoguesTextInTheServersLogIsPrintable(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var logs syncBuffer
			log, err := newLoggerTo(&logs, format, "debug")
			if err != nil {
				t.Fatal(err)
			}
			srv := testserver.Start(t, func(cfg *controlplane.Config) { cfg.Logger = log })
			ctx := context.Background()
			root, err := srv.AdminClients().Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: "rogue"}))
			if err != nil {
				t.Fatal(err)
			}
			rogue := srv.Clients(root.Msg.Credential)
			hostile := "job-1\u200b\u2060\ufeff\u202e"
			if _, err := rogue.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{JobId: hostile, LeaseId: "l_00000000000000000000", LeaseGeneration: 1, RenewSequence: 1})); err == nil {
				t.Fatal("a renew of a lease that does not exist was accepted")
			}
			out := logs.String()
			if !strings.Contains(out, "job-1") {
				t.Fatalf("the server logged nothing of the refusal:\n%s", out)
			}
			if i := strings.IndexFunc(out, func(r rune) bool {
				return r != '\n' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp))
			}); i >= 0 {
				t.Errorf("the %s log carries the rogue's invisible character %q as is:\n%q", format, []rune(out[i:])[0], out)
			}
		})
	}
}
