package agentsdk_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/tetherhq/tether/agentsdk"
)

// BenchmarkFenceAdmit measures what a fenced side effect costs a tool
// server that checks authority (IssuedGenerations) against a real server
// on loopback: asking for every side effect (MaxStale zero, the default)
// and trusting an active answer for a second. cpu-ns/op is the process's
// CPU (the tool server's fence and the control plane both run here) per
// admitted side effect.
func BenchmarkFenceAdmit(b *testing.B) {
	for _, c := range []struct {
		name     string
		maxStale time.Duration
	}{{"ask-per-call", 0}, {"max-stale-1s", time.Second}} {
		b.Run(c.name, func(b *testing.B) {
			s := newLeaseSetup(b)
			w := s.newWorker(b, b.TempDir(), time.Hour)
			ctx := context.Background()
			job, d, err := w.Accept(ctx, s.offer(b, "bench-job", 5*time.Minute), agentsdk.JobOptions{})
			if err != nil || d.Outcome.String() != "OUTCOME_ACCEPTED" {
				b.Fatalf("accept: %v %v", d, err)
			}
			tool := agentsdk.Dial(s.srv.URL, s.srv.ToolServerToken(b, "bench-fenced-tool"), agentsdk.WithHTTPClient(s.srv.HTTP))
			fence := &agentsdk.Fence{Check: agentsdk.IssuedGenerations(tool), MaxStale: c.maxStale, Clock: s.clock}
			g := job.Lease().LeaseGeneration
			before := cpu()
			b.ResetTimer()
			for b.Loop() {
				if err := fence.AdmitContext(ctx, "bench-job", g); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpu()-before)/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpu() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
