package wire

import (
	"testing"

	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The conversions run on hot paths: every lease call answers with a
// Lease, every tree read with Nodes, every record sink renders a Record.

func BenchmarkLease(b *testing.B) {
	l := full[lease.Lease]()
	b.ReportAllocs()
	for b.Loop() {
		_ = Lease(l)
	}
}

func BenchmarkNode(b *testing.B) {
	n := full[tree.Node]()
	b.ReportAllocs()
	for b.Loop() {
		_ = Node(&n)
	}
}

func BenchmarkRecord(b *testing.B) {
	r := full[supervisor.ReconciliationRecord]()
	b.ReportAllocs()
	for b.Loop() {
		_ = Record(&r)
	}
}
