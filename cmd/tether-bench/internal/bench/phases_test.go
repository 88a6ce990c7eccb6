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
	// n ms in, with n read requests, n/10 commit requests made, 3n
	// ranges read, 2n comparisons and writes, and n/20 acknowledgements
	// answered.
	pt := func(n int) phasePoint {
		return phasePoint{at: ms(n), acks: uint64(n / 20), phaseCounts: phaseCounts{
			reads: uint64(n), commits: uint64(n / 10), ranges: uint64(3 * n), compares: uint64(2 * n), writes: uint64(2 * n)}}
	}
	cost := func(d, reads, commits, acks int) phaseCost {
		return phaseCost{d: time.Duration(d) * time.Millisecond, acks: uint64(acks), phaseCounts: phaseCounts{
			reads: uint64(reads), commits: uint64(commits), ranges: uint64(3 * reads), compares: uint64(2 * reads), writes: uint64(2 * reads)}}
	}
	chunk := func(step string, n int) phaseChunk { return phaseChunk{step, pt(n)} }
	p := &terminationPhases{start: pt(0)}
	p.passes = []phasePoint{pt(0), pt(40), pt(60), pt(75)}
	p.chunks = []phaseChunk{chunk("mark", 5), chunk("mark", 30), chunk("revoke", 90), chunk("revoke", 95), chunk("record", 120), chunk("record", 140)}
	got := p.split()
	want := map[string]phaseCost{
		"mark":      cost(30, 30, 3, 1),
		"wait-acks": cost(45, 45, 4, 2),
		"revoke":    cost(20, 20, 2, 1),
		"record":    cost(45, 45, 5, 3),
	}
	for _, name := range phaseNames {
		if got[name] != want[name] {
			t.Errorf("phase %s: %+v, want %+v", name, got[name], want[name])
		}
	}
	// A termination whose chunks were not seen has no phases.
	if got := (&terminationPhases{start: pt(0)}).split(); len(got) != 0 {
		t.Errorf("no chunks seen, phases %v; want none", got)
	}
}
