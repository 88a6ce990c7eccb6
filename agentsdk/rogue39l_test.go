//go:build linux

package agentsdk_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestRogue39LALaunchersShutdownEndsItsAgentsNodes: a launcher that
// stopped (its context ended: the service stopped, the host shut down)
// stopped its agents' processes and confirmed their exits, but a
// confirmation outside a termination is a word, not a stop: it
// terminated no node. The root read EXITED with no termination, its
// record never written, and everything below it ran on: a rogue agent
// that had spawned a child and handed the child's credential to a process
// beyond the launcher's reach (another host) kept acting as the child —
// spawning, holding its grants — long after its launcher had stopped
// (without an Instance, no later run ever looks for it). The launcher
// terminates (abort) the nodes of the processes it stops: the root's
// exit is confirmed by the launcher under a termination that covers the
// root and its child, and the child's credential is refused.
func TestRogue39LALaunchersShutdownEndsItsAgentsNodes(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	dir := t.TempDir()
	credFile := filepath.Join(dir, "cred")
	v1 := agentsdk.Version{Name: "v1", Command: "sh", Args: []string{"-c", `printf '%s' "$TETHER_CREDENTIAL" > "$ROGUE_CRED.tmp" && mv "$ROGUE_CRED.tmp" "$ROGUE_CRED"; exec sleep 600`},
		Env: []string{"ROGUE_CRED=" + credFile}}
	cfg := agentsdk.LauncherConfig{
		Operator: agentsdk.Dial(srv.URL, srv.Admin, agentsdk.WithHTTPClient(srv.HTTP)), Name: "rogue",
		Versions: []agentsdk.Version{v1}, Start: "v1", PollEvery: 20 * time.Millisecond, KillGrace: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	l, err := agentsdk.NewLauncher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// The rogue: its credential, as the agent's process holds it; a child
	// spawned with it, whose credential goes where no launcher reaches.
	cred := readWhenThere(t, "the agent to hand out its credential", credFile)
	bg := context.Background()
	rogue, err := agentsdk.Join(bg, srv.URL, cred, srv.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	child, err := rogue.Spawn(bg, "away", nil)
	if err != nil {
		t.Fatal(err)
	}
	root := rogue.NodeID()

	// The launcher stops.
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the launcher's Run: %v", err)
	}
	done <- nil // for the cleanup

	// The root's exit confirmed by its launcher, and a termination
	// covering it and what it spawned: nothing of it acts any more.
	testserver.WaitFor(t, 30*time.Second, "a termination to cover the root after its launcher stopped", func() bool {
		return getNode(t, admin, root).TerminationId != ""
	})
	if n := getNode(t, admin, root); !hasLauncherConfirmation(n) {
		t.Errorf("the root's exit is not confirmed by its launcher: %+v", n.ExitConfirmations)
	}
	// The termination's mark reaches the child after the root (its own
	// chunk): the refusal below holds from the request on.
	testserver.WaitFor(t, 30*time.Second, "the termination to mark the rogue's child", func() bool {
		n := getNode(t, admin, child.Node.NodeId)
		return n.State != tetherv1.NodeState_NODE_STATE_RUNNING || n.TerminationId != ""
	})
	away, err := agentsdk.Join(bg, srv.URL, child.Credential, srv.HTTP)
	if err == nil {
		if _, err = away.Spawn(bg, "still-here", nil); err == nil {
			t.Fatal("the child's credential, handed out by the rogue, still spawns after its launcher stopped")
		}
	}
	if strings.Contains(err.Error(), child.Credential) {
		t.Errorf("the refusal reveals the credential")
	}
}
