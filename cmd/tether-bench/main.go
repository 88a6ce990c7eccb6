// Command tether-bench runs Tether's benchmark scenarios (package
// cmd/tether-bench/internal/bench), prints a table and writes the results as JSON for CI.
//
//	tether-bench [-run regexp] [-duration 2s] [-out bench-results.json] [-dir path] [-cpuprofile file]
//	             [-million] [-step-timeout 15m]
//	tether-bench -summarize results.json[,more.json]
//
// After the table of every result it prints the scale summary (figure |
// value | target, bench.Summary); -summarize prints that summary from
// results written before (several runs' files merge, later ones winning),
// such as a make bench run and a make bench-million run.
//
// Measurements named ...-apart (supervisor/spawn's) run their clients in a
// process of their own: tether-bench starts itself again with
// TETHER_BENCH_CLIENTS set in its environment, which makes it that client
// process (it reads its job on stdin and answers on stdout), so that the
// server's CPU time per call is measured without the clients'.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/tetherhq/tether/cmd/tether-bench/internal/bench"
)

func main() {
	if bench.ServeClients() {
		// A client process of a measurement (bench.ServeClients).
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tether-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "bench-results.json", "file to write the results to, as JSON")
	filter := flag.String("run", "", "run only the scenarios whose names match this regexp")
	duration := flag.Duration("duration", 2*time.Second, "how long each measurement runs, warm-up excluded")
	dir := flag.String("dir", "", "directory for scratch databases (default: the system's temporary directory); use a disk like production's")
	list := flag.Bool("list", false, "list the scenarios and exit")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (client and server share the process, except in measurements named ...-apart, whose clients run in a process of their own)")
	million := flag.Bool("million", false, "run the large scenarios too (million/...: 1,000,000 agents on Badger, 100,000 on etcd; many minutes and a few GiB)")
	stepTimeout := flag.Duration("step-timeout", 15*time.Minute, "bound on each step of a large scenario that may not finish (the termination of the whole swarm, the revocation marker)")
	summarize := flag.String("summarize", "", "print the summary of these results files (comma-separated, written by -out) and exit")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if *duration <= 0 {
		return fmt.Errorf("-duration must be positive")
	}
	match, err := regexp.Compile(*filter)
	if err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	if *summarize != "" {
		results, err := bench.ReadResults(strings.Split(*summarize, ",")...)
		if err != nil {
			return err
		}
		return bench.WriteSummary(os.Stdout, results)
	}
	if *list {
		for _, s := range bench.Scenarios() {
			if s.Large {
				fmt.Println(s.Name, "(with -million)")
				continue
			}
			fmt.Println(s.Name)
		}
		return nil
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	report := &bench.Report{Duration: *duration, Dir: *dir, Large: *million, StepTimeout: *stepTimeout}
	// The machine's load beside the figures: on a shared machine they
	// move with it.
	if load, ok := bench.LoadAverage(); ok {
		report.Add("machine/load-average/start", load, "load")
	}
	runErr := bench.Run(ctx, report, match.MatchString, os.Stderr)
	if load, ok := bench.LoadAverage(); ok {
		report.Add("machine/load-average/end", load, "load")
	}
	// Whatever was measured is reported, even when a scenario failed.
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	fmt.Println()
	if err := bench.WriteSummary(os.Stdout, report.Results()); err != nil {
		return err
	}
	if err := report.WriteJSON(*out); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return runErr
}
