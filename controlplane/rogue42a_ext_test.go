package controlplane_test

import (
	"testing"
	"time"
)

// TestRogue42AAnHonestStreamOfSmallAnswersLeavesItsConnectionReadable: an
// agent renews its lease over a Channel stream, 2,000 renews sent back to
// back and every answer read, with the clock stopped (nothing refills the
// frame budget by time), then renews once more. Each answer is a DATA
// frame of a few dozen bytes, and the client grants the server window for
// them as it reads them (Go's HTTP/2 client: a WINDOW_UPDATE for the
// connection and one for the stream every 4 KiB), frames charged to its
// connection's frame budget (ConnLimits.ControlFrames) which a DATA frame
// the server writes earned back only when it carried a KiB or more: the
// honest client spent its connection's budget on the window its own
// answers needed, and the connection was read no further — its next renew
// (and every other call on the connection) waited for the budget to
// refill by time. The server's small DATA frames now earn by their bytes
// too (one frame a KiB), so the window updates they draw are paid.
func TestRogue42AAnHonestStreamOfSmallAnswersLeavesItsConnectionReadable(t *testing.T) {
	const renews = 2000
	w := newLeaseWorld(t)
	stream, l := renewsAllAnswered(t, w, renews)
	// One renew more on the same stream: read only if the connection's
	// budget was not spent on the window the answers needed.
	got := make(chan error, 1)
	go func() {
		if err := stream.Send(renew(l, renews+1)); err != nil {
			got <- err
			return
		}
		_, err := stream.Receive()
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("renew %d after %d answered: %v", renews+1, renews, err)
		}
	case <-time.After(closeWait):
		t.Fatalf("renew %d after %d answered on the same stream not answered in %s with the clock stopped: %d connection(s) throttled (an honest client's connection read no further)", renews+1, renews, closeWait, w.srv.ThrottledConnections())
	}
	if n := w.srv.ThrottledConnections(); n != 0 {
		t.Fatalf("%d connections throttled after an honest client's renews, want 0", n)
	}
}
