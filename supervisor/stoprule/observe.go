package stoprule

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	celref "github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// ApplyCall folds one ledger change into a node's stored observations:
// before is the call as stored before the change (nil for a new call),
// after as stored after it. Pure; the shell calls it inside the ledger's
// own transaction, so the counters are exactly the ledger's.
func ApplyCall(o *Observations, before, after *ledger.ToolCall) {
	if after == nil {
		return
	}
	if begins(before, after) {
		o.Calls++
		bump(&o.CallsByTool, toolKey(o.CallsByTool, after.Tool), 1)
		o.CallsInFlight++
		o.CallsInFlightMax = max(o.CallsInFlightMax, o.CallsInFlight)
	}
	end, ok := callEnd(before, after)
	if !ok {
		return
	}
	bump(&o.CallsByOutcome, outcomeName(end.resolution), 1)
	if end.resolution == ledger.CallResolutionRejectedDraining {
		return // refused: it never began
	}
	o.CallsInFlight = max(o.CallsInFlight-1, 0)
	if end.resolution == ledger.CallResolutionFailed {
		o.Failures++
		bump(&o.FailuresByTool, toolKey(o.FailuresByTool, after.Tool), 1)
	}
	if end.took > 0 {
		s := end.took.Seconds()
		o.CallSecondsTotal += s
		o.CallSecondsMax = max(o.CallSecondsMax, s)
	}
}

// begins reports whether the change begins a call (one refused while its
// node stopped never began).
func begins(before, after *ledger.ToolCall) bool {
	return before == nil && after.Resolution != ledger.CallResolutionRejectedDraining
}

// callEnding is how a change ends a call: its outcome, and how long it
// took (0 when its times are not both known, or not in order).
type callEnding struct {
	resolution ledger.CallResolution
	took       time.Duration
}

// callEnd reports how the change from before to after ends a call, if it
// does: a call written ended (one refused while its node stopped, or
// begun and ended at once), or one that was not ended and now is. A
// retried end, or a cancel order, ends nothing.
func callEnd(before, after *ledger.ToolCall) (callEnding, bool) {
	refused := before == nil && after.Resolution == ledger.CallResolutionRejectedDraining
	if (after.State != ledger.CallStateEnded && !refused) || (before != nil && before.State == ledger.CallStateEnded) {
		return callEnding{}, false
	}
	e := callEnding{resolution: after.Resolution}
	if e.resolution != ledger.CallResolutionRejectedDraining && !after.BegunAt.IsZero() && !after.EndedAt.IsZero() {
		e.took = max(after.EndedAt.Sub(after.BegunAt), 0)
	}
	return e, true
}

// ApplySpawn folds a spawn into the observations of the child's ancestors:
// the parent spawned one more child, and every ancestor's subtree grew by
// one node reaching (at least) the child's depth below it. get returns an
// ancestor's stored observations for update.
func ApplySpawn(child *tree.Node, get func(nodeID string) *Observations) {
	n := len(child.Ancestors)
	for i, a := range child.Ancestors {
		o := get(a)
		if i == n-1 {
			o.Spawns++
		}
		o.SubtreeSize = max(o.SubtreeSize, 1) + 1
		o.SubtreeDepth = max(o.SubtreeDepth, int64(n-i))
	}
}

// Snapshot completes a node's stored observations with what is read at
// evaluation time: the node itself, its age on the control plane's clock,
// and the lease and revocation counts when the shell fetched them. The
// stored message is not modified.
func Snapshot(stored *Observations, n *tree.Node, now time.Time) *Observations {
	o := &Observations{}
	if stored != nil {
		o = stored.Clone()
	}
	o.SubtreeSize = max(o.SubtreeSize, 1)
	o.Depth = int64(len(n.Ancestors))
	o.NodeName = n.Name
	o.NodeLabels = n.Labels
	if !n.CreatedAt.IsZero() {
		o.AgeSeconds = max(now.Sub(n.CreatedAt).Seconds(), 0)
	}
	o.open.countAt(o, now)
	return o
}

// openCalls is what a node's calls still open amount to, read with its
// counters, for the call time its rules read to count them up to the
// instant it is judged: a call counted only at its end let a rogue keep one
// open forever (or many, across its descendants) and never be stopped by a
// rule on call time. Its own calls in flight are read from the ledger (the
// node's open calls, only for rules that read call time); its
// descendants' from its subtree records, which count the calls open in
// each shard and their begin times added up (each begin and end of a
// descendant's call changes them in its own transaction).
type openCalls struct {
	own       int64   // the node's own calls open
	ownBegins float64 // their begin times added up, in Unix milliseconds
	ownFirst  int64   // the earliest of them
	sub       uint64  // the descendants' calls open
	subBegins uint64  // their begin times added up
	subOldest int64   // the earliest begin time of the descendants' open calls (of a legacy call, its shard's mean)
	// legacy says a shard counts calls open that an earlier version began,
	// which readSubOldest looks for in the thirty-fourth pass's listing.
	legacy bool
}

// callMillis is a call's begin time as the records add it up: Unix
// milliseconds, 0 before 1970.
func callMillis(t time.Time) uint64 { return ledger.BeginMillis(t) }

