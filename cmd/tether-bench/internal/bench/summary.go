package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// SummaryRow is one line of the scale summary: a figure, what the results
// say of it, and its target.
type SummaryRow struct {
	Figure, Value, Target string
}

// notMeasured stands for a figure whose results are missing (its scenario
// was not run, failed, or, for the million/ figures, needs -million).
const notMeasured = "not measured"

// Summary condenses results into the scale figures and their targets (the
// table of issue 21), one row per figure; a figure whose results are
// missing says so. The results may come from several runs (ReadResults),
// later ones winning.
func Summary(results []Result) []SummaryRow {
	v := map[string]float64{}
	for _, res := range results {
		v[res.Name] = res.Value
	}
	get := func(name string) (float64, bool) { x, ok := v[name]; return x, ok }
	var rows []SummaryRow
	add := func(figure, target, value string) { rows = append(rows, SummaryRow{figure, value, target}) }

	// Terminations on Badger, and how they grow with the subtree.
	value := notMeasured
	if t10k, ok := get("supervisor/terminate-abort/agents=10000"); ok {
		value = fmtMS(t10k)
		if t1k, ok := get("supervisor/terminate-abort/agents=1000"); ok && t1k > 0 {
			value += fmt.Sprintf("; 10k ÷ 1k: %s wall", fmtX(t10k/t1k))
			c10k, ok1 := get("supervisor/terminate-abort-cpu/agents=10000")
			c1k, ok2 := get("supervisor/terminate-abort-cpu/agents=1000")
			if ok1 && ok2 && c1k > 0 {
				value += fmt.Sprintf(", %s CPU", fmtX(c10k/c1k))
			}
		}
	}
	add("terminate (abort) 10,000 agents, Badger", "≤ 1,000 ms, linear (10k ÷ 1k ≈ 10×)", value)
	if x, ok := get("supervisor/terminate-same-swarm/10k-over-1k"); ok {
		// Not a target: the two subtrees in servers of one size
		// (supervisor/terminate-same-swarm), so the ratio is the subtree's.
		value = fmt.Sprintf("10k ÷ 1k: %s wall", fmtX(x))
		if c, ok := get("supervisor/terminate-same-swarm-cpu/10k-over-1k"); ok {
			value += fmt.Sprintf(", %s CPU", fmtX(c))
		}
		add("the same, both in an 11,000-agent swarm", "", value)
	}

	value = notMeasured
	if x, ok := get("server/etcd-vs-badger/terminate-abort/agents=1000"); ok {
		e, _ := get("server/etcd/terminate-abort/agents=1000")
		b, _ := get("server/badger/terminate-abort/agents=1000")
		value = fmt.Sprintf("%s vs %s: %s", fmtMS(e), fmtMS(b), fmtX(x))
	}
	// The termination alone (supervisor/terminate-stores), at 1,000 and
	// 10,000 agents, with its CPU ratio (process and etcd member).
	var alone []string
	for _, n := range []string{"1000", "10000"} {
		x, ok := get("supervisor/terminate-stores/etcd-vs-badger/agents=" + n)
		if !ok {
			continue
		}
		e, _ := get("supervisor/terminate-stores/etcd/terminate-abort/agents=" + n)
		b, _ := get("supervisor/terminate-stores/badger/terminate-abort/agents=" + n)
		part := fmt.Sprintf("%s: %s vs %s, %s", map[string]string{"1000": "1k", "10000": "10k"}[n], fmtMS(e), fmtMS(b), fmtX(x))
		if c, ok := get("supervisor/terminate-stores/etcd-vs-badger-cpu/agents=" + n); ok {
			part += fmt.Sprintf(" (%s CPU)", fmtX(c))
		}
		alone = append(alone, part)
	}
	if len(alone) > 0 {
		text := "termination alone " + strings.Join(alone, "; ")
		if value == notMeasured {
			value = text
		} else {
			value += "; " + text
		}
	}
	add("terminate 1,000 agents, etcd vs Badger", "≤ 3×", value)

	value = joinFound(get, " / ", fmtX, "server/etcd-vs-badger/renew-stream/leases=64", "server/etcd-vs-badger/renew-stream/leases=1024")
	// On a quiet node, where etcd's member shares the cores, the rate
	// ratio follows the ratio of CPU per renewal; on a loaded one the
	// member's process takes a share of its own and the rates say less.
	if perCPU := joinFound(get, " / ", fmtX, "server/etcd-vs-badger/renew-stream/leases=64/per-cpu", "server/etcd-vs-badger/renew-stream/leases=1024/per-cpu"); value != notMeasured && perCPU != notMeasured {
		value += " (by CPU per renewal, members included: " + perCPU + ")"
	}
	add("stream renew, etcd ÷ Badger, 64 / 1,024 leases", "≥ 0.8×", value)

	// Unary renew against etcd's own fenced renew, at each concurrency.
	var parts []string
	for _, n := range []int{1, 8, 64, 1024} {
		u, ok1 := get(fmt.Sprintf("lease/renew/unary/leases=%d", n))
		e, ok2 := get(fmt.Sprintf("lease/renew/etcd-txn/leases=%d", n))
		if !ok1 || !ok2 || e == 0 {
			continue
		}
		// The ratio of both passes (lease/renew measures each system
		// twice, the second time in the reverse order) where the results
		// have it; the rates reported are the first pass's.
		ratio, rates := u/e, "%s vs %s/s"
		if x, ok := get(fmt.Sprintf("lease/renew/unary-vs-etcd/leases=%d", n)); ok {
			ratio, rates = x, "first pass %s vs %s/s"
		}
		part := fmt.Sprintf("%d: %s", n, fmtX(ratio))
		if n == 1 {
			part += " (" + fmt.Sprintf(rates, formatValue(u), formatValue(e)) + ")"
		}
		parts = append(parts, part)
	}
	add("unary renew ÷ etcd fenced renew, by leases", "≥ 1× at every concurrency", orNotMeasured(strings.Join(parts, "; ")))
	if value := joinFound(get, " / ", fmtX, "lease/renew/unary-http1-vs-etcd/leases=1", "lease/renew/unary-http1-vs-etcd/leases=8"); value != notMeasured {
		// Not a target: the same calls with agentsdk.UnaryHTTP1Client.
		add("the same over HTTP/1.1, 1 / 8 leases", "", value)
	}

	// The floors are lease/renew's, measured in one loop beside a lone
	// renew.
	rpc, hasRPC := get("lease/renew/lone-floor-rpc/p50")
	fsync, hasFsync := get("lease/renew/lone-floor-fsync/p50")
	value = notMeasured
	if p50, ok := get("lease/renew/stream/leases=1/p50"); ok {
		value = fmtMS(p50)
		if hasRPC && hasFsync {
			value += fmt.Sprintf(" = floor %s (RPC %s + fsync %s) %+.2f ms", fmtMS(rpc+fsync), fmtMS(rpc), fmtMS(fsync), p50-rpc-fsync)
		}
		if commit, ok := get("lease/renew/lone-floor-commit/p50"); ok {
			value += fmt.Sprintf("; store commit %s", fmtMS(commit))
		}
	}
	add("closed-loop stream renew, 1 lease, p50", "≤ RPC floor + one fsync + 0.3 ms", value)

	spawns := func(name string) string {
		rate, ok := get(name + "/clients=64")
		if !ok {
			return notMeasured
		}
		value := formatValue(rate) + " agents/s"
		if cpu, ok := get(name + "-per-cpu-second/clients=64"); ok {
			value += fmt.Sprintf(" (%s per CPU-second)", formatValue(cpu))
		}
		return value
	}
	add("spawn + credential, durable, 64 clients", "≥ 10,000 agents/s", spawns("supervisor/spawn-durable"))
	if value := spawns("supervisor/spawn-durable-http1"); value != notMeasured {
		// Not a target: the same spawns with agentsdk.UnaryHTTP1Client.
		add("the same over HTTP/1.1", "", value)
	}

	for _, apart := range []struct{ name, label string }{
		{"supervisor/spawn-durable-apart", "the same, clients in another process"},
		{"supervisor/spawn-durable-http1-apart", "the same, clients in another process, HTTP/1.1"},
	} {
		// Not a target: the server's own CPU per spawn, the clients' not
		// in it (measureSpawnsApart).
		rate, ok := get(apart.name + "/clients=64")
		if !ok {
			continue
		}
		value := formatValue(rate) + " agents/s"
		if cpu, ok := get(apart.name + "/clients=64/server-cpu-per-call"); ok {
			value += fmt.Sprintf(" (server %.0f µs a spawn", cpu)
			if floor, ok := get(apart.name + "/rpc-floor/clients=64/server-cpu-per-call"); ok {
				value += fmt.Sprintf(", %.0f µs a GetNode", floor)
			}
			value += ")"
		}
		add(apart.label, "", value)
	}

	add("largest subtree one termination covered", "100,000 on etcd, 1,000,000 on Badger", largestTerminations(results))

	parts = parts[:0]
	for _, c := range []struct{ name, label string }{
		{"capability/revoke-to-verifier-reject/descendants=1000", "1k"},
		{"capability/revoke-to-verifier-reject/descendants=10000", "10k"},
		{"capability/revoke-to-verifier-reject/descendants=100000", "100k"},
		{"million/badger/revoke-to-verifier-reject/descendants=1000000", "1M"},
		{"million/etcd/revoke-to-verifier-reject/descendants=100000", "100k on etcd"},
	} {
		if x, ok := get(c.name); ok {
			parts = append(parts, fmt.Sprintf("%s %s", c.label, fmtMS(x)))
		}
	}
	value = orNotMeasured(strings.Join(parts, ", "))
	if _, ok := get("million/badger/revoke-to-verifier-reject/descendants=1000000"); !ok && value != notMeasured {
		value += " (1M: -million)"
	}
	add("revoke → offline verifier rejects", "≤ 10 ms at 1,000,000 descendants", value)

	value = notMeasured
	if heap, ok := get("million/badger/heap-per-agent/agents=1000001"); ok {
		rss, _ := get("million/badger/rss-per-agent/agents=1000001")
		value = fmt.Sprintf("1M on Badger, each with a grant: heap %s B, RSS %s B", formatValue(heap), formatValue(rss))
		if disk, ok := get("million/badger/disk-per-agent/agents=1000001"); ok {
			value += fmt.Sprintf(", disk %s B", formatValue(disk))
		}
	} else if heap, ok := get("supervisor/server-heap-per-agent"); ok {
		value = fmt.Sprintf("10k on Badger, no grants: heap %s B (1M: -million)", formatValue(heap))
	}
	add("memory per agent, after GC", "—", value)

	value = notMeasured
	if hasRPC && hasFsync {
		value = fmt.Sprintf("fsync %s, RPC %s", fmtMS(fsync), fmtMS(rpc))
	}
	add("floors, p50", "—", value)

	value = joinFound(get, " → ", func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }, "machine/load-average/start", "machine/load-average/end")
	add("machine load (1-minute average), start → end", "—", value)
	return rows
}

