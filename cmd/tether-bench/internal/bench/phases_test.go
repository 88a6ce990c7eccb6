package bench

import (
	"testing"
	"time"
)

// The phases split a termination's time at its chunks and passes: the
// mark ends at its last chunk, the wait at the start of the pass that
// revokes, the revocation at its last chunk, the record at its last.
func TestTerminationPhasesSplit(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	p := &terminationPhases{start: at}
	p.passes = []time.Time{ms(0), ms(40), ms(60), ms(75)}
	p.chunks = []phaseChunk{{"mark", ms(5)}, {"mark", ms(30)}, {"revoke", ms(90)}, {"revoke", ms(95)}, {"record", ms(120)}, {"record", ms(140)}}
	got := p.split()
	want := map[string]time.Duration{"mark": 30 * time.Millisecond, "wait-acks": 45 * time.Millisecond, "revoke": 20 * time.Millisecond, "record": 45 * time.Millisecond}
	for _, name := range phaseNames {
		if got[name] != want[name] {
			t.Errorf("phase %s: %v, want %v", name, got[name], want[name])
		}
	}
	// A termination whose chunks were not seen has no phases.
	if got := (&terminationPhases{start: at}).split(); len(got) != 0 {
		t.Errorf("no chunks seen, phases %v; want none", got)
	}
}
