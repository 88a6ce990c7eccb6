package bench

import "testing"

// The stream row quotes, beside the rate ratio, the ratio of CPU per
// renewal (Badger's process over etcd's process and members): on a quiet
// node, where etcd's member shares the cores, the rate ratio follows it,
// and on a loaded one it says what the rate ratio cannot (docs/capacity.md,
// "The two renew targets left in run D").
func TestSummaryStreamRenewPerCPU(t *testing.T) {
	r := &Report{}
	r.Add("server/etcd-vs-badger/renew-stream/leases=64", 0.63, "x")
	r.Add("server/etcd-vs-badger/renew-stream/leases=64/per-cpu", 0.6, "x")
	r.Add("server/etcd-vs-badger/renew-stream/leases=1024", 0.67, "x")
	r.Add("server/etcd-vs-badger/renew-stream/leases=1024/per-cpu", 0.74, "x")
	rows := map[string]string{}
	for _, row := range Summary(r.Results()) {
		rows[row.Figure] = row.Value
	}
	const figure = "stream renew, etcd ÷ Badger, 64 / 1,024 leases"
	if got, want := rows[figure], "0.63× / 0.67× (by CPU per renewal, members included: 0.60× / 0.74×)"; got != want {
		t.Errorf("%s: got %q, want %q", figure, got, want)
	}

	// Results from before the CPU ratio keep the rate ratio alone.
	r = &Report{}
	r.Add("server/etcd-vs-badger/renew-stream/leases=64", 0.63, "x")
	r.Add("server/etcd-vs-badger/renew-stream/leases=1024", 0.67, "x")
	rows = map[string]string{}
	for _, row := range Summary(r.Results()) {
		rows[row.Figure] = row.Value
	}
	if got, want := rows[figure], "0.63× / 0.67×"; got != want {
		t.Errorf("%s without the CPU ratio: got %q, want %q", figure, got, want)
	}
}