// any reports whether the node has calls open, its own or in its subtree.
func (c openCalls) any() bool { return c.own > 0 || c.sub > 0 }

// countAt adds the time the open calls have taken at now to o's call
// time: the node's own to call_seconds_total and call_seconds_max and to
// their subtree_ forms, the descendants' to the subtree_ forms. The
// descendants' longest open call is the earliest begin their shards'
// records hold (a slot's call or the earliest listed, exact); calls an
// earlier version began count by their shard's mean begin time and the
// listing of the thirty-fourth pass (readSubOldest). A begin time after
// now (another server's clock) counts 0.
func (c openCalls) countAt(o *Observations, now time.Time) {
	nowMs := float64(callMillis(now))
	if c.own > 0 {
		total := max(float64(c.own)*nowMs-c.ownBegins, 0) / 1e3
		longest := max(nowMs-float64(c.ownFirst), 0) / 1e3
		o.CallSecondsTotal += total
		o.CallSecondsMax = max(o.CallSecondsMax, longest)
		o.SubtreeCallSecondsTotal += total
		o.SubtreeCallSecondsMax = max(o.SubtreeCallSecondsMax, longest)
	}
	if c.sub > 0 {
		o.SubtreeCallSecondsTotal += max(float64(c.sub)*nowMs-float64(c.subBegins), 0) / 1e3
		o.SubtreeCallSecondsMax = max(o.SubtreeCallSecondsMax, max(nowMs-float64(c.subOldest), 0)/1e3)
	}
}

func bump(m *map[string]int64, k string, by int64) {
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[k] += by
}

// toolKey bounds the tools tracked per node: past MaxTools distinct tools,
// the rest are counted as OtherTool.
func toolKey(m map[string]int64, tool string) string {
	if _, ok := m[tool]; ok || len(m) < MaxTools {
		return tool
	}
	return OtherTool
}

func outcomeName(r ledger.CallResolution) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "CALL_RESOLUTION_"))
}

// maxSubtreeCounters bounds the names subtree_reported holds: each record
// of an ancestor (subShards of them) tracks at most MaxCounters names,
// and the node's own counters are at most MaxCounters more.
const maxSubtreeCounters = growShards*MaxCounters + MaxCounters

// subReported is one record of an ancestor's subtree totals of the
// self-reported counters, for the descendants of one shard: each counter
// added up (a negative one counted as 0), at most MaxCounters names. A
// name that finds the record full is added to Other (Overflow set), and
// so is every later change of it: the record stays full, names are never
// dropped, so a name is tracked by a record from its first change or
// never.
type subReported struct {
	Counters map[string]float64 `pb:"1"`
	Other    float64            `pb:"2"`
	Overflow bool               `pb:"3"`
}

// add folds the changes d of one node's counters into the record, each
// sum rounded up (addUp): never below what its nodes reported. Rounded to
// nearest, a total lost what a far larger change beside it absorbed, and
// kept the loss once that change was taken back: a rogue whose hand shared
// its honest worker's record reported 1e300 and then 0, and the worker's
// 500 read 0 at every ancestor, for good (forty-first pass).
func (s *subReported) add(d map[string]float64) {
	for _, k := range sortedKeys(d) {
		if _, ok := s.Counters[k]; !ok && len(s.Counters) >= MaxCounters {
			s.Other = addUp(s.Other, d[k])
			s.Overflow = true
			continue
		}
		if s.Counters == nil {
			s.Counters = map[string]float64{}
		}
		s.Counters[k] = addUp(s.Counters[k], d[k])
	}
}

// addUp is a+b rounded toward +Inf, addDown toward -Inf: the sum rounded
// to nearest, moved a step when its rounding error (TwoSum's, exact for
// finite operands) went the other way. A sum that is exact (whole numbers
// below 2^53) is the same either way.
func addUp(a, b float64) float64 {
	s, e := twoSum(a, b)
	if e > 0 {
		return math.Nextafter(s, math.Inf(1))
	}
	return s
}

func addDown(a, b float64) float64 {
	s, e := twoSum(a, b)
	if e < 0 {
		return math.Nextafter(s, math.Inf(-1))
	}
	return s
}

// twoSum is a+b rounded to nearest and its rounding error, a+b-s exactly
// (0 when the sum is not finite).
func twoSum(a, b float64) (s, e float64) {
	s = a + b
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return s, 0
	}
	bb := s - a
	return s, (a - (s - bb)) + (b - bb)
}

// reportChange is what a report changes of a node's counters as its
// ancestors' totals count them (negative values as 0), rounded up as the
// records add it (subReported.add).
func reportChange(before, after map[string]float64) map[string]float64 {
	var d map[string]float64
	for k, v := range after {
		if x := addUp(max(v, 0), -max(before[k], 0)); x != 0 {
			if d == nil {
				d = map[string]float64{}
			}
			d[k] = x
		}
	}
	return d
}

