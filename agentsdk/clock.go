package agentsdk

import "time"

// Clock tells the SDK the time. Every part of the SDK that reads it — a
// Verifier's caches and staleness budget, a LeaseWorker's sent_at, a
// CapabilityToken's refresh — takes this one interface; nil means
// WallClock. Tests inject a manual clock.
type Clock interface{ Now() time.Time }

// WallClock is the wall clock, in UTC.
var WallClock Clock = wallClock{}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now().UTC() }
