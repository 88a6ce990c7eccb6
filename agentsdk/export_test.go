package agentsdk

import (
	"context"
	"time"
)

// HoldExitSentUntilTheSessionEnds makes a session's writer, once it has
// sent the exit message, wait (at most a minute) for the session to end
// before it notes the message sent: the session's clean end after the
// claim always comes first. It returns the function that undoes it.
func HoldExitSentUntilTheSessionEnds() (undo func()) {
	afterExitSent = func(session context.Context) {
		select {
		case <-session.Done():
		case <-time.After(time.Minute):
		}
	}
	return func() { afterExitSent = nil }
}