var terminationResult = regexp.MustCompile(`^(.*)/terminate-abort/(unfinished/)?agents=(\d+)$`)

// largestTerminations is, per store, the largest swarm a termination
// covered in the results (and how long it took), and any larger one that
// did not finish.
func largestTerminations(results []Result) string {
	type best struct {
		agents     int
		ms         float64
		unfinished int
		gaveUpMS   float64
	}
	by := map[string]*best{"Badger": {}, "etcd": {}}
	for _, res := range results {
		m := terminationResult.FindStringSubmatch(res.Name)
		if m == nil {
			continue
		}
		agents, err := strconv.Atoi(m[3])
		if err != nil {
			continue
		}
		b := by["Badger"]
		if strings.Contains(m[1], "etcd") {
			b = by["etcd"]
		}
		switch {
		case m[2] != "" && agents > b.unfinished:
			b.unfinished, b.gaveUpMS = agents, res.Value
		case m[2] == "" && agents > b.agents:
			b.agents, b.ms = agents, res.Value
		}
	}
	var parts []string
	if by["Badger"].agents+by["Badger"].unfinished+by["etcd"].agents+by["etcd"].unfinished == 0 {
		return notMeasured
	}
	for _, store := range []string{"Badger", "etcd"} {
		b := by[store]
		part := store + " "
		if b.agents > 0 {
			part += fmt.Sprintf("%s (%s)", formatValue(float64(b.agents)), fmtMS(b.ms))
		} else {
			part += "none"
		}
		if b.unfinished > b.agents {
			part += fmt.Sprintf("; %s unfinished after %s", formatValue(float64(b.unfinished)), fmtMS(b.gaveUpMS))
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

func joinFound(get func(string) (float64, bool), sep string, format func(float64) string, names ...string) string {
	var parts []string
	found := 0
	for _, name := range names {
		if x, ok := get(name); ok {
			parts = append(parts, format(x))
			found++
		} else {
			parts = append(parts, "?")
		}
	}
	if found == 0 {
		return notMeasured
	}
	return strings.Join(parts, sep)
}

func orNotMeasured(s string) string {
	if s == "" {
		return notMeasured
	}
	return s
}

func fmtX(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) + "×" }

// fmtMS shows milliseconds, as seconds from ten seconds up.
func fmtMS(x float64) string {
	if x >= 10000 {
		return strconv.FormatFloat(x/1000, 'f', 1, 64) + " s"
	}
	if x >= 100 {
		return formatValue(x) + " ms"
	}
	return strconv.FormatFloat(x, 'f', 2, 64) + " ms"
}

// WriteSummary writes Summary(results) as a table "figure | value |
// target", aligned for a terminal and valid Markdown.
func WriteSummary(w io.Writer, results []Result) error {
	rows := Summary(results)
	widths := [3]int{len("figure"), len("value"), len("target")}
	for _, row := range rows {
		for i, cell := range []string{row.Figure, row.Value, row.Target} {
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	var b strings.Builder
	line := func(cells ...string) {
		for i, cell := range cells {
			if i > 0 {
				b.WriteString(" | ")
			} else {
				b.WriteString("| ")
			}
			b.WriteString(cell + strings.Repeat(" ", widths[i]-len([]rune(cell))))
		}
		b.WriteString(" |\n")
	}
	line("figure", "value", "target")
	line(strings.Repeat("-", widths[0]), strings.Repeat("-", widths[1]), strings.Repeat("-", widths[2]))
	for _, row := range rows {
		line(row.Figure, row.Value, row.Target)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ReadResults reads results written by WriteJSON from each path, in order.
func ReadResults(paths ...string) ([]Result, error) {
	var out []Result
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var results []Result
		if err := json.Unmarshal(data, &results); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, results...)
	}
	return out, nil
}