// reportedSums is subtree_reported of one node: its own counters and its
// ancestors' records of its descendants, added up. A record that is full
// counts the names it does not track under its Other, so a name is read as
// its own counter, the records that track it, and the Other of every
// record that does not: never less than the subtree reported (a rogue that
// fills a record with names first cannot have its spend read as 0), more
// when other names overflowed too. A name no record tracks reads the
// Others alone, when a record overflowed.
type reportedSums struct {
	sums     map[string]float64
	other    float64 // the Others of the records, added up
	overflow bool
}

// sumReported adds a node's own counters and its subtree records up.
func sumReported(own map[string]float64, records []*subReported) *reportedSums {
	s := &reportedSums{sums: map[string]float64{}}
	tracking := map[string]float64{} // the Others of the records tracking a name
	// Rounded up, and the Others taken away rounded down, so a name reads
	// never less than its records hold: rounded to nearest, a rogue's
	// record tracking the name with 1e300 in its Other cancelled every
	// other record's Other, its honest worker's spend among them
	// (forty-first pass).
	for _, r := range records {
		s.other = addUp(s.other, r.Other)
		s.overflow = s.overflow || r.Overflow
		for k, v := range r.Counters {
			s.sums[k] = addUp(s.sums[k], v)
			tracking[k] = addDown(tracking[k], r.Other)
		}
	}
	for k, v := range own {
		s.sums[k] = addUp(s.sums[k], max(v, 0))
	}
	if s.overflow {
		for k := range s.sums {
			s.sums[k] = addUp(s.sums[k], max(addUp(s.other, -tracking[k]), 0))
		}
	}
	return s
}

// lookup is the value of counter k, and whether there is one.
func (s *reportedSums) lookup(k string) (float64, bool) {
	if s == nil {
		return 0, false
	}
	if v, ok := s.sums[k]; ok {
		return v, true
	}
	return s.other, s.overflow
}

// values is every tracked counter's value.
func (s *reportedSums) values() map[string]float64 {
	if s == nil {
		return map[string]float64{}
	}
	return s.sums
}

// celValue is the map as CEL reads it: a lookup of a name it does not
// track reads the records' Others once one overflowed (toolCounts).
func (s *reportedSums) celValue() celref.Val {
	plain := types.DefaultTypeAdapter.NativeToValue(s.values())
	if s == nil || !s.overflow {
		return plain
	}
	return toolCounts{Mapper: plain.(traits.Mapper), other: types.Double(s.other)}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// subTools is the counts by tool of one shard of an ancestor's subtree
// totals (its stoprules/subtool/ records, read together) or of a node's
// own counters: the calls begun, and those ended failed, by tool, at most
// MaxTools tools and the calls of further ones under OtherTool.
type subTools struct {
	Calls    map[string]int64
	Failures map[string]int64
}

// sumTools adds up the counts by tool of records (a node's own counters
// and its ancestors' records of its descendants), calls and failures
// apart. A map holding OtherTool counted some tools it does not track
// there, so a tool reads its count in the maps that track it and the
// OtherTool count of every map that does not: never less than the
// subtree's calls of it (a rogue that fills a record with harmless tools
// first cannot have its calls of another read as 0), more when other
// tools were counted there too. The sums hold OtherTool, the maps' others
// added up, when a map counted anything there; a lookup of a tool the sums
// do not hold reads it (subtreeToolCounts).
func sumTools(records []*subTools) (calls, failures map[string]int64) {
	pick := func(get func(*subTools) map[string]int64) map[string]int64 {
		var maps []map[string]int64
		for _, r := range records {
			if m := get(r); len(m) > 0 {
				maps = append(maps, m)
			}
		}
		if len(maps) == 0 {
			return nil
		}
		sums := map[string]int64{}
		var other int64
		tracking := map[string]int64{} // the others of the maps tracking a tool
		for _, m := range maps {
			o := m[OtherTool]
			other += o
			for tool, n := range m {
				if tool == OtherTool {
					continue
				}
				sums[tool] += n
				tracking[tool] += o
			}
		}
		if other > 0 {
			for tool := range sums {
				sums[tool] += other - tracking[tool]
			}
			sums[OtherTool] = other
		}
		return sums
	}
	return pick(func(r *subTools) map[string]int64 { return r.Calls }),
		pick(func(r *subTools) map[string]int64 { return r.Failures })
}

// subtreeToolCounts is a subtree's counts by tool as CEL reads them: when
// they hold OtherTool, a lookup of a tool they do not hold reads it
// (toolCounts).
func subtreeToolCounts(m counts) celref.Val {
	plain := types.DefaultTypeAdapter.NativeToValue(m)
	if _, ok := m[OtherTool]; !ok {
		return plain
	}
	return toolCounts{Mapper: plain.(traits.Mapper), other: types.Int(m[OtherTool])}
}

// untrackedSubtreeCount is what subtreeToolCounts reads for tool.
func untrackedSubtreeCount(m counts, tool string) (int64, bool) {
	if n, ok := m[tool]; ok {
		return n, true
	}
	n, ok := m[OtherTool]
	return n, ok
}

// maxSubtreeTools bounds the tools a subtree's counts by tool hold: each
// record of an ancestor (growShards of them) and the node's own counters
// track at most MaxTools tools and OtherTool.
const maxSubtreeTools = (growShards + 1) * (MaxTools + 1)
