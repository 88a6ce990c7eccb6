package agentsdk

import (
	"strings"
	"testing"
	"time"
)

// TestRogue35FADefaultClockMeasuresTheFeedOnGosMonotonicTime: the
// verifier's default clock (WallClock) reads UTC, and Time.UTC drops the
// monotonic reading, so the feed's age was wall-clock time: a host clock
// set back (an NTP step, a VM resumed) took the step off the age of a feed
// that died, and a rogue's revoked token passed for as long. The feed's
// age is now measured on readings that carry Go's monotonic clock.
func TestRogue35FADefaultClockMeasuresTheFeedOnGosMonotonicTime(t *testing.T) {
	for _, clk := range []Clock{nil, WallClock} {
		v, err := NewVerifier(VerifierConfig{Conn: Dial("http://127.0.0.1:1", ""), Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		synced := v.feed.sync()
		now, behind := v.feed.read()
		for _, reading := range []time.Time{synced, now} {
			if s := reading.String(); !strings.Contains(s, " m=") {
				t.Fatalf("clock %v: the feed's age is read from %s, which has no monotonic reading", clk, s)
			}
		}
		if behind {
			t.Fatal("the monotonic clock read behind the feed's last message")
		}
	}
}
