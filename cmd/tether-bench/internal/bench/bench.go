// Package bench is the benchmark harness behind `make bench` and
// cmd/tether-bench: a registry of scenarios, a Report that collects their
// results, and a throughput meter.
//
// A scenario measures something end to end (a real store on a real disk,
// real RPCs on loopback) and adds named results to the Report. Scenarios
// that compare against a baseline measure the baseline in the same run, as
// the figures on a shared machine vary by up to 25% between runs: compare
// ratios, not absolute numbers from different runs.
//
// To add a scenario, call Register from an init function in a file of this
// package named after what it measures (store.go, rpc.go, ...).
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Result is one measured figure.
type Result struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// Report collects the results of a run. Scenarios read their settings from
// it and add results to it; it is safe for concurrent use.
type Report struct {
	// Duration is how long each measurement runs, warm-up excluded.
	Duration time.Duration
	// Dir is where scenarios create scratch files and databases. Disk
	// figures mean something only on a disk like production's, not tmpfs.
	Dir string
	// Large runs the large scenarios too (RegisterLarge: the
	// 1,000,000-agent figures), which take many minutes and gigabytes.
	Large bool
	// StepTimeout bounds each step of a large scenario that may not
	// finish, such as the termination of a million agents; zero means
	// 15 minutes.
	StepTimeout time.Duration

	mu      sync.Mutex
	results []Result
	// log, when set, is told of every result as it is added (logging).
	log    io.Writer
	parent *Report
}

// logging returns a view of r that also writes each result to w as it is
// added, for scenarios that run for many minutes.
func (r *Report) logging(w io.Writer) *Report {
	return &Report{Duration: r.Duration, Dir: r.Dir, Large: r.Large, StepTimeout: r.StepTimeout, log: w, parent: r}
}

// Add records a result.
func (r *Report) Add(name string, value float64, unit string) {
	if r.parent != nil {
		fmt.Fprintf(r.log, "  %s: %s %s\n", name, formatValue(value), unit)
		r.parent.Add(name, value, unit)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, Result{Name: name, Value: value, Unit: unit})
}

// stepTimeout is StepTimeout or its default.
func (r *Report) stepTimeout() time.Duration {
	if r.StepTimeout > 0 {
		return r.StepTimeout
	}
	return 15 * time.Minute
}

// Results returns the results in the order they were added.
func (r *Report) Results() []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.results)
}

// WriteTable writes the results as an aligned table for people.
func (r *Report) WriteTable(w io.Writer) error {
	results := r.Results()
	nameWidth, valueWidth := len("benchmark"), len("value")
	values := make([]string, len(results))
	for i, res := range results {
		values[i] = formatValue(res.Value)
		nameWidth = max(nameWidth, len(res.Name))
		valueWidth = max(valueWidth, len(values[i]))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s  %*s  %s\n", nameWidth, "benchmark", valueWidth, "value", "unit")
	fmt.Fprintf(&b, "%s  %s  %s\n", strings.Repeat("-", nameWidth), strings.Repeat("-", valueWidth), "----")
	for i, res := range results {
		fmt.Fprintf(&b, "%-*s  %*s  %s\n", nameWidth, res.Name, valueWidth, values[i], res.Unit)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// formatValue shows large figures as integers with thousands separators
// and small ones (ratios) with two decimals.
func formatValue(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	digits := strconv.FormatFloat(v, 'f', 0, 64)
	var b strings.Builder
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}

// WriteJSON writes the results to path as a JSON list, the format CI and
// the comparison scripts read.
func (r *Report) WriteJSON(path string) error {
	results := r.Results()
	if results == nil {
		results = []Result{}
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Scenario is a registered benchmark.
type Scenario struct {
	Name string
	Run  func(ctx context.Context, r *Report) error
	// Large scenarios run only when the report asks for them (Report.Large).
	Large bool
}

var (
	registryMu sync.Mutex
	registry   = map[string]Scenario{}
)

// Register adds a scenario. It panics on a duplicate name, which is a
// programming error caught the first time the binary starts.
func Register(name string, fn func(ctx context.Context, r *Report) error) {
	register(Scenario{Name: name, Run: fn})
}

// RegisterLarge adds a scenario that runs only when Report.Large is set
// (tether-bench -million): one that takes minutes, not seconds.
func RegisterLarge(name string, fn func(ctx context.Context, r *Report) error) {
	register(Scenario{Name: name, Run: fn, Large: true})
}

func register(s Scenario) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[s.Name]; dup {
		panic("bench: scenario " + s.Name + " registered twice")
	}
	registry[s.Name] = s
}

// Scenarios returns the registered scenarios sorted by name.
func Scenarios() []Scenario {
	registryMu.Lock()
	defer registryMu.Unlock()
	out := make([]Scenario, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Scenario) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Run runs the scenarios whose names match, in name order (the large ones
// only when r.Large is set), and reports progress to log. A failed scenario does not stop the others; their errors
// are returned together.
func Run(ctx context.Context, r *Report, match func(name string) bool, log io.Writer) error {
	var errs []error
	ran := 0
	for _, s := range Scenarios() {
		if !match(s.Name) || (s.Large && !r.Large) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		ran++
		fmt.Fprintf(log, "running %s\n", s.Name)
		start := time.Now()
		if err := s.Run(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			fmt.Fprintf(log, "  failed after %v: %v\n", time.Since(start).Round(time.Millisecond), err)
			continue
		}
		fmt.Fprintf(log, "  done in %v\n", time.Since(start).Round(time.Millisecond))
	}
	if ran == 0 {
		return errors.New("bench: no scenario matches")
	}
	return errors.Join(errs...)
}
